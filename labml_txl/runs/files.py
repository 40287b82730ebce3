"""
# The files of a run folder, as a reader finds them

Two programs read the run folders of a labml project: `python -m labml_txl.runs` reads them whole when asked
(`records`), and the dashboard follows them while trainings write them (`labml_txl.dashboard.project_runs`).
They read them here, so that both take the same lines, the same YAML, and the same value for every step of a
resumed run.

A run folder is `<experiments>/<experiment name>/<run uuid>/`, where `<experiments>` is the project's `logs/` (or
the `experiments_path` of its `.labml.yaml`: `experiments_dir`). A distributed run has one folder per rank,
`<uuid>.<rank>`, and only rank 0's holds the metrics: that one stands for the run (`find_run_folders`). A folder
with no `run.yaml` is not a run (yet).

* `run.yaml`, `configs.yaml` and `indicators.yaml` are written whole by labml (`yaml.dump`). `load_yaml_mapping`
  reads them with PyYAML's safe loader plus the one Python tag labml's data can hold, `!!python/tuple` (a config's
  value); labml's own loader would build any Python object a file names. One that does not parse, or is not a
  mapping, is damaged or caught in mid-write: a `RunFileError` names it.
* `log.jsonl` (the run's metrics, `labml_txl.train.metrics_file`) and `run_log.jsonl` (labml's status lines) only
  grow, a line at a time. `read_new_lines` reads one from a byte offset up to its last newline: a last line still
  being written is left for the next read. A complete line that is not JSON of the file's shape (`check_metrics_line`,
  `check_status_line`) is reported with its byte offset and skipped; the lines after it are still read, so one torn
  write (a training killed in mid-line, then resumed) costs its own line only.
* `merge_metrics` makes the lines of `log.jsonl` into one series per metric. A resumed run appends again from its
  checkpoint's step, so a metric's steps can come twice: a line whose values of a metric start at step S replaces
  that metric's values at steps S and later (the steps the stopped run made after its checkpoint are dropped even
  where the resumed run has not reached them yet), and of a step written twice the value written last wins. A
  step's value is the mean of the values tracked at it.
"""
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import yaml

from ..train.metrics_file import METRICS_FILE
from ..train.runs import PROJECT_FILE

RUN_FILE = 'run.yaml'
CONFIGS_FILE = 'configs.yaml'
INDICATORS_FILE = 'indicators.yaml'
STATUS_FILE = 'run_log.jsonl'


class _RunYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, plus the tuples that labml's `yaml.dump` writes as `!!python/tuple` (a config's value
    can be one); it builds no other Python object."""


_RunYamlLoader.add_constructor('tag:yaml.org,2002:python/tuple',
                               lambda loader, node: tuple(loader.construct_sequence(node)))


class RunFileError(ValueError):
    """A file of a run folder (or a project's `.labml.yaml`) that cannot be read as what it should hold; the message
    names the file."""


@dataclass(frozen=True)
class RunFolder:
    """One run of a project: its folder (rank 0's for a distributed run) and its uuid."""
    path: Path
    uuid: str

    def file(self, name: str) -> Path:
        return self.path / name


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


# ## Where the runs are

def experiments_dir(project: Path) -> Path:
    """
    Where the runs of the labml project `project` lie: `project/logs`, or the `experiments_path` that the project's
    `.labml.yaml` sets (relative to the project). A `.labml.yaml` that does not parse is a `RunFileError`.

    Args:
        project: the project's folder, its root (`labml_txl.train.runs.project_root` finds it from a folder below).
    """
    project = Path(project)
    settings_file = project / PROJECT_FILE
    if settings_file.is_file():
        try:
            settings = yaml.safe_load(settings_file.read_text(encoding='utf-8'))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise RunFileError(f'{settings_file}: not readable as YAML ({_first_line(e)})') from e
        if isinstance(settings, dict) and settings.get('experiments_path'):
            return project / str(settings['experiments_path'])
    return project / 'logs'


def run_uuid_of(folder_name: str) -> Optional[str]:
    """
    The uuid of the run whose folder is named `folder_name` (`<uuid>`, or `<uuid>.0` for rank 0 of a distributed
    run), or None for another rank's folder (`<uuid>.<rank>`), which readers leave out.

    Args:
        folder_name: the name of a folder under an experiment's folder.
    """
    uuid, dot, rank = folder_name.rpartition('.')
    if not (dot and rank.isdigit()):
        return folder_name
    return uuid if rank == '0' else None


def find_run_folders(experiments: Path) -> List[RunFolder]:
    """
    Every run folder under `experiments` (`<experiment>/<uuid>/` holding a `run.yaml`; rank 0's of a distributed
    run), oldest `run.yaml` first. A folder with no `run.yaml` yet is not (yet) a run; a folder that goes away while
    being listed is left out.

    Args:
        experiments: the project's experiments folder (`experiments_dir`).
    """
    found = []
    for experiment in _subfolders(experiments):
        for folder in _subfolders(experiment):
            uuid = run_uuid_of(folder.name)
            if uuid is None:
                continue
            try:
                mtime = (folder / RUN_FILE).stat().st_mtime
            except OSError:
                continue
            found.append((mtime, RunFolder(folder, uuid)))
    return [run for _, run in sorted(found, key=lambda item: (item[0], str(item[1].path)))]


def _subfolders(path: Path) -> List[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith('.'))
    except OSError:
        return []


# ## The YAML files

def load_yaml_mapping(path: Path, missing_ok: bool = False) -> Optional[Dict[str, Any]]:
    """
    The mapping a run's YAML file holds, or a `RunFileError` naming the file when it is missing, does not parse or
    is not a mapping (labml writes these files whole, so a reader can catch one in mid-write: read it again later).
    Values are data only: `configs.yaml`'s type fields (`<class 'int'>`) are strings, a tuple is a tuple.

    Args:
        path: the file.
        missing_ok: return None for a file that does not exist instead of raising.
    """
    try:
        text = Path(path).read_text(encoding='utf-8')
    except FileNotFoundError as e:
        if missing_ok:
            return None
        raise RunFileError(f'{path}: missing') from e
    except (OSError, UnicodeDecodeError) as e:
        raise RunFileError(f'{path}: not readable ({_first_line(e)})') from e
    try:
        data = yaml.load(text, Loader=_RunYamlLoader)
    except yaml.YAMLError as e:
        raise RunFileError(f'{path}: not valid YAML ({_first_line(e)})') from e
    if not isinstance(data, dict):
        raise RunFileError(f'{path}: holds {type(data).__name__}, not a mapping')
    return data


def trial_time(run_info: Dict[str, Any]) -> Optional[float]:
    """
    The latest start of a run that its `run.yaml` records (labml's `trial_date` and `trial_time`, local time), in
    seconds since the epoch; None where they are not there or not of labml's format.

    Args:
        run_info: the run's `run.yaml`.
    """
    try:
        return time.mktime(time.strptime(f"{run_info['trial_date']} {run_info['trial_time']}", '%Y-%m-%d %H:%M:%S'))
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


# ## The JSON-lines files

@dataclass
class NewLines:
    """What `read_new_lines` read: the complete lines' objects, the offset after the last complete line, and a
    message per complete line that was skipped."""
    records: List[Dict[str, Any]]
    offset: int
    problems: List[str]


def read_new_lines(path: Path, offset: int, check: Callable[[Any], Optional[str]]) -> NewLines:
    """
    The complete lines of the JSON-lines file `path` from byte `offset` on. A last line without its newline is left
    for the next read (the returned offset stops before it). A line that is not JSON, or that `check` refuses (it
    returns why), is skipped and reported, naming the file and the line's byte offset.

    Args:
        path: the file; a missing file reads as empty.
        offset: where the previous read stopped (0: the whole file).
        check: `check(obj)` is None for an object of the file's shape, else why it is not.
    """
    try:
        with open(path, 'rb') as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return NewLines([], offset, [])
    end = data.rfind(b'\n') + 1
    records, problems, position = [], [], offset
    for raw in data[:end].splitlines(keepends=True):
        line = raw.strip()
        if line:
            why = None
            try:
                obj = json.loads(line.decode('utf-8'))
            except (UnicodeDecodeError, ValueError) as e:
                why = f'not JSON ({_first_line(e)})'
            else:
                why = check(obj)
            if why is None:
                records.append(obj)
            else:
                problems.append(f'{path}: the line at byte {position} is skipped: {why}')
        position += len(raw)
    return NewLines(records, offset + end, problems)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_metrics_line(obj: Any) -> Optional[str]:
    """
    None for a line of `log.jsonl` (`{"track": {key: [[step, [value, ...]], ...]}, "time": t}`), else why not.

    Args:
        obj: the line's JSON.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get('track'), dict):
        return 'not an object with a "track" object'
    if 'time' in obj and not _is_number(obj['time']):
        return f'its "time" is {obj["time"]!r}, not a number'
    for key, points in obj['track'].items():
        if not isinstance(points, list):
            return f'the points of {key!r} are not a list'
        for point in points:
            if not (isinstance(point, list) and len(point) == 2 and _is_number(point[0])
                    and isinstance(point[1], list) and all(_is_number(v) for v in point[1])):
                return f'a point of {key!r} is {str(point)[:60]}, not [step, [value, ...]]'
    return None


def check_status_line(obj: Any) -> Optional[str]:
    """
    None for a line of labml's `run_log.jsonl` (`{"status": ..., "rank", "details", "time"}`), else why not.

    Args:
        obj: the line's JSON.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get('status'), str) or not obj['status']:
        return 'not an object with a "status" string'
    if not _is_number(obj.get('time')):
        return f'its "time" is {obj.get("time")!r}, not a number'
    return None


def latest_time(records: Iterable[Dict[str, Any]]) -> Optional[float]:
    """
    The latest `time` of lines that have one, else None.

    Args:
        records: the lines' objects.
    """
    times = [r['time'] for r in records if _is_number(r.get('time'))]
    return max(times) if times else None


# ## Metrics

def merge_metrics(records: Iterable[Dict[str, Any]],
                  series: Optional[Dict[str, Dict[int, float]]] = None) -> Dict[str, Dict[int, float]]:
    """
    The lines of `log.jsonl` merged into `{key: {step: value}}` (see the module): a step's value is the mean of its
    values; a line whose points of a key start at step S first drops that key's steps S and later; of a step written
    twice the one written last wins. Steps with no value are left out; NaN and infinities are kept.

    Args:
        records: the lines' objects, in the file's order (`check_metrics_line` accepted each).
        series: what earlier lines of the file made, merged into in place; None to start from nothing.
    """
    series = {} if series is None else series
    # Each key's highest step so far: a line that starts above it (every line but a resume's first) drops nothing, so
    # the merge is linear in the file, not in its lines times its steps
    highest: Dict[str, float] = {}
    for record in records:
        for key, points in record['track'].items():
            means = [(int(step), sum(values) / len(values)) for step, values in points if values]
            if not means:
                continue
            known = series.setdefault(key, {})
            if key not in highest:
                highest[key] = max(known, default=-math.inf)
            start = min(step for step, _ in means)
            if start <= highest[key]:
                for step in [s for s in known if s >= start]:
                    del known[step]
                highest[key] = -math.inf
            known.update(means)
            highest[key] = max(highest[key], max(step for step, _ in means))
    return series


def read_metrics(path: Union[str, Path]) -> Dict[str, List[Tuple[int, float]]]:
    """
    The metrics of a `log.jsonl` (`path`, or the run folder that holds it): for each key, in key order, `(step,
    value)` in step order (`merge_metrics`). Lines that are not whole or not of the file's shape are left out, as
    the dashboard leaves them out.

    Args:
        path: the file, or its run folder.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    return sorted_metrics(merge_metrics(read_new_lines(path, 0, check_metrics_line).records))


def sorted_metrics(series: Dict[str, Dict[int, float]]) -> Dict[str, List[Tuple[int, float]]]:
    """`merge_metrics`'s series as `read_metrics` gives them: in key order, each `(step, value)` in step order."""
    return {key: sorted(values.items()) for key, values in sorted(series.items())}
