"""
# Runs: where a training run keeps its overrides and checkpoints, and how to find it again

A run is a labml run folder (`logs/<experiment name>/<run uuid>/`) of the labml project of the working directory
(the nearest `.labml.yaml` above it, else the working directory itself). Beside labml's own files it holds
`overrides.json` (the overrides it was started with, so a resume rebuilds the same configs), `checkpoints/`, and
while a process trains it, that process's lock `train.lock` (`labml_txl.file_lock`): one writer per run.
"""
import json
import sys
from pathlib import Path
from typing import Any, Dict

from labml import experiment, lab

from ..file_lock import FileLock
from ..json_file import read_json_object

OVERRIDES_FILE = 'overrides.json'
LOCK_FILE = 'train.lock'
# labml's project file
PROJECT_FILE = '.labml.yaml'


class RunNotFoundError(LookupError):
    """No run with the given UUID."""

    def __str__(self):
        return str(self.args[0])


class RunInUseError(RuntimeError):
    """Another process is training the run."""


def project_root(cwd: Path) -> Path:
    """
    The labml project of the folder `cwd`: the nearest folder above it (itself included) with a `.labml.yaml`, else
    `cwd` itself. Reads nothing and configures nothing (the dashboard calls it to find the runs it follows).

    Args:
        cwd: a working directory, absolute.
    """
    cwd = Path(cwd)
    return next((folder for folder in (cwd, *cwd.parents) if (folder / PROJECT_FILE).is_file()), cwd)


def use_working_directory_project() -> None:
    """
    Runs are created and found in the labml project of the working directory: the nearest folder above it with a
    `.labml.yaml` (whose settings apply), else the working directory itself. labml would otherwise take the project
    of the file that called it, which for a user's script elsewhere is this package's, or none where it is
    installed. A program that chose labml's project itself (`lab.configure({'path': ...})`) keeps its choice, and
    the first call in a process decides.
    """
    from labml.internal import util
    from labml.internal.lab import lab_singleton
    lab_ = lab_singleton()
    if any('path' in configs for configs in lab_.custom_configs):
        return
    root = project_root(Path.cwd())
    settings = util.yaml_load((root / PROJECT_FILE).read_text()) if (root / PROJECT_FILE).is_file() else None
    lab_.set_configurations({**(settings or {}), 'path': str(root)})


def check_run_uuid(run_uuid: Any) -> str:
    """`run_uuid` as a string, or a `ValueError` unless it is a non-empty UUID (not `None`, not `''`, not a path: a
    path was once joined to the experiments folder as it was, so a run of another project was trained and its
    `run.yaml` given the path for its UUID)."""
    if isinstance(run_uuid, int) and not isinstance(run_uuid, bool):
        run_uuid = str(run_uuid)
    experiments = Path(lab.get_experiments_path())
    if not isinstance(run_uuid, str) or not run_uuid.strip():
        raise ValueError(f"resume={run_uuid!r} is not accepted: give the UUID of the run to continue, "
                         f"as its folder under {experiments} is named{_known_runs(experiments)}")
    run_uuid = run_uuid.strip()
    if '/' in run_uuid or '\\' in run_uuid or run_uuid in ('.', '..'):
        folder = Path(run_uuid).expanduser().resolve()
        raise ValueError(f"resume={run_uuid!r} is not accepted: it is a path, and a run is named by its UUID, the "
                         f"name of its folder ({folder.name}), in the labml project of the working directory (runs "
                         f"are looked for under {experiments}); for a run of another project, run the command in "
                         f"that project's folder ({project_root(folder.parent)}) with resume={folder.name}")
    return run_uuid


def _known_runs(experiments: Path) -> str:
    known = sorted(p.name for e in experiments.iterdir() if e.is_dir() for p in e.iterdir()
                   if (p / 'run.yaml').is_file()) \
        if experiments.is_dir() else []
    return f" (runs there: {', '.join(known[-5:])})" if known else ' (there are no runs there)'


def lock_run(run_path: Path, run_uuid: str) -> FileLock:
    """The held lock of the run folder `run_path`, or a `RunInUseError` naming the process that trains it."""
    run_path.mkdir(parents=True, exist_ok=True)
    lock = FileLock(run_path / LOCK_FILE)
    if not lock.acquire():
        raise RunInUseError(f"run {run_uuid} is being trained by process {lock.holder() or 'unknown'} (it holds "
                            f"{lock.path}): one process at a time trains a run; stop that one or wait for it")
    return lock


def find_run(run_uuid: str,
             where: str = 'runs are looked for in the labml project of the working directory') -> Path:
    """
    The folder of run `run_uuid` under the lab's experiments (rank 0's, `<uuid>.0`, for a distributed run), or a
    `RunNotFoundError` naming where it looked and, in `where`, how that project was chosen.
    """
    experiments = Path(lab.get_experiments_path())
    if experiments.exists():
        for experiment_path in experiments.iterdir():
            for folder in (run_uuid, f'{run_uuid}.0'):
                if (experiment_path / folder).is_dir():
                    return experiment_path / folder
    raise RunNotFoundError(f"run UUID {run_uuid!r} does not exist under {experiments}{_known_runs(experiments)}; "
                           f"{where}")


def save_overrides(run_path: Path, overrides: Dict[str, Any]) -> None:
    run_path.mkdir(parents=True, exist_ok=True)
    # (in the order given: a resumed run's comment lists them as the first start did)
    (run_path / OVERRIDES_FILE).write_text(json.dumps(overrides, indent=2))


def load_overrides(run_path: Path) -> Dict[str, Any]:
    """
    The overrides a run was started with (its `overrides.json`), or an error naming the file: a `RunNotFoundError`
    when it is not there, a `ValueError` when it is not a JSON object of settings (damaged, or edited by hand), so
    that a resume or an evaluation stops with the file to look at, not with the JSON parser's position alone.
    """
    path = run_path / OVERRIDES_FILE
    if not path.exists():
        raise RunNotFoundError(f"run {run_path} has no {OVERRIDES_FILE}: it was not started by train_xl.py")
    return read_json_object(path, 'the JSON object of settings train_xl.py writes (e.g. {"d_model": 128}); correct '
                                  'the file, or start a new run')


def remove_labml_pid(run_path: Path) -> None:
    """Remove labml's `run.pid` from a run folder, so labml can start the run again: labml writes it at every start,
    never removes it, and refuses to start a run that has one. Who trains a run is the run's lock (`lock_run`),
    so the file is stale wherever a resume gets that far."""
    (run_path / 'run.pid').unlink(missing_ok=True)


def latest_checkpoint_of_run(checkpoint_dir: Path, run_uuid: str):
    """`(step, state)` of the newest readable checkpoint of run `run_uuid`, or a `CheckpointError` saying it has
    none."""
    from .checkpoint import CheckpointError, load_latest_checkpoint  # torch: not for the readers of run folders
    latest = load_latest_checkpoint(checkpoint_dir)
    if latest is None:
        raise CheckpointError(f"run {run_uuid} has no checkpoint in {checkpoint_dir}")
    return latest


def _say_nothing_is_reported_live() -> None:
    """One line where a dashboard's address is set (`docs/dashboard.md`): an evaluation makes no run, so it reports
    nothing to it, rather than ignoring the setting in silence."""
    from labml.internal.lab import lab_singleton
    if lab_singleton().app_configs is not None:
        print("note: a dashboard's address is set (labml_app_url, or app_url of .labml.yaml), but evaluation and "
              "sampling make no labml run, so nothing of this is reported to it", file=sys.stderr)


def load_trained_run(run_uuid: str, overrides: Dict[str, Any] = None):
    """
    The configs and the model of run `run_uuid`, with the weights of its newest readable checkpoint, for
    evaluation and sampling. `overrides` change configs that do not change the model's shape (lengths, say).

    Returns `(conf, step)`: `conf.model` holds the trained weights, in eval mode.
    """
    from .checkpoint import load_model_state
    from .configs import TrainXLConfigs
    from .extensions import import_extensions
    use_working_directory_project()
    run_path = find_run(check_run_uuid(run_uuid))
    overrides = {**load_overrides(run_path), **(overrides or {})}
    # The run's own modules (a memory mechanism of its own), whose settings are items of the configs
    import_extensions(overrides)
    conf = TrainXLConfigs()
    experiment.evaluate()
    _say_nothing_is_reported_live()
    experiment.configs(conf, overrides)
    step, state = latest_checkpoint_of_run(run_path / 'checkpoints', run_uuid)
    load_model_state(conf.model, state['model'], str(run_path / 'checkpoints' / str(step)))
    conf.model.eval()
    return conf, step
