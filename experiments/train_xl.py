"""
Train Transformer-XL on a corpus, on labml.

    python experiments/train_xl.py [key=value ...]
    python experiments/train_xl.py resume=RUN_UUID [key=value ...]

Every item of `TrainXLConfigs` (and so of `TransformerXLConfigs`) is a key: for example
`preset=enwik8_base corpus_name=enwik8 data_path=data/enwik8.zip mem_len=256`, or for the bundled corpus
`n_layer=4 d_model=256 max_step=2000`. `resume=RUN_UUID` continues a run from its last checkpoint, exactly as if
it had never stopped (further key=value pairs change that run's configs, e.g. a larger `max_step`).
The settings are listed below and in `docs/options.md`; `docs/experiments.md` explains the workflow.

Distributed data-parallel: `torchrun --nproc_per_node 2 experiments/train_xl.py [key=value ...]` (gloo on the
CPU, NCCL on CUDA); each process trains on its share of every batch's columns.
"""
import contextlib
import sys
from typing import Any, Callable, Dict, List, Optional

import torch
from labml import experiment, logger
from labml.internal.experiment import experiment_singleton

from labml_txl.cli import parse_overrides, run_script
from labml_txl.configs.settings import Settings
from labml_txl.train.configs import TrainXLConfigs, check_training_configs, device_of_name
from labml_txl.train.distributed import run_in_environment
from labml_txl.train.extensions import import_extensions
from labml_txl.train.checkpoint import RunFileSystemError
from labml_txl.train.interruption import TrainingInterrupted
from labml_txl.train.run_start import create_run, differing_overrides, next_commands, script_path, started_run
from labml_txl.train.runs import (check_run_uuid, find_run, latest_checkpoint_of_run, load_overrides, lock_run,
                                  remove_labml_pid, save_overrides, use_working_directory_project)
from labml_txl.train.trainer import Trainer, quality

SETTINGS = Settings(TrainXLConfigs, extra={'resume': ('str', None, 'the UUID of a run to continue from its last '
                                                                   'checkpoint (other settings change it)')})


def train(overrides: Dict[str, Any], resume: Optional[str] = None, name: str = 'train_xl', screen: bool = True,
          after_training: Optional[Callable[[Trainer], None]] = None,
          script_defaults: Optional[Dict[str, Any]] = None) -> Trainer:
    """
    Train (or resume run `resume`) with `overrides`; returns the trainer after the run. `after_training(trainer)`, if
    given, runs inside the run when training has ended, so what it tracks (more evaluations) is the run's too.
    `screen=False` keeps the tracked values off the console; they are kept in the run's `log.jsonl` either way
    (`run_start`). `script_defaults`: a calling script's own defaults among `overrides` (the demo's model), left out
    of the run's comment where unchanged.

    Nothing is written before the configs are checked: their types and values, the model built, and on a resume
    the checkpoint's tensors against the model's shapes; a failed resume leaves the run as it was. A run is trained
    by one process at a time (`runs.lock_run`). On SIGINT or SIGTERM it saves the step it is at and raises
    `TrainingInterrupted`, which says how to resume. Under `torchrun`, every process calls this; rank 0 writes the
    checkpoints and reports to labml, and every process leaves the process group when its run ends.
    """
    use_working_directory_project()
    run_path = None
    if resume is None:
        import_extensions(overrides)
    else:
        resume = check_run_uuid(resume)
        run_path = find_run(resume)
        saved = load_overrides(run_path)
        # (the run's own modules first: their settings are items of the configs the checks build)
        import_extensions({**saved, **overrides})
        _check_resumed_settings(resume, saved, overrides)
        overrides = {**saved, **overrides}
        name = run_path.parent.name
    device = device_of_name(overrides.get('device', 'auto'))
    with run_in_environment(device) as distributed, contextlib.ExitStack() as held:
        if distributed is None:
            run_uuid, labml_rank = resume, {}
        else:
            # One run UUID for all ranks, chosen by rank 0; labml is told each process's rank
            run_uuid = distributed.broadcast(resume or experiment.generate_uuid())
            labml_rank = {'distributed_rank': distributed.rank, 'distributed_world_size': distributed.world_size}
            if device.type == 'cuda':
                device = torch.device('cuda', distributed.local_rank)
            if not distributed.is_main:
                screen = False
        is_main = distributed is None or distributed.is_main
        if resume is not None:
            if is_main:
                held.enter_context(lock_run(run_path, resume))
            rank_folder = run_path.name if distributed is None else f'{resume}.{distributed.rank}'
            remove_labml_pid(run_path.parent / rank_folder)
        conf = TrainXLConfigs()
        create_run(name, conf, overrides, uuid=run_uuid, screen=screen, script=__file__,
                   script_defaults=script_defaults, **labml_rank)
        run = experiment_singleton().run
        # The run's first folder holds the overrides and the checkpoints: rank 0's of a distributed run, wherever
        # it is resumed from, with any number of processes
        if run_path is not None:
            main_path = run_path
        else:
            main_path = run.run_path if distributed is None else run.experiment_path / f'{run.uuid}.0'
        checkpoint_dir = main_path / 'checkpoints'
        trainer = Trainer(conf, checkpoint_dir=checkpoint_dir, distributed=distributed, device=device)
        if resume is not None:
            step, state = latest_checkpoint_of_run(checkpoint_dir, resume)
            trainer.load_state_dict(state, source=str(checkpoint_dir / str(step)))
            logger.log(f'Resuming run {resume} from step {step}')
        if is_main:
            if resume is None:
                held.enter_context(lock_run(main_path, run.uuid))
            save_overrides(main_path, overrides)
        resume_command = f'python {script_path(__file__)} resume={run.uuid}'
        try:
            with started_run(global_step=trainer.step, keep_metrics=is_main):
                try:
                    valid = trainer.run()
                    if after_training is not None:
                        after_training(trainer)
                except TrainingInterrupted as stopped:
                    stopped.resume_command = resume_command
                    experiment_singleton().finish('interrupted', str(stopped))
                    raise
        except OSError as error:  # (a full disk while log.jsonl is written: the file, and where to resume from)
            raise RunFileSystemError(error, checkpoint_dir, resume_command) from error
    if valid is not None:
        measure = ', '.join(f'{k} {v:.3f}' for k, v in quality(valid, conf.corpus.level).items())
        logger.log(f'Validation after {trainer.step} steps: loss {valid:.4f}, {measure}')
    if is_main:
        print('\n'.join(next_commands(run.uuid, main_path, script_path(__file__))))
    return trainer


def check_settings(overrides: Dict[str, Any]) -> None:
    """
    The checks a training makes before its first step, without training or writing anything: the configs' keys,
    options and types, the settings that are only wrong together (`check_training_configs`), and the model's
    constructor, run on the meta device (shapes only: no memory, no weights). A sweep calls it for every point before
    its first run, so a point that cannot train is found before any other trains.
    """
    import_extensions(overrides)
    conf = TrainXLConfigs()
    experiment.evaluate()
    experiment.configs(conf, overrides)
    check_training_configs(conf)
    conf.n_token  # (the corpus read, on the CPU)
    with torch.device('meta'):
        conf.model


# What a resume restores from the checkpoint, whatever the configs say: the optimizer's state (its kind, and the
# learning rate and momentum of its parameter groups) and the schedule's (its kind, its base learning rate, and
# `dev_perf`'s factor and floor). `max_step`, `warmup_step`, `eta_min`, `clip` and the rest are read from the configs.
RESTORED_ON_RESUME = ('optimizer', 'lr', 'mom', 'scheduler', 'decay_rate', 'lr_min')


def _check_resumed_settings(run_uuid: str, saved: Dict[str, Any], given: Dict[str, Any]) -> None:
    """A `ValueError` naming the settings given with `resume=` that the checkpoint's state would silently override
    (they would be recorded in `overrides.json` and have no effect)."""
    restored = {key: value for key, value in given.items() if key in RESTORED_ON_RESUME}
    changed = differing_overrides(TrainXLConfigs(), restored, script_defaults=saved)
    if changed:
        settings = ' '.join(f'{key}={value}' for key, value in changed.items())
        raise ValueError(f"{settings}: not accepted with resume=, because run {run_uuid} resumes its optimizer and "
                         f"learning-rate schedule from its checkpoint ({', '.join(RESTORED_ON_RESUME)} are part of "
                         f"their state), so the new value would have no effect; start a new run to train with it "
                         f"(max_step, warmup_step, eta_min, clip and the other settings do apply to a resume)")


def main(argv: List[str]) -> int:
    def action(args: List[str]):
        overrides = parse_overrides(args, SETTINGS)
        use_working_directory_project()
        # `resume=None` or `resume=` is a mistake, not a new run
        resume = check_run_uuid(overrides.pop('resume')) if 'resume' in overrides else None
        train(overrides, resume=resume)

    return run_script(action, argv, __doc__, settings=SETTINGS)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
