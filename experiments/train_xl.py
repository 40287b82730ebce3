"""
Train Transformer-XL on a corpus, on labml.

    python experiments/train_xl.py [key=value ...]
    python experiments/train_xl.py resume=RUN_UUID [key=value ...]

Every item of `TrainXLConfigs` (and so of `TransformerXLConfigs`) is a key: for example
`preset=enwik8_base corpus_name=enwik8 data_path=data/enwik8.zip mem_len=256`, or for the bundled corpus
`n_layer=4 d_model=256 max_step=2000`. `resume=RUN_UUID` continues a run from its last checkpoint, exactly as if
it had never stopped (further key=value pairs change that run's configs, e.g. a larger `max_step`).
`docs/options.md` lists every key; `docs/training.md` explains the workflow.
"""
import sys
from typing import Any, Dict, List, Optional

from labml import experiment, logger
from labml.internal.experiment import experiment_singleton

from labml_txl.cli import parse_overrides, run_script
from labml_txl.train.checkpoint import CheckpointError, load_latest_checkpoint
from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.runs import clear_stale_pid, find_run, load_overrides, save_overrides
from labml_txl.train.trainer import Trainer, quality


def train(overrides: Dict[str, Any], resume: Optional[str] = None, name: str = 'train_xl',
          writers=None) -> Trainer:
    """Train (or resume run `resume`) with `overrides`; returns the trainer after the run."""
    if resume is not None:
        run_path = find_run(resume)
        overrides = {**load_overrides(run_path), **overrides}
        clear_stale_pid(run_path)
        name = run_path.parent.name
    conf = TrainXLConfigs()
    experiment.create(name=name, uuid=resume, writers=writers)
    experiment.configs(conf, overrides)
    run = experiment_singleton().run
    save_overrides(run.run_path, overrides)
    trainer = Trainer(conf, checkpoint_dir=run.checkpoint_path)
    if resume is not None:
        latest = load_latest_checkpoint(run.checkpoint_path)
        if latest is None:
            raise CheckpointError(f"run {resume} has no checkpoint in {run.checkpoint_path} to resume from")
        step, state = latest
        trainer.load_state_dict(state, source=str(run.checkpoint_path / str(step)))
        logger.log(f'Resuming run {resume} from step {step}')
    with experiment.start(global_step=trainer.step):
        valid = trainer.run()
    if valid is not None:
        measure = ', '.join(f'{k} {v:.3f}' for k, v in quality(valid, conf.corpus.level).items())
        logger.log(f'Validation after {trainer.step} steps: loss {valid:.4f}, {measure}')
    return trainer


def main(argv: List[str]) -> int:
    def action(args: List[str]):
        overrides = parse_overrides(args)
        resume = overrides.pop('resume', None)
        train(overrides, resume=None if resume is None else str(resume))

    return run_script(action, argv, __doc__)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
