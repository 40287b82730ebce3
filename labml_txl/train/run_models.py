"""
# The models of a labml run: registered, saved into its checkpoints, loaded from another run's

labml up to 0.4 kept a run's models itself: `experiment.add_pytorch_models({'model': model})` registered them,
`experiment.save_checkpoint()` wrote their parameters into the run's folder, `checkpoints/<global step>/`, and
`experiment.load(run_uuid, checkpoint)` made the next `experiment.start()` load them from another run's checkpoint
(its newest, or the given step) and count the steps on from there. labml 0.5 dropped all three. The functions here
do the same with this package's checkpoints (`checkpoint.py`: safetensors, JSON and SHA-256 sums, nothing that
runs code when loaded), whose state is `{'models': {name: state_dict}}`. `labml_txl.compat` puts them on
`labml.experiment`; importing this module changes nothing outside it.

Where they differ from labml 0.4:

- Bad input is an exception, before the run starts: an unknown run UUID or step, a registered model that the
  checkpoint lacks or holds with other shapes, a name or a module registered twice. (labml 0.4 printed a notice and
  went on with untrained weights.)
- Models may also be registered after `start()`; with a checkpoint to load, they are loaded as they are registered.
- `with experiment.start():` saves the registered models when the block completes. labml_helpers' training loop
  did that (its `is_save_models`); the loop that labml_nn 0.5.1 ships does not, so without it labml_nn's scripts
  would never save. A block left by an exception saves nothing: its models may be half way through a step.
- A load belongs to the experiment it was asked for: a new `experiment.create()` or `evaluate()` forgets it, as it
  forgets the registered models.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import torch
from labml import tracker
from labml.internal.experiment import experiment_singleton, has_experiment
from torch import nn

from .checkpoint import CheckpointError, checkpoint_steps, load_model_state, read_checkpoint
from .checkpoint import save_checkpoint as write_checkpoint
from .runs import find_run, latest_checkpoint_of_run

# The key of the checkpoint's state that holds the models' state dicts, by registered name
MODELS_KEY = 'models'
# What labml 0.4 took for "the newest checkpoint"
LATEST = -1


@dataclass
class CheckpointToLoad:
    """The models' state dicts of one checkpoint of a run, read and verified, waiting to be loaded."""
    run_uuid: str
    step: int
    folder: Path
    models: Dict[str, Dict[str, torch.Tensor]]


class RunModels:
    """What one labml experiment registered (`models`, by name), the checkpoint it is to load (`to_load`), and the
    step of its latest save."""

    def __init__(self, experiment):
        self.experiment = experiment
        self.models: Dict[str, nn.Module] = {}
        self.to_load: Optional[CheckpointToLoad] = None
        self.saved_step: Optional[int] = None


_current: Optional[RunModels] = None


def current_run_models() -> RunModels:
    """The `RunModels` of labml's current experiment (a new, empty one for a new experiment), or a `RuntimeError`
    when no experiment was created."""
    global _current
    if not has_experiment():
        raise RuntimeError("there is no labml experiment yet: call experiment.create(name=...) (or "
                           "experiment.evaluate()) before registering, saving or loading models")
    experiment = experiment_singleton()
    if _current is None or _current.experiment is not experiment:
        _current = RunModels(experiment)
    return _current


def add_pytorch_models(models: Optional[Dict[str, nn.Module]] = None, /, **named_models: nn.Module) -> None:
    """
    Register models with the current run: `save_checkpoint` saves them, and `load` loads them (at `start()`, or at
    once when registered after it).

    Args:
        models: `{name: module}`, as labml_nn calls it (`add_pytorch_models({'model': conf.model})`)
        named_models: the same as keywords (`add_pytorch_models(model=model)`)
    """
    if models is not None and named_models:
        raise TypeError("add_pytorch_models takes a dictionary {name: module} or name=module keywords, not both")
    if models is None:
        models = named_models
    if not isinstance(models, dict):
        raise TypeError(f"add_pytorch_models({models!r}) is not accepted: give a dictionary {{name: module}} or "
                        f"name=module keywords")
    if not models:
        raise ValueError("add_pytorch_models() got no models: give {name: module} or name=module")
    run = current_run_models()
    registered = dict(run.models)
    for name, model in models.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"model name {name!r} is not accepted: a model's name must be a non-empty string")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model {name!r} is a {type(model).__name__}: add_pytorch_models takes torch.nn.Module "
                            f"instances")
        if name in registered:
            raise ValueError(f"a model named {name!r} is already registered with this run: each name is registered "
                             f"once (registered: {sorted(registered)})")
        same = [other for other, known in registered.items() if known is model]
        if same:
            raise ValueError(f"model {name!r} is the module already registered as {same[0]!r}: each module is "
                             f"registered once")
        registered[name] = model
    if run.experiment.is_started and run.to_load is not None:
        _load_into(run.to_load, models)
    run.models = registered


def save_checkpoint() -> Optional[Path]:
    """
    Save the registered models' state dicts into the run's `checkpoints/<global step>/` (every checkpoint is kept,
    as labml 0.4 kept them) and return that folder. Does nothing, and returns `None`, in an `experiment.evaluate()`
    session (which records nothing) and on a distributed rank other than the main one.
    """
    run = current_run_models()
    if not run.experiment.is_started:
        raise RuntimeError("experiment.save_checkpoint() was called outside a started run: call it between "
                           "experiment.start() and the end of its `with` block")
    return _save(run)


def _save(run: RunModels) -> Optional[Path]:
    experiment = run.experiment
    if experiment.is_evaluate or experiment.run.distributed_rank != experiment.run.distributed_main_rank:
        return None
    if not run.models:
        raise RuntimeError("there are no models to save: register them first, with "
                           "experiment.add_pytorch_models({'model': model})")
    step = tracker.get_global_step()
    state = {MODELS_KEY: {name: model.state_dict() for name, model in run.models.items()}}
    folder = write_checkpoint(Path(experiment.run.checkpoint_path), step, state, keep=None)
    run.saved_step = step
    return folder


def load(run_uuid: Optional[str], checkpoint: Optional[int] = None) -> None:
    """
    Make the next `start()` load the registered models from a checkpoint of run `run_uuid` and count the global
    steps on from its step. The checkpoint is found, read and verified now: a mistake is reported here.

    Args:
        run_uuid: the UUID of a run of this labml project (its folder under `logs/<experiment>/`); `None` loads
            nothing (and forgets an earlier `load`)
        checkpoint: the global step of the checkpoint; `None` or `-1` for the newest that verifies
    """
    run = current_run_models()
    if run_uuid is None:
        if checkpoint is not None:
            raise ValueError(f"load(None, checkpoint={checkpoint!r}) is not accepted: a checkpoint needs the UUID of "
                             f"its run")
        run.to_load = None
        return
    if not isinstance(run_uuid, str) or not run_uuid.strip():
        raise TypeError(f"run_uuid={run_uuid!r} is not accepted: give the UUID of a run, as its folder under "
                        f"logs/<experiment>/ is named, or None")
    if checkpoint is not None and (isinstance(checkpoint, bool) or not isinstance(checkpoint, int)
                                   or checkpoint < LATEST):
        raise ValueError(f"checkpoint={checkpoint!r} is not accepted: give the global step of a checkpoint, or "
                         f"None (or -1) for the newest")
    if run.experiment.is_started:
        raise RuntimeError("experiment.load() was called after experiment.start(): call it before start(), which "
                           "loads the models")
    run_uuid = run_uuid.strip()
    directory = find_run(run_uuid, where="runs are looked for in labml's current project, the one its "
                                         "experiment.create() chose") / 'checkpoints'
    if checkpoint is None or checkpoint == LATEST:
        step, state = latest_checkpoint_of_run(directory, run_uuid)
    else:
        steps = checkpoint_steps(directory)
        if checkpoint not in steps:
            raise CheckpointError(f"run {run_uuid} has no checkpoint of step {checkpoint} in {directory}: its "
                                  f"checkpoints are of steps {steps}")
        step, state = checkpoint, read_checkpoint(directory / str(checkpoint))
    folder = directory / str(step)
    if not isinstance(state, dict) or not isinstance(state.get(MODELS_KEY), dict):
        held = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {folder} holds no models saved by experiment.save_checkpoint() (it "
                              f"holds {held}); a checkpoint of experiments/train_xl.py loads with "
                              f"labml_txl.train.runs.load_trained_run")
    run.to_load = CheckpointToLoad(run_uuid, step, folder, state[MODELS_KEY])


def _load_into(checkpoint: CheckpointToLoad, models: Dict[str, nn.Module]) -> None:
    """Load each of `models` from `checkpoint`, or raise a `CheckpointError` naming the model it lacks or the first
    tensor of another shape."""
    missing = sorted(set(models) - set(checkpoint.models))
    if missing:
        raise CheckpointError(f"checkpoint {checkpoint.folder} of run {checkpoint.run_uuid} has no model named "
                              f"{missing[0]!r}: it holds {sorted(checkpoint.models)}")
    for name, model in models.items():
        load_model_state(model, checkpoint.models[name], f"{checkpoint.folder} (model {name!r})")


def start(global_step: int = 0):
    """
    labml's `experiment.start()`, first loading the registered models from the checkpoint `load` chose (the run
    then starts at that checkpoint's step, and `run.yaml` names the run it was loaded from). Used as
    `with start():`, it saves the registered models when the block completes.

    Args:
        global_step: the step to start counting from, when no checkpoint is loaded
    """
    run = current_run_models()
    if run.to_load is not None:
        _load_into(run.to_load, run.models)
        run.experiment.run.load_run = run.to_load.run_uuid
        global_step = run.to_load.step
    return SaveOnCompletion(run, run.experiment.start(global_step=global_step))


class SaveOnCompletion:
    """labml's context manager of a started run, which saves the registered models first when the block
    completes without an exception (and the last save was not of this same step)."""

    def __init__(self, run: RunModels, watcher):
        self.run = run
        self.watcher = watcher

    def __enter__(self):
        self.watcher.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if exc_type is None and self.run.models and self.run.saved_step != tracker.get_global_step():
            try:
                _save(self.run)
            except BaseException as error:
                self.watcher.__exit__(type(error), error, error.__traceback__)
                raise
        return self.watcher.__exit__(exc_type, exc_value, traceback)
