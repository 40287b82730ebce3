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
from .store import write_atomically

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
        data_dir: the dashboard's store; the follower keeps its progress in `data_dir/project_runs.json`.
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
        self.runs: Dict[str, Dict[str, Any]] = self._load_progress()
        self._summary = self._summarize()

    # -- state

    def _load_progress(self) -> Dict[str, Dict[str, Any]]:
        if not self.progress_path.exists():
            return {}
        try:
            data = json.loads(self.progress_path.read_text(encoding='utf-8'))
            runs = data['runs']
            if data.get('version') != PROGRESS_VERSION or not isinstance(runs, dict):
                raise ValueError(f'version {data.get("version")!r}, expected {PROGRESS_VERSION}')
            return runs
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Starting over is safe: the runs already in the store are then left alone as if reported live
            self.log(f'{self.progress_path} is not readable ({e}); the runs already on the dashboard are left as '
                     f'they are, the others imported')
            return {}

    def _save_progress(self) -> None:
        text = json.dumps({'version': PROGRESS_VERSION, 'runs': self.runs}, indent=1)
        if text != self._saved:
            write_atomically(self.progress_path, text)
            self._saved = text

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
        """One pass over the project: import what is new, save the progress. Needs `start` (the loop) first."""
        try:
            experiments = experiments_dir(self.project)
        except RunFileError as e:
            self._say_once(f'project:{e}', f'cannot find the runs of {self.project}: {e}; trying again')
            return
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
        if not candidates:
            return

        existing = self._on_loop(self._existing([folder.uuid for folder, _ in candidates]))
        plans = []
        for folder, entry in candidates:
            exists = folder.uuid in existing
            if entry is None and exists:
                self.runs[folder.uuid] = {'state': REPORTED_LIVE, 'folder': str(folder.path)}
                self.log(f'run {folder.uuid} ({folder.path}) was reported to the dashboard live: left as it is')
                continue
            if entry is not None and not entry.get('pending') and not exists:
                entry['state'] = DELETED
                self.log(f'run {folder.uuid} was deleted on the dashboard: it is not imported again')
                continue
            try:
                plan = self._plan(folder, entry, exists)
            except RunFileError as e:
                self._say_once(f'file:{e}', f'run {folder.uuid} skipped for now: {e}')
                continue
            except Exception as e:  # unreadable (permissions, ...): this run only
                self._say_once(f'read:{folder.path}:{e}', f'run {folder.uuid} skipped for now: reading {folder.path} '
                                                          f'failed ({type(e).__name__}: {e})')
                continue
            if plan.packets or plan.reset:
                plans.append(plan)
            else:
                self.runs[folder.uuid] = plan.entry  # only skipped lines: nothing to send
        if plans:
            for plan in plans:
                self.runs[plan.folder.uuid] = {**(self.runs.get(plan.folder.uuid) or plan.entry), 'pending': True}
            self._save_progress()
            results = self._on_loop(self._apply_all(plans))
            for plan, result in zip(plans, results):
                if isinstance(result, BaseException):
                    self._say_once(f'apply:{plan.folder.uuid}:{result}',
                                   f'run {plan.folder.uuid}: the import failed ({type(result).__name__}: {result}); '
                                   f'trying again every {RETRY_SECONDS} s')
                    self._retry_at[plan.folder.uuid] = time.time() + RETRY_SECONDS
                    continue
                self._retry_at.pop(plan.folder.uuid, None)
                self.runs[plan.folder.uuid] = plan.entry
                if plan.create:
                    self.log(f'run {plan.folder.uuid} imported from {plan.folder.path}')
        self._save_progress()

    @staticmethod
    def _changed(folder: RunFolder, entry: Dict[str, Any]) -> bool:
        signature = file_signature(folder.file(CONFIGS_FILE))
        return (file_size(folder.file(METRICS_FILE)) != entry.get('log_offset')
                or file_size(folder.file(STATUS_FILE)) != entry.get('status_offset')
                or (list(signature) if signature else None) != entry.get('configs_signature'))

    def _plan(self, folder: RunFolder, entry: Optional[Dict[str, Any]], exists: bool) -> _Plan:
        """What to send for `folder` (run files read here, off the loop); raises `RunFileError` for a damaged
        YAML file."""
        metrics_path, status_path = folder.file(METRICS_FILE), folder.file(STATUS_FILE)
        # From the start: a new run, an import cut short, or a file that shrank (replaced)
        whole = entry is None or entry.get('pending') or entry.get('log_offset') is None \
            or file_size(metrics_path) < entry['log_offset'] or file_size(status_path) < entry['status_offset']
        sent_before = set((entry or {}).get('last_steps') or {})
        for attempt in range(2):
            plan = self._read(folder, None if whole else entry, create=not exists, reset=exists and bool(whole),
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

        metrics = read_new_lines(folder.file(METRICS_FILE), entry['log_offset'] if entry else 0, check_metrics_line)
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

    # -- on the loop

    async def _existing(self, uuids: Sequence[str]) -> Set[str]:
        from labml_app.db import run
        return {uuid for uuid in uuids if run.get(uuid) is not None}

    async def _apply_all(self, plans: Sequence[_Plan]) -> List[Any]:
        return await asyncio.gather(*(self._apply(plan) for plan in plans), return_exceptions=True)

    async def _apply(self, plan: _Plan) -> None:
        from labml import __version__ as labml_version
        from labml_app.db import run
        _IMPORTING.set(True)  # in this task's context only: gather runs each plan in a task of its own
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
