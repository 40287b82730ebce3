"""
# Running a sweep: one process per run, continued where it stopped

A sweep runs an experiment script once per point of its grid, one after another, each as its own process
(`python SCRIPT key=value ...`), so what one run leaves in memory cannot change the next, and the commands can
be handed to any launcher as they are (`--dry-run` prints them). Every run is an ordinary labml run of the
working directory's project, tagged `sweep:<id>` (`run_start.sweep_tags`).

The sweep keeps no state of its own: its runs are found again by their tag and their `overrides.json`. Started
again with the same arguments, it skips the runs that completed, resumes an interrupted one from its last
checkpoint (for a script that takes `resume=`; another starts that point again), and starts the rest. A point whose
run cannot be resumed (killed before its first checkpoint) is started again as a new run, and the comparison lists
each point's newest run alone (`runs_of_points`). Ctrl-C reaches the running script, which saves where it is
(`train_xl.py` saves a checkpoint) before the sweep stops. One process at a time runs a sweep (`lock_sweep`).
"""
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from labml import lab

from ..configs.validation import check_override
from ..errors import closest
from ..file_lock import FileLock
from ..runs.plots import MatplotlibMissingError, plot_runs, require_matplotlib
from ..runs.records import RUNNING, RunRecord, load_runs
from ..runs.tables import comparison_table
from ..train.run_start import SWEEP_ENV, describe_overrides
from ..train.runs import LOCK_FILE, use_working_directory_project


class SweepError(ValueError):
    """A sweep that cannot start: a script or setting it does not accept."""


class SweepInterrupted(RuntimeError):
    """The sweep was stopped; started again with the same arguments, it continues."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def load_script(script: Path):
    """An experiment script imported as a module, with its `SETTINGS` (`settings.Settings`)."""
    if script.is_dir():
        raise SweepError(folder_message(script))
    if not script.is_file():
        raise SweepError(f"script {str(script)!r} does not exist: give the path of an experiment script, e.g. "
                         f"experiments/train_xl.py")
    sys.path.insert(0, str(script.parent.resolve()))
    spec = importlib.util.spec_from_file_location(f'sweep_script_{script.stem}', script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if getattr(module, 'SETTINGS', None) is None:
        raise SweepError(f"{script} has no SETTINGS: a sweep runs the scripts that take key=value settings "
                         f"through labml_txl.cli.run_script (those of experiments/)")
    return module


def scripts_with_settings(folder: Path) -> List[Path]:
    """The `.py` files of `folder` that define `SETTINGS` on a line of their own (read as text, not imported: the
    scripts a sweep can be given, as `load_script` requires), by name."""
    return sorted(path for path in folder.glob('*.py')
                  if re.search(r'^SETTINGS\s*=', path.read_text(errors='replace'), re.MULTILINE))


def folder_message(folder: Path) -> str:
    """What to say of a folder given as the sweep's script: it is one, and the scripts in it that a sweep runs."""
    scripts = scripts_with_settings(folder)
    if not scripts:
        return (f"{folder} is a folder, and none of its .py files has SETTINGS: give the path of an experiment "
                f"script that takes key=value settings, e.g. experiments/train_xl.py")
    example = next((path for path in scripts if path.name == 'train_xl.py'), scripts[0])
    return (f"{folder} is a folder: give one of its scripts, e.g. {example} (those that take key=value settings: "
            f"{', '.join(path.name for path in scripts)})")


def check_points(script: Path, module, points: List[Dict[str, Any]]) -> None:
    """
    Every point's keys, option names and value types, before the first run starts: a `SweepError` naming the first
    wrong one, with the closest setting. A script with a `check_settings(settings)` (`train_xl.py`: the checks its
    training makes before its first step, the model built on the meta device) has every point checked by it too.

    Args:
        script: the script's path, for the messages.
        module: the script imported (`load_script`).
        points: the settings of each run.
    """
    settings = module.SETTINGS
    keys = settings.keys()
    for point in points:
        for key, value in point.items():
            if key == 'resume':
                raise SweepError("resume= is not a sweep setting: a sweep resumes its own interrupted runs when "
                                 "started again with the same arguments")
            if key not in keys:
                raise SweepError(f"{script.name} has no setting {key!r}.{closest(key, keys)} "
                                 f"(`python {script} --help` lists them)")
            if key not in settings.extra:
                try:
                    check_override(settings.configs(), key, value)
                except (LookupError, ValueError, TypeError) as error:
                    raise SweepError(f"{error} (in the sweep's point {describe_overrides(point)})") from error
    check = getattr(module, 'check_settings', None)
    for point in points if check is not None else []:
        try:
            check(point)
        except (LookupError, ValueError, TypeError) as error:
            raise SweepError(f"{error} (in the sweep's point {describe_overrides(point)}: "
                             f"no run was started)") from error


def sweep_id(script: Path, points: List[Dict[str, Any]]) -> str:
    """The same for the same script and grid: `<script>-<8 hex digits of their hash>`."""
    text = json.dumps({'script': script.name, 'points': points}, sort_keys=True, default=str)
    return f'{script.stem}-{hashlib.sha256(text.encode()).hexdigest()[:8]}'


@dataclass
class PlannedRun:
    """One point of a sweep and what is to be done for it."""
    point: Dict[str, Any]
    # The run of this point found in the project, if any
    record: Optional[RunRecord]
    # 'done', 'resume' or 'start'
    action: str

    def describe(self) -> str:
        """The action as a line of the sweep says it; a start that replaces a run of the point names that run."""
        if self.action == 'start' and self.record is not None:
            return (f'start again: its run {self.record.uuid[:8]} ({self.record.status}) cannot be resumed and is '
                    f'left out of the comparison')
        return self.action

    def command(self, script: Path) -> List[str]:
        if self.action == 'resume':
            return [sys.executable, str(script), f'resume={self.record.uuid}']
        return [sys.executable, str(script), *(f'{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}'
                                               for k, v in self.point.items())]


def _overrides_of(record: RunRecord) -> Dict[str, Any]:
    path = record.path / 'overrides.json'
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _matches(point: Dict[str, Any], overrides: Dict[str, Any]) -> bool:
    return all(key in overrides and overrides[key] == value for key, value in point.items())


def plan(script: Path, points: List[Dict[str, Any]], project: Path, sweep: str, resumable: bool) -> List[PlannedRun]:
    """For every point: its run in `project` tagged with `sweep` (the newest where several), and whether it is
    done, to be resumed, or to be started."""
    tagged = load_runs(project, sweep=sweep)
    planned = []
    for point in points:
        found = [r for r in tagged if _matches(point, _overrides_of(r))]
        record = max(found, key=lambda r: r.started) if found else None
        if record is not None and record.status == RUNNING:
            raise SweepError(_run_in_use(record, point))
        if record is not None and record.status == 'completed':
            action = 'done'
        elif record is not None and resumable and any((record.path / 'checkpoints').glob('*/SHA256SUMS')):
            action = 'resume'
        else:
            action = 'start'
        planned.append(PlannedRun(point, record, action))
    return planned


def _run_in_use(record: RunRecord, point: Dict[str, Any]) -> str:
    """The message of a point whose run another process trains (a script that outlived its sweep, killed alone)."""
    holder = FileLock(record.path / LOCK_FILE).holder()
    who = f'process {holder}' if holder else 'another process'
    return (f"run {record.uuid} of the point {describe_overrides(point)} is being trained by {who} (it holds "
            f"{record.path / LOCK_FILE}), not by this sweep: wait for it to end, or stop it, and start the sweep "
            f"again; it resumes the run from its last checkpoint")


def shell_line(command: List[str], sweep: str) -> str:
    """`command` as one line of shell, each argument quoted (`'cutoffs=[10, 20]'` stays one argument), with the
    sweep's tag in its environment as `run_planned` gives it, so a run a launcher starts counts as the sweep's."""
    return f'{SWEEP_ENV}={shlex.quote(sweep)} {shlex.join(command)}'


def summary_line(sweep: str, script: Path, planned: List[PlannedRun]) -> str:
    """`sweep <id>: N runs of SCRIPT (D done, R to resume, S to start)`, the sweep's first line."""
    counts = {action: sum(p.action == action for p in planned) for action in ('done', 'resume', 'start')}
    return (f"sweep {sweep}: {len(planned)} runs of {script} ({counts['done']} done, {counts['resume']} to resume, "
            f"{counts['start']} to start)")


def run_planned(script: Path, planned: List[PlannedRun], sweep: str) -> List[str]:
    """
    Run each planned run not done, one process at a time, tagged with `sweep`. Returns the failures (a line each);
    raises `SweepInterrupted` when the sweep is stopped by SIGINT or SIGTERM, after the running script has
    stopped.
    """
    failures = []
    stopped = []

    def stop(signum, _frame):
        # SIGINT from a terminal reaches the script too (one process group); SIGTERM is passed on to it
        stopped.append(signum)
        if signum == signal.SIGTERM and process is not None:
            process.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    process = None
    try:
        todo = [p for p in planned if p.action != 'done']
        for index, run in enumerate(todo, 1):
            command = run.command(script)
            print(f'\n[sweep {sweep}] run {index} of {len(todo)} ({run.describe()}): '
                  f'{describe_overrides(run.point)}', flush=True)
            process = subprocess.Popen(command, env={**os.environ, SWEEP_ENV: sweep})
            code = process.wait()
            process = None
            if stopped:
                raise SweepInterrupted(f'sweep {sweep} stopped during {describe_overrides(run.point)}; start it again '
                                       f'with the same arguments to continue', 128 + stopped[0])
            if code != 0:
                failures.append(f'{describe_overrides(run.point)}: exit code {code}')
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return failures


# Under the project's experiments folder, beside the runs (`runs plot` writes to `plots/` there)
SWEEPS_FOLDER = 'sweeps'
# In a sweep's folder: held by the process that runs the sweep
SWEEP_LOCK_FILE = 'sweep.lock'


def sweep_folder(sweep: str) -> Path:
    """Where sweep `sweep` keeps its lock, its comparison and its plot: `logs/sweeps/<id>/` of the lab's project."""
    return Path(lab.get_experiments_path()) / SWEEPS_FOLDER / sweep


def lock_sweep(folder: Path, sweep: str) -> FileLock:
    """
    The held lock of sweep `sweep` (`sweep.lock` in its folder `folder`, created if missing), or a `SweepError`
    naming the process that holds it: two processes running one sweep would each train every point not yet done.
    The lock dies with the process that holds it (`labml_txl.file_lock`), so a killed sweep blocks no later start.

    Args:
        folder: the sweep's folder (`sweep_folder`).
        sweep: the sweep's id, for the message.
    """
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / SWEEP_LOCK_FILE)
    if not lock.acquire():
        raise SweepError(_sweep_in_use(sweep, lock))
    return lock


def _sweep_in_use(sweep: str, lock: FileLock) -> str:
    """The message of a sweep whose lock another process holds: who, and how to wait for it or stop it."""
    pid = lock.holder()
    if pid is None:  # (the holder has not written its process id yet)
        who, wait, stop = 'another process', '', ''
    else:
        who, wait = f'process {pid}', f' (tail --pid={pid} -f /dev/null)'
        stop = f' (kill {pid}, or Ctrl-C where it runs)'
    return (f"sweep {sweep} is already being run by {who} (it holds {lock.path}): one process at a time runs a "
            f"sweep; wait for it to end{wait}, or stop it{stop}: its running script saves where it is, and this "
            f"command started again continues the sweep")


def runs_of_points(planned: List[PlannedRun]) -> List[RunRecord]:
    """Each point's run as `plan` found it (the newest of the sweep's runs of the point), in the points' order: a
    run that a later start of its point replaced (killed before its first checkpoint) keeps its tag, and is left
    out."""
    return [p.record for p in planned if p.record is not None]


def write_comparison(records: List[RunRecord], out: Path, metric: str) -> None:
    """Print the comparison of `records` and write it to `out` (`comparison.md`) with a plot of `metric`."""
    out.mkdir(parents=True, exist_ok=True)
    table = comparison_table(records)
    (out / 'comparison.md').write_text(table + '\n')
    print(f'\n{table}\n')
    plot_path = out / f"{metric.replace('.', '_')}.png"
    plot_runs(records, [metric], plot_path)
    print(f'Written to {out / "comparison.md"} and {plot_path}')


@dataclass
class SweepResult:
    """What a sweep ended with: its runs (one per point, completed or not), where its comparison lies, and its exit
    code."""
    sweep: str
    records: List[RunRecord]
    out: Optional[Path]
    exit_code: int


def run_sweep(script: Path, points: List[Dict[str, Any]], metric: str = 'loss.valid',
              dry_run: bool = False) -> SweepResult:
    """
    Run `script` once per point (continuing the sweep where it stopped), then print the comparison of its runs (one
    per point) and write it with a plot of `metric` to `logs/sweeps/<id>/` in the working directory's labml project.
    One process at a time runs a sweep (`lock_sweep`); a dry run takes no lock, as it runs nothing.

    Args:
        script: an experiment script that takes `key=value` settings (`experiments/train_xl.py`).
        points: the settings of each run; every point is checked before the first run starts.
        metric: the metric plotted.
        dry_run: print the command of every run still to do as a line of shell (`shell_line`), and run nothing.

    Errors (a sweep another process runs among them) are printed as `error: ...` with exit code 2; an interruption
    with 128 + the signal's number.
    """
    with contextlib.ExitStack() as held:
        try:
            if not dry_run:
                require_matplotlib()  # for the plot at the end: found missing there, every run would be done for it
            module = load_script(script)
            check_points(script, module, points)
            resumable = 'resume' in module.SETTINGS.keys()
            use_working_directory_project()
            project = Path(lab.get_path())
            sweep = sweep_id(script, points)
            out = sweep_folder(sweep)
            if not dry_run:
                held.enter_context(lock_sweep(out, sweep))
            planned = plan(script, points, project, sweep, resumable)
        except (SweepError, ValueError, LookupError, MatplotlibMissingError) as error:
            print(f'error: {error}', file=sys.stderr)
            return SweepResult('', [], None, 2)
        print(summary_line(sweep, script, planned), flush=True)
        if dry_run:
            for p in planned:
                if p.action != 'done':
                    print(shell_line(p.command(script), sweep))
            return SweepResult(sweep, [], None, 0)
        try:
            failures = run_planned(script, planned, sweep)
        except SweepInterrupted as stopped:
            print(f'\n{stopped}', file=sys.stderr)
            return SweepResult(sweep, [], None, stopped.exit_code)
        records = runs_of_points(plan(script, points, project, sweep, resumable))
        if len(records) < len(points):  # a script that keeps no overrides.json: its runs are found by tag alone
            records = load_runs(project, sweep=sweep)
        write_comparison(records, out, metric)
    for failure in failures:
        print(f'failed: {failure}', file=sys.stderr)
    return SweepResult(sweep, records, out, 1 if failures else 0)
