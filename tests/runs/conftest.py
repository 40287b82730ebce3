"""
Real runs for the tests of `labml_txl.runs`: four tiny `train_xl` runs, trained once per session in a project of
their own (a temporary folder), and the folders labml wrote for them.

* `alibi16`: attention=alibi mem_len=16, of sweep `demo`;
* `relative16`: attention=relative mem_len=16, of sweep `demo`;
* `alibi0`: attention=alibi mem_len=0;
* `other`: the same as `alibi16` under another experiment name (`other_xl`): a run of another script.
"""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from labml import lab
from labml.internal.tracker import tracker_singleton

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import train_xl  # noqa: E402

SMALL = {'n_layer': 1, 'd_model': 32, 'n_head': 2, 'd_head': 16, 'd_inner': 64, 'tgt_len': 16, 'batch_size': 4,
         'max_step': 20, 'eval_interval': 10, 'max_eval_steps': 3}
RUNS = {'alibi16': ({'attention': 'alibi', 'mem_len': 16}, 'demo', 'train_xl'),
        'relative16': ({'attention': 'relative', 'mem_len': 16}, 'demo', 'train_xl'),
        'alibi0': ({'attention': 'alibi', 'mem_len': 0}, None, 'train_xl'),
        'other': ({'attention': 'alibi', 'mem_len': 16}, None, 'other_xl')}


@pytest.fixture(scope='session')
def runs(tmp_path_factory):
    """The runs (`RUNS`), trained in order: `root` (the project), `experiments` (`root/logs`), and for each run
    its `trainer`, `uuid` and `path` by name (`runs.trainer['alibi0']`)."""
    root = tmp_path_factory.mktemp('runs_project')
    trainers = {}
    # labml's tracker keeps a global step set with `tracker.set_global_step` for the rest of the process, and then
    # logs every step of a later run at it (tests/train/test_run_models.py sets one): forget it
    tracker_singleton().set_global_step(None)
    lab.configure({'path': str(root)})
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(root)
            patch.delenv('RUN_UUID', raising=False)
            for key, (overrides, sweep, name) in RUNS.items():
                if sweep:
                    patch.setenv('LABML_TXL_SWEEP', sweep)
                else:
                    patch.delenv('LABML_TXL_SWEEP', raising=False)
                trainers[key] = train_xl.train({**SMALL, **overrides}, name=name, screen=False)
    finally:
        lab.configure({'path': str(REPO)})
    paths = {key: trainer.checkpoint_dir.parent for key, trainer in trainers.items()}
    return SimpleNamespace(root=root, experiments=root / 'logs', trainer=trainers, path=paths,
                           uuid={key: path.name for key, path in paths.items()})
