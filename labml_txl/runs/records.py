"""
# Reading a run folder

A run is a labml run folder, `<project>/logs/<experiment name>/<run uuid>/` (a distributed run's is rank 0's,
`<uuid>.0`), of the labml project of the working directory (`labml_txl.train.runs`). `read_run` reads one into a
`RunRecord` from the files there, never importing the script that made it; the files are read as the dashboard
reads them (`files`: the same lines, the same YAML, the same metrics):

* `run.yaml` (labml's): the name (the script's, `train_xl`), the comment (the overrides that differ from the
  defaults), the tags (`sweep:<id>` for a run a sweep started), the script's path, the time of the latest start;
* `run_log.jsonl` (labml's): one status line at each end (`completed`, `interrupted`, `crashed`); the last one is
  the run's, unless the run was started again after it (a resume) and has not ended since;
* `train.lock`: held while a process trains the run (`labml_txl.file_lock`), whatever its status lines say;
* `configs.yaml` (labml's): every config item, its computed value and whether it was overridden (`ConfigValue`);
* `log.jsonl` (`labml_txl.train.metrics_file`): the tracked values, read as one step-to-value series per metric
  (`files.read_metrics`: of a resumed run, the values written last).

A run's status is `running` while its lock is held, else its last status line, else `unfinished` (it never ended:
killed, or crashed before labml could say so). A file that is missing, damaged or being written leaves the fields
it would fill empty.
"""
import difflib
import math
import os
import time
import uuid as uuid_module
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..configs.validation import short_value
from ..train.runs import LOCK_FILE, project_root, use_working_directory_project
from .files import (CONFIGS_FILE, METRICS_FILE, RUN_FILE, STATUS_FILE, RunFileError, RunFolder, check_metrics_line,
                    check_status_line, experiments_dir, find_run_folders, latest_time, load_yaml_mapping,
                    merge_metrics, read_new_lines, run_uuid_of, sorted_metrics, trial_time)

RUNNING = 'running'
UNFINISHED = 'unfinished'

# labml's `configs.yaml` types whose computed values are data even where they are strings
_STRING_TYPES = {"<class 'str'>", 'typing.Optional[str]'}
# labml's mark of a value it cut
_TRUNCATED = '[[...]]'

PathLike = Union[str, os.PathLike]


class RunLookupError(LookupError):
    """A run (or a project) that is not there, or a UUID prefix that more than one run starts with."""

    def __str__(self):
        return str(self.args[0])


class MixedScriptsError(ValueError):
    """Runs of different scripts, where only runs of one script are compared."""


@dataclass(frozen=True)
class ConfigValue:
    """
    One item of a run's `configs.yaml`.

    Args:
        key: the item's key (`transformer.ffn.d_ff` for an item of nested configs).
        value: what the run used, as data to compare: the computed value where it is data (`None`, a bool, number,
            string or list); for an object (a module, the optimizer, the corpus), the option named for it in the
            overrides (`'sgd'`), else `None` (computed from the other items by the default option: those items say
            how the runs differ); `None` where the item was never computed.
        text: the value as a table shows it, on one line (an object's first line, `MemTransformerLM(…)`).
        overridden: labml's `is_explicitly_specified`: the item was given in the overrides.
        computed: the run computed the item (labml's `order` is not -1).
        is_object: the computed value is an object's string, not data.
    """
    key: str
    value: Any
    text: str
    overridden: bool
    computed: bool
    is_object: bool


@dataclass
class RunRecord:
    """
    A run, as `read_run` reads it from its folder.

    Args:
        uuid: the run's UUID (its folder's name, without `.0` for a distributed run).
        path: its folder (rank 0's for a distributed run).
        name: labml's experiment name, the script's (`train_xl`).
        comment: labml's comment: the overrides that differ from the defaults (`attention=alibi mem_len=64`).
        tags: labml's tags (`sweep:<id>` for a run of a sweep).
        python_file: the path of the script that made the run, as labml recorded it.
        status: `completed`, `interrupted`, `crashed` (labml's words), `running` or `unfinished` (see the module).
        status_details: what the last status line says beside the status (a crash's error), or None.
        started: when the run was first started, in seconds since the epoch (from a time-based UUID, as labml
            makes them; else the latest start that `run.yaml` records).
        updated: the last time the run wrote a metric or a status line (seconds since the epoch).
        configs: every config item of `configs.yaml`, by key.
        metrics: each metric's series: `(step, value)` in step order, the value the mean of the values tracked at
            that step; of a resumed run, the values written last (`files.read_metrics`).
    """
    uuid: str
    path: Path
    name: str
    comment: str
    tags: List[str]
    python_file: Optional[str]
    status: str
    status_details: Optional[str]
    started: float
    updated: float
    configs: Dict[str, ConfigValue] = field(default_factory=dict)
    metrics: Dict[str, List[Tuple[int, float]]] = field(default_factory=dict)

    @property
    def script(self) -> str:
        """What tells the runs of one script apart from another's: `name (file name of python_file)`."""
        file_name = Path(self.python_file).name if self.python_file else '?'
        return f'{self.name} ({file_name})'

    def last(self, metric: str) -> Optional[float]:
        """The value of `metric` at its last step, or None where the run has none."""
        series = self.metrics.get(metric)
        return series[-1][1] if series else None

    def last_step(self, metric: str = 'loss.train') -> Optional[int]:
        """The last step at which `metric` was tracked (labml's global step: 29 after 30 training steps), or None."""
        series = self.metrics.get(metric)
        return series[-1][0] if series else None

    def best(self, metric: str) -> Optional[float]:
        """The smallest value of `metric` (NaN left out), or None."""
        values = [v for _, v in self.metrics.get(metric, []) if not math.isnan(v)]
        return min(values) if values else None

    def config(self, key: str) -> Optional[ConfigValue]:
        """The config item `key`, or None where the run has no such item."""
        return self.configs.get(key)


# ## The project

def experiments_folder(project: Optional[PathLike] = None) -> Path:
    """
    The folder that holds a labml project's runs (`<project>/logs`, or the `experiments_path` of its `.labml.yaml`).

    Args:
        project: a folder of the project (its root, or a folder below it); None for the project of the working
            directory, the one training scripts write to (`runs.use_working_directory_project`; a program that
            chose labml's path keeps its choice).
    """
    if project is None:
        from labml import lab
        use_working_directory_project()
        return Path(lab.get_experiments_path())
    folder = Path(project).expanduser().resolve()
    if not folder.is_dir():
        raise RunLookupError(f'project folder {str(project)!r} does not exist')
    try:
        return experiments_dir(project_root(folder)).resolve()
    except RunFileError as e:  # a damaged .labml.yaml: where the runs are is not known
        raise RunLookupError(str(e)) from e


# ## Reading one run

def _read_yaml(path: Path) -> Dict[str, Any]:
    """The mapping of a YAML file of the run (`files.load_yaml_mapping`), empty where it is missing or damaged."""
    try:
        return load_yaml_mapping(path, missing_ok=True) or {}
    except RunFileError:
        return {}


def _is_data(item: Dict[str, Any]) -> bool:
    computed = item.get('computed')
    if not isinstance(computed, str):
        return True
    return str(item.get('type')) in _STRING_TYPES and _TRUNCATED not in computed


def _object_text(computed: Any) -> str:
    """An object's string on one line: its first line, `…` where more follows (`MemTransformerLM(…)`)."""
    text = str(computed)
    first = text.split('\n', 1)[0].rstrip()
    if first != text.rstrip():
        first = first + '…)' if first.endswith('(') else first + ' …'
    return short_value(first)


def read_configs(path: PathLike) -> Dict[str, ConfigValue]:
    """The items of a run's `configs.yaml` (`path`, or the run folder that holds it), by key (`ConfigValue`)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIGS_FILE
    configs = {}
    for key, item in sorted(_read_yaml(path).items()):
        if not isinstance(item, dict):
            continue
        computed = item.get('order', -1) != -1
        overridden = bool(item.get('is_explicitly_specified'))
        if not computed and overridden:
            # Given but never computed itself: an aggregate's name (`glu_variant='SwiGLU'`) that set other items
            value, is_object = item.get('value'), False
            text = short_value(value)
        elif not computed:
            value, text, is_object = None, '(not computed)', False
        elif _is_data(item):
            value, is_object = item.get('computed'), False
            text = short_value(value)
        else:
            is_object = True
            given = item.get('value')
            value = given if isinstance(given, str) and _TRUNCATED not in given else None
            text = short_value(value) if value is not None else _object_text(item.get('computed'))
        configs[str(key)] = ConfigValue(str(key), value, text, overridden, computed, is_object)
    return configs


def lock_is_held(lock_path: Path) -> bool:
    """Whether a process holds the lock `lock_path` (`labml_txl.file_lock`), without taking it: Linux's
    `/proc/locks` says; elsewhere, or where it does not list the file, a shared lock is tried for an instant, if the
    process the file names is alive."""
    try:
        stat = os.stat(lock_path)
    except OSError:
        return False
    try:
        held = _listed_in_proc_locks(stat)
        if held:
            return True
    except OSError:
        pass
    pid = _recorded_pid(lock_path)
    if pid is not None and not _process_exists(pid):
        return False
    return _probe(lock_path)


def _listed_in_proc_locks(stat: os.stat_result) -> bool:
    device = f'{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}'
    with open('/proc/locks') as f:
        for line in f:
            fields = line.split()
            # `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF`; a waiter's line has `->` after the number
            if len(fields) >= 6 and fields[1] == 'FLOCK' and fields[5] == device:
                return True
    return False


def _recorded_pid(lock_path: Path) -> Optional[int]:
    try:
        return int(lock_path.read_text().strip())
    except (OSError, ValueError):
        return None


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _probe(lock_path: Path) -> bool:
    try:
        import fcntl
    except ImportError:
        return False
    try:
        with open(lock_path, 'r') as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def uuid_time(run_uuid: str) -> Optional[float]:
    """When a time-based (version 1) UUID, as labml makes them, was made, in seconds since the epoch; None for any
    other UUID."""
    try:
        parsed = uuid_module.UUID(hex=run_uuid)
    except (ValueError, TypeError, AttributeError):
        return None
    if parsed.version != 1:
        return None
    # 100 ns intervals since 1582-10-15
    seconds = (parsed.time - 0x01b21dd213814000) / 1e7
    return seconds if 946684800 < seconds < time.time() + 86400 else None


def run_status(path: Path, latest_start: Optional[float] = None) -> Tuple[str, Optional[str], Optional[float]]:
    """`(status, details, time of the status line)` of the run in folder `path`: see the module."""
    lines = read_new_lines(path / STATUS_FILE, 0, check_status_line).records
    last = lines[-1] if lines else None
    if lock_is_held(path / LOCK_FILE):
        return RUNNING, None, last['time'] if last else None
    if last is None:
        return UNFINISHED, None, None
    when = last['time']
    # Started again (resumed) after its last status line, and not running: it ended without a word
    if latest_start is not None and when < latest_start:
        return UNFINISHED, None, when
    details = last.get('details')
    return last['status'], None if details is None else str(details), when


def read_run(path: PathLike) -> RunRecord:
    """The run in folder `path` (a folder under `<project>/logs/<name>/`), read from its files (see the module). A
    file that is missing or being written leaves its fields empty rather than failing; a folder with no `run.yaml`
    (or none any more: deleted while being read) is a `RunLookupError`."""
    path = Path(path)
    try:
        run_file_time = (path / RUN_FILE).stat().st_mtime
    except OSError as e:
        raise RunLookupError(f'{path} is not a labml run folder: it has no {RUN_FILE}') from e
    info = _read_yaml(path / RUN_FILE)
    # The folder's name, as labml made it and as `find_runs` and a resume look it up
    run_uuid = run_uuid_of(path.name) or path.name
    latest_start = trial_time(info)
    status, details, status_time = run_status(path, latest_start)
    started = uuid_time(run_uuid) or latest_start or run_file_time
    # log.jsonl is read once, for both its metrics and its latest time: it is the one file that grows large
    metric_lines = read_new_lines(path / METRICS_FILE, 0, check_metrics_line).records
    updated = max(t for t in (started, latest_start, status_time, latest_time(metric_lines)) if t is not None)
    tags = info.get('tags') or []
    return RunRecord(uuid=run_uuid, path=path, name=str(info.get('name') or path.parent.name),
                     comment=str(info.get('comment') or ''), tags=[str(t) for t in tags],
                     python_file=info.get('python_file'), status=status, status_details=details, started=started,
                     updated=updated, configs=read_configs(path), metrics=sorted_metrics(merge_metrics(metric_lines)))


# ## Finding runs

def load_runs(project: Optional[PathLike] = None, sweep: Optional[str] = None,
              name: Optional[str] = None) -> List[RunRecord]:
    """
    Every run of a labml project, first started first.

    Args:
        project: a folder of the project; None for the working directory's (`experiments_folder`).
        sweep: only the runs tagged `sweep:<sweep>` (the runs a sweep started).
        name: only the runs of this experiment name (`train_xl`).
    """
    records = [record for record in map(_read_if_there, find_run_folders(experiments_folder(project)))
               if record is not None]
    if sweep is not None:
        records = [r for r in records if f'sweep:{sweep}' in r.tags]
    if name is not None:
        records = [r for r in records if r.name == name]
    return sorted(records, key=lambda r: (r.started, r.uuid))


def _read_if_there(folder: RunFolder) -> Optional[RunRecord]:
    """The run of `folder`, or None where its `run.yaml` went away after the folder was listed (a run deleted while
    the project is read: the others are still listed)."""
    try:
        return read_run(folder.path)
    except RunLookupError:
        if (folder.path / RUN_FILE).exists():
            raise
        return None


def find_runs(uuids: Sequence[str], project: Optional[PathLike] = None) -> List[RunRecord]:
    """
    The runs of `uuids`, in that order: each a UUID or a prefix that only one run's UUID starts with.

    Args:
        uuids: the UUIDs (or unique prefixes) of the runs.
        project: a folder of the project; None for the working directory's.

    Raises a `RunLookupError` naming every UUID that is not there (with the closest known UUIDs) and every prefix
    that more than one run starts with (with those runs), and where it looked.
    """
    experiments = experiments_folder(project)
    folders = {folder.uuid: folder.path for folder in find_run_folders(experiments)}
    found, missing, ambiguous = [], [], []
    for given in uuids:
        given = given.strip()
        if given in folders:
            found.append(folders[given])
            continue
        matches = [u for u in folders if given and u.startswith(given)]
        if len(matches) == 1:
            found.append(folders[matches[0]])
        elif matches:
            ambiguous.append(f"{given!r} (the start of {', '.join(sorted(matches))})")
        else:
            close = closest_uuids(given, folders)
            missing.append(f"{given!r}" + (f" (closest: {', '.join(close)})" if close else ''))
    if missing or ambiguous:
        parts = []
        if missing:
            parts.append(f"unknown run UUID{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
        if ambiguous:
            parts.append(f"more than one run starts with {', '.join(ambiguous)}: give more of the UUID")
        where = f'{len(folders)} runs under {experiments}' if folders else f'no runs under {experiments}'
        raise RunLookupError(f"{'; '.join(parts)} ({where}; `python -m labml_txl.runs list --full` lists them)")
    return [read_run(path) for path in found]


def closest_uuids(given: str, known: Sequence[str], n: int = 3) -> List[str]:
    """The known UUIDs most like `given`, whole or as a start (a mistyped prefix), at most `n`."""
    def likeness(u: str) -> float:
        return max(difflib.SequenceMatcher(None, given, u).ratio(),
                   difflib.SequenceMatcher(None, given, u[:len(given)]).ratio())
    scored = sorted(((likeness(u), u) for u in known), reverse=True)
    return [u for score, u in scored[:n] if score >= 0.6]


def check_same_script(records: Sequence[RunRecord]) -> None:
    """A `MixedScriptsError` naming each script and its runs unless all of `records` are runs of one script (the same
    labml name and script file name: `RunRecord.script`)."""
    scripts: Dict[str, List[str]] = {}
    for record in records:
        scripts.setdefault(record.script, []).append(record.uuid)
    if len(scripts) > 1:
        each = '; '.join(f"{script}: {', '.join(uuids)}" for script, uuids in scripts.items())
        raise MixedScriptsError(f'the runs are of different scripts, so their configs do not compare ({each}); '
                                f'--any-script compares them anyway')
