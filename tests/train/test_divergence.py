"""
A diverging training stops at the step where its loss or gradient norm stops being finite, says so, and leaves the
checkpoints of finite weights in place; a checkpoint whose state is not finite (weights, optimizer state, the
schedule's learning rate) is refused on resume, by name.
"""
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from labml import experiment, lab

from labml_txl.train.checkpoint import CheckpointError, checkpoint_steps, read_checkpoint, save_checkpoint
from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.trainer import Trainer, TrainingDiverged

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import train_xl  # noqa: E402

SMALL = {'n_layer': 1, 'd_model': 16, 'n_head': 2, 'd_head': 8, 'd_inner': 16, 'tgt_len': 8, 'mem_len': 8,
         'batch_size': 2, 'max_step': 4, 'eval_interval': 2, 'max_eval_steps': 1, 'checkpoint_interval': 2}
# Adam moves every weight by about `lr` in its first step: to ~1e30, whose products overflow in the second step
DIVERGING = dict(SMALL, lr=1e30, scheduler='constant', max_step=6, checkpoint_interval=1)


@pytest.fixture
def lab_dir(tmp_path):
    lab.configure({'path': str(tmp_path)})
    yield tmp_path
    lab.configure({'path': str(REPO)})


def _all_finite(state) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state['model'].values() if t.is_floating_point())


def test_a_diverging_run_stops_at_the_step_and_keeps_its_finite_checkpoints(lab_dir, monkeypatch, capsys):
    """Before: `loss nan` at steps 2 to 6, no word, and keep-two left the checkpoints of steps 5 and 6, both NaN."""
    monkeypatch.setenv('RUN_UUID', 'diverging')
    argv = [f'{key}={value}' for key, value in DIVERGING.items()]
    assert train_xl.main(argv) == 2
    error = capsys.readouterr().err
    checkpoints = lab_dir / 'logs' / 'train_xl' / 'diverging' / 'checkpoints'
    assert re.search(r"error: training diverged at step 2: the loss is nan \(gradient norm nan, learning rate "
                     r"1e\+30\)", error), error[-2000:]
    assert f"the newest checkpoint, of step 1 ({checkpoints / '1'}), is kept" in error
    # The step that diverged was not saved, nor any after it, and the one before it is intact and finite
    assert checkpoint_steps(checkpoints) == [1]
    assert _all_finite(read_checkpoint(checkpoints / '1'))


def _trainer(tmp_path, monkeypatch) -> Trainer:
    monkeypatch.chdir(tmp_path)
    conf = TrainXLConfigs()
    experiment.create(name='test', writers=set())
    experiment.configs(conf, dict(SMALL))
    return Trainer(conf, checkpoint_dir=tmp_path / 'checkpoints')


def test_non_finite_weights_are_never_saved(tmp_path, monkeypatch):
    """Before: the checkpoint was written, NaN and all, and counted as one of the two kept."""
    trainer = _trainer(tmp_path, monkeypatch)
    trainer.step = 1
    trainer.save()
    trainer.step = 2
    with torch.no_grad():
        trainer.model.r_w_bias[0, 0] = math.nan
    with pytest.raises(TrainingDiverged, match=r"training diverged by step 2: the model's weight r_w_bias \(nan\) "
                                               r"is not finite; its checkpoint was not written.*the newest "
                                               r"checkpoint, of step 1 .*, is kept"):
        trainer.save()
    assert checkpoint_steps(tmp_path / 'checkpoints') == [1]


def test_a_non_finite_gradient_stops_before_the_optimizer_step(tmp_path, monkeypatch):
    """The step is not taken: the weights stay as they were, finite."""
    trainer = _trainer(tmp_path, monkeypatch)
    data, target, _ = trainer._next_batch()
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    # A finite loss whose gradient is not: an infinite factor on a weight the loss depends on
    clip_grad_norm = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', lambda p, c: clip_grad_norm(p, c) * math.inf)
    with pytest.raises(TrainingDiverged, match=r"training diverged at step 1: the gradient norm is inf \(loss "):
        trainer.train_step(data, target)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


@pytest.fixture
def finished_run(lab_dir, monkeypatch):
    monkeypatch.setenv('RUN_UUID', 'finished')
    trainer = train_xl.train(dict(SMALL), screen=False)
    monkeypatch.delenv('RUN_UUID')
    return trainer.checkpoint_dir


def _nan_lr(state):
    state['optimizer']['param_groups'][0]['lr'] = math.nan
    state['scheduler']['_last_lr'] = [math.nan]


def _nan_weight(state):
    state['model']['layers.0.pos_ff.CoreNet.0.weight'][1, 2] = math.inf


def _nan_adam(state):
    state['optimizer']['state'][3]['exp_avg_sq'][0] = math.nan


def _nan_memory(state):
    state['mems'][1][0, 0, 0] = math.nan


@pytest.mark.parametrize('damage, named', [
    (_nan_memory, r"the memories' mems\[1\] \(nan\)"),
    (_nan_lr, r"the learning rate \(lr\) of the optimizer's param group 0 \(nan\), the schedule's _last_lr "
              r"\(\[nan\]\)"),
    (_nan_weight, r"the model's weight layers\.0\.pos_ff\.CoreNet\.0\.weight \(inf\)"),
    (_nan_adam, r"the optimizer's exp_avg_sq of parameter 3 \(nan\)"),
])
def test_a_checkpoint_with_non_finite_state_is_refused(finished_run, damage, named):
    """Before: the resume went on with `loss nan` from its first step, and no warning (checksums are valid)."""
    checkpoints = finished_run
    state = read_checkpoint(checkpoints / '4')
    damage(state)
    save_checkpoint(checkpoints, 4, state, keep=None)
    with pytest.raises(CheckpointError, match=rf"checkpoint {re.escape(str(checkpoints / '4'))} holds values that "
                                              rf"are not finite: {named}"):
        train_xl.train({'max_step': 6}, resume='finished', screen=False)
    assert checkpoint_steps(checkpoints) == [2, 4]


def test_under_fp16_an_infinite_gradient_is_left_to_the_gradient_scaler(tmp_path, monkeypatch):
    """fp16's gradient scaler overflows now and then by design, skips that step and lowers its scale: not a
    divergence. (fp16 needs CUDA; here a scaler that says it is enabled stands in.)"""
    trainer = _trainer(tmp_path, monkeypatch)
    data, target, _ = trainer._next_batch()
    monkeypatch.setattr(trainer.scaler, 'is_enabled', lambda: True)
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', lambda p, c: torch.tensor(math.inf))
    assert math.isfinite(trainer.train_step(data, target)) and trainer.grad_norm == math.inf
