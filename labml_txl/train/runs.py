"""
# Runs: where a training run keeps its overrides and checkpoints, and how to find it again

A run is a labml run folder (`logs/<experiment name>/<run uuid>/`). Beside labml's own files it holds
`overrides.json` (the overrides it was started with, so a resume rebuilds the same configs) and `checkpoints/`.
"""
import json
import os
from pathlib import Path
from typing import Any, Dict

from labml import experiment, lab

from .checkpoint import CheckpointError, load_latest_checkpoint, load_model_state

OVERRIDES_FILE = 'overrides.json'


class RunNotFoundError(LookupError):
    """No run with the given UUID."""

    def __str__(self):
        return str(self.args[0])


def find_run(run_uuid: str) -> Path:
    """
    The folder of run `run_uuid` under the lab's experiments (rank 0's, `<uuid>.0`, for a distributed run), or a
    `RunNotFoundError` naming where it looked.
    """
    experiments = Path(lab.get_experiments_path())
    if experiments.exists():
        for experiment_path in experiments.iterdir():
            for folder in (run_uuid, f'{run_uuid}.0'):
                if (experiment_path / folder).is_dir():
                    return experiment_path / folder
    known = sorted(p.name for e in experiments.iterdir() if e.is_dir() for p in e.iterdir()) \
        if experiments.exists() else []
    hint = f" Runs there: {', '.join(known[-5:])}" if known else ' There are no runs there.'
    raise RunNotFoundError(f"run UUID {run_uuid!r} does not exist under {experiments}.{hint}")


def save_overrides(run_path: Path, overrides: Dict[str, Any]) -> None:
    run_path.mkdir(parents=True, exist_ok=True)
    (run_path / OVERRIDES_FILE).write_text(json.dumps(overrides, indent=2, sort_keys=True))


def load_overrides(run_path: Path) -> Dict[str, Any]:
    path = run_path / OVERRIDES_FILE
    if not path.exists():
        raise RunNotFoundError(f"run {run_path} has no {OVERRIDES_FILE}: it was not started by train_xl.py")
    return json.loads(path.read_text())


def clear_stale_pid(run_path: Path) -> None:
    """Remove `run.pid` left by a killed process, so labml can start the run again; a live one is an error."""
    pid_file = run_path / 'run.pid'
    if not pid_file.exists():
        return
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        pid_file.unlink()
        return
    except PermissionError:
        pass
    raise RuntimeError(f"run {run_path.name} is still running (process {pid_file.read_text().strip()}); "
                       f"stop it before resuming")


def latest_checkpoint_of_run(checkpoint_dir: Path, run_uuid: str):
    """`(step, state)` of the newest readable checkpoint of run `run_uuid`, or a `CheckpointError` saying it has
    none."""
    latest = load_latest_checkpoint(checkpoint_dir)
    if latest is None:
        raise CheckpointError(f"run {run_uuid} has no checkpoint in {checkpoint_dir}")
    return latest


def load_trained_run(run_uuid: str, overrides: Dict[str, Any] = None):
    """
    The configs and the model of run `run_uuid`, with the weights of its newest readable checkpoint, for
    evaluation and sampling. `overrides` change configs that do not change the model's shape (lengths, say).

    Returns `(conf, step)`: `conf.model` holds the trained weights, in eval mode.
    """
    from .configs import TrainXLConfigs
    run_path = find_run(run_uuid)
    conf = TrainXLConfigs()
    experiment.evaluate()
    experiment.configs(conf, {**load_overrides(run_path), **(overrides or {})})
    step, state = latest_checkpoint_of_run(run_path / 'checkpoints', run_uuid)
    load_model_state(conf.model, state['model'], str(run_path / 'checkpoints' / str(step)))
    conf.model.eval()
    return conf, step
