"""
# The dashboard follows a project's runs

A labml dashboard shows the runs that report to it while they train. A run trained while the dashboard was down, or
trained without `report_to_dashboard`, would never be on it. But every run keeps what the dashboard needs in its
folder: labml's `run.yaml`, `configs.yaml`, `indicators.yaml` and `run_log.jsonl` (its status), and our `log.jsonl`
(its metrics, `labml_txl.train.metrics_file`). `ProjectFollower` imports every run folder of a project into the
dashboard's store, and keeps following them: a thread scans the project every `scan_seconds` (2 s) for new runs,
new lines of `log.jsonl` and new status lines, so the dashboard shows every run of the project, those trained while
it was down and, a few seconds behind, those training now.

## How a run is imported

Through labml_app's own track endpoint, `POST /api/v1/<token>/track?run_uuid=...`, with the packets labml's `app`
writer sends (`labml.internal.app.experiment`, `labml.internal.tracker.writers.app`): the run's information from
`run.yaml` (name, comment, tags, start_step, python_file, ...), `configs` (`configs.yaml`), `indicators` and
`wildcard_indicators` (`indicators.yaml`), `track` as `{key: {'step': [...], 'value': [...]}}` and `status` (the last
line of `run_log.jsonl`). So an imported run is stored as the same run reported live would be, by the app's own code.
The files are read by `labml_txl.runs.files`, as `python -m labml_txl.runs` reads them: the series are those of
`files.merge_metrics` (a step's value the mean of its values; of a resumed run, the values written last).

The requests go to the ASGI app in this process, on the server's event loop (`asyncio.run_coroutine_threadsafe`),
not over HTTP to the server's own port: every change to the store then happens on that one loop thread, as all of
labml_app's own changes do (its handlers are `async` and write synchronously), so the follower never races a request;
nothing waits for the port to open, and a large import is not cut into bodies that the request limits accept. The
thread only reads the run folders. The track endpoint waits 3 s before it answers, a throttle on remote clients;
for the follower's own requests (and only those: a context variable marks them) that wait is skipped, by giving
`labml_app.handlers` an `asyncio` whose `sleep` does not wait in them (`unthrottle_track_endpoint`), so a run
training now is on the dashboard about `scan_seconds` after its metrics reach its `log.jsonl`.

Three things the packets cannot say are set after them, on the same loop (the first two on labml_app's models):

* the run's start time is its `trial_date`/`trial_time` (labml_app would take the time of the import), so the Runs
  list is in the order the runs were trained;
* its "last updated" time is that of its last line (the import's time would make a run killed while the dashboard
  was down look alive for 15 minutes);
* every `loss.*` series the run reports shows on its metrics chart at first: labml_app selects the `loss.*` series of
  a run's first packet, and hides any that comes later (a run's `loss.valid` comes at its first evaluation). New
  `loss.*` series are selected through the app's preferences endpoint (`POST /api/v1/metrics/preferences/<uuid>`);
  a series the user deselected stays deselected.

A resumed run's steps that come again cannot go through the endpoint, which only appends points: those series are
replaced through the code the endpoint runs for a `track` packet (`AnalysisManager.track`), after emptying them,
in one step on the loop so that no request sees them half done.

A run's name on the dashboard carries its comment (`train_xl attention=alibi mem_len=64`; the comment stays in the
comment field too): labml_app's page shows the comment beside the name in the Runs list and a run's header, but
names a comparison's base run ("Compared With ...") and the browser's title by the name alone.

## Where the follower's state is

`DATA_DIR/project_runs.json`, beside the store, written whole and atomically after every scan that changed it. Per
run uuid: its folder, the byte offsets read of `log.jsonl` and `run_log.jsonl`, the last step sent of each series,
the last status sent, the signature (mtime, size) of the `configs.yaml` sent, and its state:

* `following`: imported, and followed;
* `reported live`: the store already had the run when the follower first met it, so a training reported it live
  (`report_to_dashboard`); the follower leaves it alone: live reports are the run's record;
* `deleted on the dashboard`: deleted in the UI after its import; it is not imported again.

A restarted dashboard reads it and goes on from the offsets, so nothing is imported twice. An import is marked
`pending` before its request and cleared after: one cut short (the dashboard killed in mid-import) is imported again
whole at the next start, its series cleared first. Where a run's `log.jsonl` goes back to a step already sent (a
resumed run appends from its checkpoint's step), or a file shrinks, the run's series are cleared the same way and
sent again from the whole file (`files.merge_metrics`): the steps that the stopped run made after its checkpoint are
gone even where the resumed run has not made them again yet, and of a step written twice the value written last is
shown, the series `labml_txl.runs.read_metrics` reads from the same file.

A record that cannot be read (not JSON, cut short, a field of the wrong type: `read_progress`) stops the dashboard at
its start, naming the file, what is wrong in it and what to do (restore it, or delete it): with no record, every run
already in the store would be taken for one reported live and no longer followed. Changed while the dashboard runs
(damaged, edited or deleted), it is written again at the next scan from what the follower holds, with a line saying
so, so that the next start finds it whole.

## The order of a scan's work

A scan imports each run as soon as it has read it, the runs with the least of their `log.jsonl` to read first: a
long run (tens of MB take seconds to read) holds back no other, and one with more than `LONG_READ_BYTES` (8 MiB) to
read is named in a line before its read, since nothing new of it shows until then.

## What is skipped, and retried

A folder with no `run.yaml` is not a run (yet). A run first seen less than `grace_seconds` (5 s) after its
`run.yaml` was written waits: a training that reports live makes its run on the dashboard by then, and the follower
must not import it too. A `run.yaml`, `configs.yaml` or `indicators.yaml` that does not parse (damaged, or caught in
mid-write) skips its run with one logged line naming the file; it is tried again at every scan, and logged again
only when what is wrong with it changes. A `log.jsonl` or `run_log.jsonl` line still being written waits for its
newline; a complete line that is not JSON of the file's shape is logged and skipped, the lines after it are read. A
failed import request is logged, and the run imported again whole `RETRY_SECONDS` (30 s) later. Nothing of a run
folder stops the dashboard.
"""
import asyncio
import contextvars
import json
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple
from urllib.parse import urlencode

from ..runs.files import (CONFIGS_FILE, INDICATORS_FILE, METRICS_FILE, RUN_FILE, STATUS_FILE, RunFileError, RunFolder,
                          check_metrics_line, check_status_line, experiments_dir, find_run_folders, latest_time,
                          load_yaml_mapping, merge_metrics, read_new_lines, trial_time)
from .store import DamagedStoreFile, read_json_file, write_atomically

PROGRESS_FILE = 'project_runs.json'
PROGRESS_VERSION = 1
# GET: what the follower follows and how far it got (`ProjectFollower.describe`)
FOLLOWING_PATH = '/api/labml_txl/following'

FOLLOWING = 'following'
REPORTED_LIVE = 'reported live'
DELETED = 'deleted on the dashboard'
# labml_app's `RunEnums.RUN_IN_PROGRESS`
IN_PROGRESS = 'in progress'
# A run whose log.jsonl has lines later than its last status line by more than this trains again (it was resumed);
# the final flush of a run's metrics comes before its status line
RESUMED_AFTER_SECONDS = 1.0
# How long a scan waits for the app (a first import of many long runs takes a while)
APPLY_TIMEOUT_SECONDS = 600
# How long a run whose import failed waits before the next try
RETRY_SECONDS = 30
# A run with more of its log.jsonl than this to read is named in a line before the read (a while without news)
LONG_READ_BYTES = 8 * 2 ** 20
# The end of the message that refuses a damaged project_runs.json (`read_progress`)
RESTORE_OR_DELETE_PROGRESS = (
    "it is the project follower's record of the runs it imported and how far: restore it from a copy of the data "
    "directory; or delete it, and the runs already on the dashboard stay as they are but are no longer followed, "
    "the others (those deleted on the dashboard too) are imported; a fresh --data-dir imports and follows every run")


# True in the follower's own requests to the app
_IMPORTING = contextvars.ContextVar('labml_txl_importing', default=False)


class _UnthrottledAsyncio:
    """`asyncio` as `labml_app.handlers` sees it: the same, but `sleep` does not wait in the follower's requests."""

    def __getattr__(self, name):
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay, result=None):
        return await asyncio.sleep(0 if _IMPORTING.get() else delay, result)


def unthrottle_track_endpoint() -> None:
    """Skip the 3 s wait of labml_app's track endpoint in the follower's requests (see the module's docstring);
    requests from elsewhere wait as before."""
    import labml_app.handlers as handlers
    if not isinstance(handlers.asyncio, _UnthrottledAsyncio):
        handlers.asyncio = _UnthrottledAsyncio()


def dashboard_log(message: str) -> None:
    """
    Print the follower's log line, as the dashboard's other lines are printed.

    Args:
        message: the line.
    """
    print(f'labml_txl.dashboard: {message}', flush=True)


def file_signature(path: Path) -> Optional[Tuple[int, int]]:
    """
    `(mtime_ns, size)` of `path`, None when it does not exist: what tells that a whole-file YAML changed.

    Args:
        path: the file.
    """
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def file_size(path: Path) -> int:
    """
    The size of `path` in bytes, 0 when it does not exist: where a JSON-lines file that only grows ends.

    Args:
        path: the file.
    """
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _shown(value: Any) -> str:
    """`value` as JSON, cut at 60 characters: a wrong value in a message."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + '...'


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The fields of a run's entry in project_runs.json, as `ProjectFollower._read` writes them: what each accepts, said
ENTRY_FIELDS = {
    'state': (lambda v: v in (FOLLOWING, REPORTED_LIVE, DELETED), f'"{FOLLOWING}", "{REPORTED_LIVE}" or "{DELETED}"'),
    'folder': (lambda v: isinstance(v, str), "the run's folder (a string)"),
    'log_offset': (_is_count, 'a byte offset (an integer, 0 or more)'),
    'status_offset': (_is_count, 'a byte offset (an integer, 0 or more)'),
    'last_steps': (lambda v: isinstance(v, dict) and all(_is_number(step) for step in v.values()),
                   "an object of each series' last step sent"),
    'configs_signature': (lambda v: v is None or isinstance(v, list) and len(v) == 2 and all(map(_is_count, v)),
                          'null or [mtime_ns, size]'),
    'status': (lambda v: v is None or isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
               and _is_number(v[1]), 'null or [status, time]'),
    'last_time': (lambda v: v is None or _is_number(v), 'null or a time in seconds'),
    'pending': (lambda v: isinstance(v, bool), 'true or false'),
}
# Those every entry has, and those a followed run's has too (the ones the follower cannot do without)
EVERY_ENTRY_NEEDS = ('state', 'folder')
FOLLOWED_ENTRY_NEEDS = ('log_offset', 'status_offset', 'last_steps')


def _field_problem(mapping: Dict[str, Any], key: str, accepts: Callable[[Any], bool], accepted: str) -> Optional[str]:
    if key not in mapping:
        return f'"{key}" is missing'
    if not accepts(mapping[key]):
        return f'"{key}" is {_shown(mapping[key])}, where it is {accepted}'
    return None


def entry_problem(entry: Any) -> Optional[str]:
    """
    Why `entry` is not a run's entry of `project_runs.json` as the follower writes it; None when it is one.

    Args:
        entry: the entry, as parsed.
    """
    if not isinstance(entry, dict):
        return f"{_shown(entry)}, where a run's entry is a JSON object"
    needed = EVERY_ENTRY_NEEDS + (FOLLOWED_ENTRY_NEEDS if entry.get('state') == FOLLOWING else ())
    for key, (accepts, accepted) in ENTRY_FIELDS.items():
        why = _field_problem(entry, key, accepts, accepted) if key in entry or key in needed else None
        if why is not None:
            return why
    return None


def progress_problem(data: Any) -> Optional[str]:
    """
    Why `data` is not the follower's record (`project_runs.json`, parsed) of this version; None when it is.

    Args:
        data: the file's JSON.
    """
    if not isinstance(data, dict):
        return f'{_shown(data)}, where the record is a JSON object'
    why = (_field_problem(data, 'version', lambda v: v == PROGRESS_VERSION, str(PROGRESS_VERSION))
           or _field_problem(data, 'runs', lambda v: isinstance(v, dict), 'a JSON object of the runs by uuid'))
    if why is not None:
        return why
    for uuid, entry in data['runs'].items():
        why = entry_problem(entry)
        if why is not None:
            return f'run {uuid}: {why}'
    return None


def read_progress(path: Path) -> Dict[str, Dict[str, Any]]:
    """
    The runs of the follower's record `path` (`project_runs.json`) by uuid, `{}` when there is none. One that is not
    JSON (cut short, say) or not of the record's shape is a `DamagedStoreFile` (a `ValueError`: the dashboard does
    not start) naming it, what is wrong in it and what to do: starting with no record would leave every run it
    imported unfollowed (taken for a run reported live).

    Args:
        path: the file.
    """
    try:
        data = read_json_file(path, RESTORE_OR_DELETE_PROGRESS)
    except FileNotFoundError:
        return {}
    why = progress_problem(data)
    if why is not None:
        raise DamagedStoreFile(path, why, RESTORE_OR_DELETE_PROGRESS)
    return data['runs']


class ImportFailed(RuntimeError):
    """labml_app refused or failed an import request."""


def display_name(name: str, comment: str) -> str:
    """
    The name a run is shown under: `name` and its `comment` (`train_xl attention=alibi`), since labml_app's page
    names a comparison's base run and the page's title by the name alone.

    Args:
        name: the run's name (`run.yaml`'s, the experiment's).
        comment: the run's comment (for this package's scripts, its overrides that differ from the defaults).
    """
    name, comment = str(name or '').strip(), str(comment or '').strip()
    if not comment or comment in name:
        return name
    return f'{name} {comment}' if name else comment


def info_packet(run_info: Dict[str, Any], now: float) -> Dict[str, Any]:
    """
    The packet of a run's information, as labml's `AppExperiment.start` sends it, from its `run.yaml`; its name
    carries its comment (`display_name`).

    Args:
        run_info: the run's `run.yaml`.
        now: the packet's time.
    """
    packet = {'name': display_name(run_info.get('name', ''), run_info.get('comment', '')),
              'comment': str(run_info.get('comment') or ''),
              'time': now}
    for key, default in (('python_file', ''), ('repo_remotes', []), ('commit', ''), ('commit_message', ''),
                         ('is_dirty', False), ('start_step', 0), ('load_run', None), ('tags', []), ('notes', '')):
        value = run_info.get(key, default)
        packet[key] = default if value is None and default is not None else value
    if not isinstance(packet['tags'], list):
        packet['tags'] = [str(packet['tags'])]
    return packet


def indicators_packet(indicators: Dict[str, Any], now: float) -> Dict[str, Any]:
    """
    The packet of a run's indicators, as labml's app writer's `save_indicators` sends it.

    Args:
        indicators: the run's `indicators.yaml`.
        now: the packet's time.
    """
    return {'indicators': indicators.get('indicators') or {},
            'wildcard_indicators': indicators.get('wildcards') or {},
            'time': now}


def track_packet(series: Dict[str, Dict[int, float]], now: float) -> Dict[str, Any]:
    """
    The packet of a run's metrics, as labml's app writer sends them: `{key: {'step': [...], 'value': [...]}}`,
    each series in step order.

    Args:
        series: `{key: {step: value}}` (`files.merge_metrics`).
        now: the packet's time.
    """
    track = {}
    for key, points in series.items():
        steps = sorted(points)
        track[key] = {'step': steps, 'value': [points[s] for s in steps]}
    return {'track': track, 'time': now}


def status_packet(status: str, status_time: float, details: Any = None) -> Dict[str, Any]:
    """
    The packet of a run's status, as labml's `AppExperiment.status` sends it.

    Args:
        status: `completed`, `interrupted`, `crashed`, `in progress`, ...
        status_time: when the run got it.
        details: labml's details of it (an interrupted run's message), or None.
    """
    return {'status': {'rank': 0, 'status': status, 'details': details, 'time': status_time}, 'time': status_time}


async def call_app(app: Callable, method: str, path: str, query: Optional[Dict[str, str]] = None,
                   body: Any = None) -> Tuple[int, Any]:
    """
    One request to the ASGI `app` in this process (on the running loop), as a client on 127.0.0.1 would send it.
    Returns `(status, JSON of the answer)` (the answer's text where it is not JSON); an exception the app raises
    comes out of this call.

    Args:
        app: the ASGI app.
        method: `GET`, `POST`, ...
        path: the request's path (`/api/v1/...`).
        query: the query string's parameters.
        body: sent as JSON, when not None.
    """
    raw = b'' if body is None else json.dumps(body, default=str).encode('utf-8')
    headers = [(b'host', b'127.0.0.1'), (b'content-length', str(len(raw)).encode())]
    if body is not None:
        headers.append((b'content-type', b'application/json'))
    scope = {'type': 'http', 'asgi': {'version': '3.0'}, 'http_version': '1.1', 'method': method, 'scheme': 'http',
             'path': path, 'raw_path': path.encode(), 'query_string': urlencode(query or {}).encode(),
             'root_path': '', 'headers': headers, 'client': ('127.0.0.1', 0), 'server': ('127.0.0.1', 80)}
    body_sent = False
    done = asyncio.Event()
    answer = {'status': None, 'body': []}

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {'type': 'http.request', 'body': raw, 'more_body': False}
        await done.wait()  # the client "disconnects" once it has its answer
        return {'type': 'http.disconnect'}

    async def send(message):
        if message['type'] == 'http.response.start':
            answer['status'] = message['status']
        elif message['type'] == 'http.response.body':
            answer['body'].append(message.get('body', b''))
            if not message.get('more_body', False):
                done.set()

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    content = b''.join(answer['body'])
    try:
        return answer['status'], json.loads(content) if content else None
    except ValueError:
        return answer['status'], content.decode('utf-8', 'replace')


@dataclass
class _Plan:
    """What one scan sends for one run, and the run's progress entry once it is sent."""
    folder: RunFolder
    entry: Dict[str, Any]
    packets: List[Dict[str, Any]]
    create: bool  # the store has no such run: the request makes it
    reset: bool  # clear the run's series first, then send them whole
    start_time: Optional[float] = None
    last_time: Optional[float] = None
    new_loss: Set[str] = field(default_factory=set)


class ProjectFollower:
    """
    Imports the runs of the labml project `project` into the dashboard's store and follows them (see the module's
    docstring). `start(loop)` starts its thread, with `loop` the server's event loop; `stop()` ends it.

    Args:
        project: the project's folder (its runs are under `files.experiments_dir(project)`).
        data_dir: the dashboard's store; the follower keeps its progress in `data_dir/project_runs.json` (a damaged
            one is a `DamagedStoreFile` here, `read_progress`).
        app: labml_app's ASGI app (with `ClaimForToken` in front), which the import requests go to.
        token: the token of the track requests (`labml_txl.dashboard.LOCAL_TOKEN`): runs are the local user's.
        log: where the follower's lines go.
        scan_seconds: the pause between the end of a scan and the next.
        grace_seconds: how old a run's `run.yaml` must be before the follower imports it (see the docstring).
    """

    def __init__(self, project: Path, data_dir: Path, app: Callable, token: str,
                 log: Callable[[str], None] = dashboard_log, scan_seconds: float = 2.0, grace_seconds: float = 5.0):
        if not scan_seconds > 0:
            raise ValueError(f'scan_seconds={scan_seconds!r} is not accepted: a positive number of seconds')
        if not grace_seconds >= 0:
            raise ValueError(f'grace_seconds={grace_seconds!r} is not accepted: a number of seconds, 0 or more')
        self.project = Path(project)
        self.progress_path = Path(data_dir) / PROGRESS_FILE
        self.app = app
        self.token = token
        self.log = log
        self.scan_seconds = scan_seconds
        self.grace_seconds = grace_seconds
        self.scans = 0
        self._said: Set[str] = set()
        self._retry_at: Dict[str, float] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._saved: Optional[str] = None
        self.runs: Dict[str, Dict[str, Any]] = read_progress(self.progress_path)  # a damaged one stops the start
        # (mtime, size) of the record as read or last written: another change to it is met at the next scan
        self._saved_signature = file_signature(self.progress_path)
        self._summary = self._summarize()

    # -- state

    def _save_progress(self, again: bool = False) -> None:
        """Write the record where it changed (`again`: in any case)."""
        text = json.dumps({'version': PROGRESS_VERSION, 'runs': self.runs}, indent=1)
        if again or text != self._saved:
            write_atomically(self.progress_path, text)
            self._saved = text
            self._saved_signature = file_signature(self.progress_path)

    def _keep_progress_file(self) -> None:
        """Write the record again, saying so in a line, where its file changed since the follower read or wrote it
        (damaged, edited or deleted while the dashboard runs): what the follower holds is what it imported, and the
        next start must find it whole."""
        if file_signature(self.progress_path) == self._saved_signature:
            return
        change = self._progress_file_change()
        if change is not None:
            self.log(f'{self.progress_path} was {change} while the dashboard ran: written again from what the '
                     f'follower holds (edit it only with the dashboard stopped)')
        self._save_progress(again=True)

    def _progress_file_change(self) -> Optional[str]:
        """How the record's file differs from what the follower holds: `deleted`, `damaged (why)`, `edited`; None
        where it holds the same."""
        if not self.progress_path.exists():
            return 'deleted'
        try:
            found = read_progress(self.progress_path)
        except DamagedStoreFile as e:
            return f'damaged ({e.why})'
        return None if found == self.runs else 'edited'

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.log(message)

    def _summarize(self) -> Dict[str, Any]:
        return {'project': str(self.project), 'experiments': str(self._experiments_or_none() or ''),
                'scans': self.scans,
                'runs': {uuid: entry.get('state') for uuid, entry in self.runs.items()}}

    def _experiments_or_none(self) -> Optional[Path]:
        try:
            return experiments_dir(self.project)
        except RunFileError:
            return None

    def describe(self) -> Dict[str, Any]:
        """What the follower follows: the project, its experiments folder, the scans done and each run's state.
        Safe to call from any thread (a copy made after each scan)."""
        return dict(self._summary)

    # -- the thread

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """
        Start following.

        Args:
            loop: the server's event loop, which the import requests run on.
        """
        if self._thread is not None:
            return
        unthrottle_track_endpoint()
        self._loop = loop
        self._stop.clear()
        self._thread = threading.Thread(target=self._follow, name='labml_txl project follower', daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop following (from the loop: an import in flight finishes on it)."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
            self._thread = None

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan_once()
            except Exception as e:  # the thread must outlive anything a scan meets
                self._say_once(f'scan:{type(e).__name__}:{e}',
                               f'a scan of {self.project} failed ({type(e).__name__}: {e}); trying again')
            self.scans += 1
            self._summary = self._summarize()
            self._stop.wait(self.scan_seconds)

    def _on_loop(self, coroutine, timeout: float = APPLY_TIMEOUT_SECONDS):
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise

    # -- a scan

    def scan_once(self) -> None:
        """One pass over the project: import what is new, each run as soon as it is read and those with least to read
        first (a long run holds back no other), and save the progress. Needs `start` (the loop) first."""
        self._keep_progress_file()
        try:
            experiments = experiments_dir(self.project)
        except RunFileError as e:
            self._say_once(f'project:{e}', f'cannot find the runs of {self.project}: {e}; trying again')
            return
        candidates = self._candidates(experiments)
        if not candidates:
            return
        existing = self._on_loop(self._existing([folder.uuid for folder, _ in candidates]))
        for folder, entry in sorted(candidates, key=lambda candidate: self._bytes_to_read(*candidate)):
            self._follow_run(folder, entry, folder.uuid in existing)
        self._save_progress()

    def _candidates(self, experiments: Path) -> List[Tuple[RunFolder, Optional[Dict[str, Any]]]]:
        """The run folders under `experiments` that a scan looks into, each with its progress entry (None: a run
        not met before): new runs past their grace time, and followed runs whose files changed."""
        candidates = []
        now = time.time()
        for folder in find_run_folders(experiments):
            if self._retry_at.get(folder.uuid, 0) > now:
                continue
            entry = self.runs.get(folder.uuid)
            if entry is None:
                if now - (file_signature(folder.file(RUN_FILE)) or (0, 0))[0] / 1e9 < self.grace_seconds:
                    continue
            else:
                if entry.get('state') != FOLLOWING:
                    continue
                if entry.get('folder') != str(folder.path):
                    if Path(entry.get('folder', '')).is_dir():
                        self._say_once(f'twice:{folder.path}', f'run {folder.uuid} is in {entry.get("folder")} '
                                                               f'and in {folder.path}: the first is followed')
                        continue
                    entry['folder'] = str(folder.path)  # the run's folder was moved
                if not entry.get('pending') and not self._changed(folder, entry):
                    continue
            candidates.append((folder, entry))
        return candidates

    def _follow_run(self, folder: RunFolder, entry: Optional[Dict[str, Any]], exists: bool) -> None:
        """Read what is new of the run in `folder` and import it at once. `entry`: its progress (None: not met
        before); `exists`: whether the store has the run."""
        if entry is None and exists:
            self.runs[folder.uuid] = {'state': REPORTED_LIVE, 'folder': str(folder.path)}
            self.log(f'run {folder.uuid} ({folder.path}) was reported to the dashboard live: left as it is')
            return
        if entry is not None and not entry.get('pending') and not exists:
            entry['state'] = DELETED
            self.log(f'run {folder.uuid} was deleted on the dashboard: it is not imported again')
            return
        try:
            plan = self._plan(folder, entry, exists)
        except RunFileError as e:
            self._say_once(f'file:{e}', f'run {folder.uuid} skipped for now: {e}')
            return
        except Exception as e:  # unreadable (permissions, ...): this run only
            self._say_once(f'read:{folder.path}:{e}', f'run {folder.uuid} skipped for now: reading {folder.path} '
                                                      f'failed ({type(e).__name__}: {e})')
            return
        if plan.packets or plan.reset:
            self._import(plan)
        else:
            self.runs[folder.uuid] = plan.entry  # only skipped lines: nothing to send

    def _import(self, plan: _Plan) -> None:
        """Send `plan` to the app, marked `pending` in the saved progress until it is done (an import cut short is
        done again whole at the next start); a failed one is logged and tried again `RETRY_SECONDS` later."""
        uuid = plan.folder.uuid
        self.runs[uuid] = {**(self.runs.get(uuid) or plan.entry), 'pending': True}
        self._save_progress()
        try:
            self._on_loop(self._apply(plan))
        except Exception as e:
            self._say_once(f'apply:{uuid}:{e}', f'run {uuid}: the import failed ({type(e).__name__}: {e}); trying '
                                                f'again every {RETRY_SECONDS} s')
            self._retry_at[uuid] = time.time() + RETRY_SECONDS
            return
        self._retry_at.pop(uuid, None)
        self.runs[uuid] = plan.entry
        self._summary = self._summarize()
        if plan.create:
            self.log(f'run {uuid} imported from {plan.folder.path}')

    @staticmethod
    def _changed(folder: RunFolder, entry: Dict[str, Any]) -> bool:
        signature = file_signature(folder.file(CONFIGS_FILE))
        return (file_size(folder.file(METRICS_FILE)) != entry.get('log_offset')
                or file_size(folder.file(STATUS_FILE)) != entry.get('status_offset')
                or (list(signature) if signature else None) != entry.get('configs_signature'))

    @staticmethod
    def _reads_whole(folder: RunFolder, entry: Optional[Dict[str, Any]]) -> bool:
        """Whether the run's files are read from their start: a new run, an import cut short, or a file that shrank
        (replaced)."""
        return bool(entry is None or entry.get('pending') or entry.get('log_offset') is None
                    or file_size(folder.file(METRICS_FILE)) < entry['log_offset']
                    or file_size(folder.file(STATUS_FILE)) < entry['status_offset'])

    def _bytes_to_read(self, folder: RunFolder, entry: Optional[Dict[str, Any]]) -> int:
        """How much of the run's `log.jsonl` its next read reads."""
        size = file_size(folder.file(METRICS_FILE))
        return size if self._reads_whole(folder, entry) else size - entry['log_offset']

    def _plan(self, folder: RunFolder, entry: Optional[Dict[str, Any]], exists: bool) -> _Plan:
        """What to send for `folder` (run files read here, off the loop); raises `RunFileError` for a damaged
        YAML file."""
        whole = self._reads_whole(folder, entry)
        sent_before = set((entry or {}).get('last_steps') or {})
        for attempt in range(2):
            plan = self._read(folder, None if whole else entry, create=not exists, reset=exists and whole,
                              sent_before=sent_before)
            if plan is not None:
                return plan
            whole = True  # log.jsonl went back to steps already sent: send the run's series again, whole
        raise AssertionError('unreachable: a whole read always makes a plan')

    def _read(self, folder: RunFolder, entry: Optional[Dict[str, Any]], create: bool, reset: bool,
              sent_before: Set[str]) -> Optional[_Plan]:
        """The plan from `entry`'s offsets on (from the start when `entry` is None); None when new lines go back to
        a step already sent. `sent_before`: the series the store had before (not new to the chart)."""
        now = time.time()
        packets = []
        configs_signature = file_signature(folder.file(CONFIGS_FILE))
        configs_signature = list(configs_signature) if configs_signature else None
        start_time = None
        if entry is None:
            run_info = load_yaml_mapping(folder.file(RUN_FILE))
            configs = load_yaml_mapping(folder.file(CONFIGS_FILE), missing_ok=True)
            indicators = load_yaml_mapping(folder.file(INDICATORS_FILE), missing_ok=True)
            start_time = trial_time(run_info)
            packets.append(info_packet(run_info, now))
            if configs is not None:
                packets.append({'configs': configs, 'time': now})
            if indicators is not None:
                packets.append(indicators_packet(indicators, now))
        elif configs_signature != entry.get('configs_signature'):
            configs = load_yaml_mapping(folder.file(CONFIGS_FILE), missing_ok=True)
            if configs is not None:
                packets.append({'configs': configs, 'time': now})

        log_offset = entry['log_offset'] if entry else 0
        self._say_if_long_read(folder, log_offset)
        metrics = read_new_lines(folder.file(METRICS_FILE), log_offset, check_metrics_line)
        statuses = read_new_lines(folder.file(STATUS_FILE), entry['status_offset'] if entry else 0,
                                  check_status_line)
        for problem in metrics.problems + statuses.problems:
            self._say_once(f'line:{problem}', f'run {folder.uuid}: {problem}')
        series = merge_metrics(metrics.records)
        last_steps = dict(entry['last_steps']) if entry else {}
        if any(min(points) <= last_steps[key] for key, points in series.items() if key in last_steps):
            return None
        if series:
            packets.append(track_packet(series, latest_time(metrics.records) or now))
        new_loss = {key for key in series if key not in sent_before and key.split('.')[0].lower() == 'loss'}
        last_steps.update({key: max(points) for key, points in series.items()})

        # The status: the last status line, unless metrics came after it (a resumed run trains again)
        previous = entry.get('status') if entry else None
        status = None
        if statuses.records:
            line = statuses.records[-1]
            status = [line['status'], line['time'], line.get('details')]
        elif previous:
            status = list(previous) + [None] * (3 - len(previous))
        metrics_time = latest_time(metrics.records)
        if metrics_time is not None and (status is None or metrics_time > status[1] + RESUMED_AFTER_SECONDS):
            status = [IN_PROGRESS, metrics_time, None]
        if status is not None and (entry is None or status[:2] != (previous or [])[:2]):
            packets.append(status_packet(*status))

        times = [t for t in (metrics_time, status[1] if status else None, entry.get('last_time') if entry else None)
                 if t is not None]
        last_time = max(times) if times else None
        new_entry = {'state': FOLLOWING, 'folder': str(folder.path), 'log_offset': metrics.offset,
                     'status_offset': statuses.offset, 'configs_signature': configs_signature,
                     'last_steps': last_steps, 'status': status[:2] if status else None, 'last_time': last_time,
                     'pending': False}
        return _Plan(folder, new_entry, packets, create=create, reset=reset, start_time=start_time,
                     last_time=last_time if (series or statuses.records or entry is None) else None,
                     new_loss=new_loss)

    def _say_if_long_read(self, folder: RunFolder, offset: int) -> None:
        """A line naming the run about to be read, where its `log.jsonl` has more than `LONG_READ_BYTES` from
        `offset` on: nothing new of it shows while it is read, and the line says why."""
        unread = file_size(folder.file(METRICS_FILE)) - offset
        if unread > LONG_READ_BYTES:
            self.log(f'run {folder.uuid}: reading {unread / 2 ** 20:.1f} MiB of {folder.file(METRICS_FILE)}; it '
                     f'shows once read')

    # -- on the loop

    async def _existing(self, uuids: Sequence[str]) -> Set[str]:
        from labml_app.db import run
        return {uuid for uuid in uuids if run.get(uuid) is not None}

    async def _apply(self, plan: _Plan) -> None:
        from labml import __version__ as labml_version
        from labml_app.db import run
        _IMPORTING.set(True)  # in this task's context only: `_on_loop` runs each plan in a task of its own
        uuid = plan.folder.uuid
        packets = plan.packets
        if plan.reset:
            tracks = [p['track'] for p in packets if 'track' in p]
            self._replace_series(uuid, tracks[0] if tracks else {})
            packets = [p for p in packets if 'track' not in p]
        if packets:
            status, answer = await call_app(self.app, 'POST', f'/api/v1/{self.token}/track',
                                            {'run_uuid': uuid, 'labml_version': labml_version}, packets)
            if status != 200 or not isinstance(answer, dict) or answer.get('errors'):
                raise ImportFailed(f'the track endpoint answered {status}: {str(answer)[:300]}')
        r = run.get(uuid)
        if r is None:
            raise ImportFailed('the run is not in the store after its import')
        if plan.create and plan.start_time is not None:
            r.start_time = plan.start_time
            r.save()
        if plan.last_time is not None:
            s = r.status.load()
            s.last_updated_time = plan.last_time
            s.save()
        if plan.new_loss:
            await self._select_series(uuid, plan.new_loss)

    @staticmethod
    def _replace_series(uuid: str, track: Dict[str, Dict[str, list]]) -> None:
        """
        Replace the points of the run's series in `track` (labml_app's track endpoint can only append them), in one
        step on the loop, so that no request sees them half done: each one is emptied, then `track` goes through
        the code the track endpoint runs for a packet's `track` (`AnalysisManager.track`). The series stay where
        they were in the run's list, so the chart's choice of each (labml_app keeps them as a list in the order of
        the series' names) stays as the user left it.
        """
        from labml_app import analyses
        from labml_app.analyses.experiments.metrics import MetricsIndex
        from labml_app.analyses.series import Series
        metrics_key = MetricsIndex.get(uuid)
        if metrics_key:
            metrics = metrics_key.load()
            for key in metrics.tracking:
                if key in track:
                    metrics.tracking[key] = Series().to_data()
            metrics.step = 0
            metrics.save()
        if track:
            analyses.AnalysisManager.track(uuid, track)

    async def _select_series(self, uuid: str, new_loss: Set[str]) -> None:
        """Show the new `loss.*` series on the run's chart, through the app's preferences endpoint (labml_app hides
        a series that comes after the run's first packet)."""
        status, data = await call_app(self.app, 'POST', f'/api/v1/metrics/{uuid}', body={'get_all': False})
        if status != 200:
            raise ImportFailed(f'the metrics endpoint answered {status}: {str(data)[:300]}')
        names = [s['name'] for s in data['series']]
        status, data = await call_app(self.app, 'GET', f'/api/v1/metrics/preferences/{uuid}')
        if status != 200:
            raise ImportFailed(f'the preferences endpoint answered {status}: {str(data)[:300]}')
        chosen = (list(data.get('series_preferences') or []) + [-1] * len(names))[:len(names)]
        wanted = [1 if name in new_loss else choice for name, choice in zip(names, chosen)]
        if wanted != chosen:
            status, data = await call_app(self.app, 'POST', f'/api/v1/metrics/preferences/{uuid}',
                                          body={'series_preferences': wanted, 'series_names': names})
            if status != 200:
                raise ImportFailed(f'the preferences endpoint answered {status}: {str(data)[:300]}')


class FollowProject:
    """
    ASGI wrapper of labml_app that runs `follower` for as long as the server runs (it starts on the server's
    lifespan start-up, with the server's loop, and stops at its shut-down) and answers `GET
    /api/labml_txl/following` with `follower.describe()` (`{"project": null}` when there is no follower).
    """

    def __init__(self, app: Callable, follower: Optional[ProjectFollower]):
        self._app = app
        self.follower = follower

    async def __call__(self, scope, receive, send):
        if scope['type'] == 'lifespan' and self.follower is not None:
            follower = self.follower

            async def receive_and_follow():
                message = await receive()
                if message['type'] == 'lifespan.startup':
                    follower.start(asyncio.get_running_loop())
                elif message['type'] == 'lifespan.shutdown':
                    await follower.stop()
                return message

            return await self._app(scope, receive_and_follow, send)
        if scope['type'] == 'http' and scope['method'] == 'GET' and scope['path'].rstrip('/') == FOLLOWING_PATH:
            body = json.dumps(self.follower.describe() if self.follower else {'project': None}).encode()
            await send({'type': 'http.response.start', 'status': 200,
                        'headers': [(b'content-type', b'application/json'),
                                    (b'content-length', str(len(body)).encode())]})
            await send({'type': 'http.response.body', 'body': body})
            return
        await self._app(scope, receive, send)
