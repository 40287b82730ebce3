"""
A training process stopped mid-run, resumed from its checkpoint, continues exactly as a run that was never
interrupted: the same loss at every step after the resume and the same final weights (bitwise, on CPU). SIGKILL
loses the steps since the last periodic checkpoint; SIGINT (Ctrl-C) and SIGTERM lose nothing: the step in progress
finishes and is saved, one line says how to resume, and there is no traceback.
"""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from labml import lab

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import train_xl  # noqa: E402
from labml_txl.train.checkpoint import checkpoint_steps  # noqa: E402
from labml_txl.train.runs import RunNotFoundError  # noqa: E402

# Dropout and variable-length segments, so random states and the data position both have to be restored
OVERRIDES = {'n_layer': 2, 'd_model': 32, 'n_head': 2, 'd_head': 16, 'd_inner': 64, 'dropout': 0.1,
             'tgt_len': 16, 'mem_len': 16, 'batch_size': 4, 'varlen': True, 'max_step': 30,
             'eval_interval': 10, 'max_eval_steps': 3, 'checkpoint_interval': 5, 'warmup_step': 5, 'lr': 0.002}
KILL_AT_STEP = 17


@pytest.fixture
def lab_dir(tmp_path):
    """labml writes runs under tmp_path/logs for this test."""
    lab.configure({'path': str(tmp_path)})
    yield tmp_path
    lab.configure({'path': str(REPO)})


def _stopped_run(lab_path: Path, run_uuid: str, how: signal.Signals,
                 overrides=OVERRIDES, again: str = '') -> subprocess.CompletedProcess:
    """Train in a subprocess, from the command line, that sends itself `how` in the middle of step KILL_AT_STEP;
    `again`: code run in it before the training that sends a second signal (`AGAIN`)."""
    argv = [f'{key}={value}' for key, value in overrides.items()]
    script = textwrap.dedent(f'''
        import os, signal, sys
        sys.path.insert(0, {str(REPO / 'experiments')!r})
        from labml import lab
        lab.configure({{'path': {str(lab_path)!r}}})
        from labml_txl.train.trainer import Trainer
        train_window = Trainer.train_window
        def signalled_train_window(self, segments):
            if self.step + 1 == {KILL_AT_STEP}:
                os.kill(os.getpid(), {int(how)})
            return train_window(self, segments)
        Trainer.train_window = signalled_train_window
        {textwrap.indent(again, ' ' * 8).strip()}
        import train_xl
        sys.exit(train_xl.main({argv!r}))
    ''')
    return subprocess.run([sys.executable, '-c', script], env={**os.environ, 'RUN_UUID': run_uuid},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize('how, corrupt_newest', [(signal.SIGKILL, False), (signal.SIGKILL, True),
                                                 (signal.SIGINT, False), (signal.SIGTERM, False)])
def test_resume_after_a_stop_equals_an_uninterrupted_run(lab_dir, how, corrupt_newest):
    run_uuid = f'stopped{how.name}' + ('corrupt' if corrupt_newest else '')
    stopped = _stopped_run(lab_dir, run_uuid, how)
    checkpoints = next(lab_dir.glob(f'logs/*/{run_uuid}')) / 'checkpoints'
    if how == signal.SIGKILL:
        assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-2000:]
        # the periodic checkpoints only: the steps after 15 are lost
        assert checkpoint_steps(checkpoints) == [10, 15]
        resume_from = 15
    else:
        # the step in progress finished and was saved; 128 + the signal, one line on how to resume, no traceback
        assert stopped.returncode == 128 + how, stopped.stderr[-2000:]
        assert checkpoint_steps(checkpoints) == [15, KILL_AT_STEP]
        resume_from = KILL_AT_STEP
        assert 'Traceback' not in stopped.stderr + stopped.stdout, stopped.stderr[-3000:]
        told = [line for line in stopped.stderr.splitlines() if 'resume with' in line]
        assert told == [f'Stopped by {how.name} at step {KILL_AT_STEP} and saved the checkpoint '
                        f'{checkpoints / str(KILL_AT_STEP)}; resume with: python experiments/train_xl.py '
                        f'resume={run_uuid}'], stopped.stderr[-3000:]
        assert '"status": "interrupted"' in (checkpoints.parent / 'run_log.jsonl').read_text()
    if corrupt_newest:
        # A damaged newest checkpoint is reported and the one before it used
        newest = checkpoints / '15' / 'tensors.safetensors'
        newest.write_bytes(newest.read_bytes()[:1000])
        resume_from = 10

    if corrupt_newest:
        with pytest.warns(RuntimeWarning, match=r"checkpoint .*15/tensors.safetensors does not match its checksum"):
            resumed = train_xl.train({}, resume=run_uuid, screen=False)
    else:
        resumed = train_xl.train({}, resume=run_uuid, screen=False)
    uninterrupted = train_xl.train(dict(OVERRIDES), screen=False)

    assert [step for step, _ in resumed.history] == list(range(resume_from + 1, 31))
    expected = dict(uninterrupted.history)
    assert [(step, expected[step]) for step, _ in resumed.history] == resumed.history
    for (name, ours), (_, theirs) in zip(resumed.model.state_dict().items(),
                                         uninterrupted.model.state_dict().items()):
        assert torch.equal(ours, theirs), name


# Where a second signal comes while the first is handled: with it (before the step ends), while the step's checkpoint is
# written, and while the script reports the stop (after the training loop has ended)
AGAIN = {
    'in the step': """
        def again_in_step(self, segments):  # (in place of the first's: both signals, then the step)
            if self.step + 1 == {step}:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), {second})
            return train_window(self, segments)
        Trainer.train_window = again_in_step
    """,
    'while saving': """
        save = Trainer.save
        def again_while_saving(self):
            if self.step == {step}:
                os.kill(os.getpid(), {second})
            return save(self)
        Trainer.save = again_while_saving
    """,
    'while reporting': """
        from labml_txl.train.interruption import TrainingInterrupted
        told = TrainingInterrupted.__str__
        def again_while_reporting(self):
            os.kill(os.getpid(), {second})
            return told(self)
        TrainingInterrupted.__str__ = again_while_reporting
    """,
}


@pytest.fixture(scope='module')
def uninterrupted_history(tmp_path_factory):
    lab.configure({'path': str(tmp_path_factory.mktemp('uninterrupted'))})
    yield dict(train_xl.train(dict(OVERRIDES), screen=False).history)
    lab.configure({'path': str(REPO)})


# (each moment once, each kind of second signal at least once)
@pytest.mark.parametrize('when, second', [('in the step', signal.SIGINT), ('while saving', signal.SIGINT),
                                          ('while reporting', signal.SIGTERM)])
def test_a_second_signal_while_the_first_is_handled_changes_nothing(uninterrupted_history, lab_dir, when, second):
    """Ctrl-C pressed twice, or SIGTERM after a Ctrl-C: the one line of the first, no traceback, exit 130, and the
    step's checkpoint whole (the resume gives the uninterrupted run's losses)."""
    run_uuid = f'twice{second.name}{when.replace(" ", "")}'
    stopped = _stopped_run(lab_dir, run_uuid, signal.SIGINT,
                           again=textwrap.dedent(AGAIN[when]).format(step=KILL_AT_STEP, second=int(second)))
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert 'Traceback' not in stopped.stderr + stopped.stdout, stopped.stderr[-3000:]
    checkpoints = next(lab_dir.glob(f'logs/*/{run_uuid}')) / 'checkpoints'
    told = [line for line in stopped.stderr.splitlines() if line.startswith('Stopped by')]
    assert told == [f'Stopped by SIGINT at step {KILL_AT_STEP} and saved the checkpoint '
                    f'{checkpoints / str(KILL_AT_STEP)}; resume with: python experiments/train_xl.py '
                    f'resume={run_uuid}'], stopped.stderr[-3000:]
    assert checkpoint_steps(checkpoints) == [15, KILL_AT_STEP]
    resumed = train_xl.train({}, resume=run_uuid, screen=False)
    assert resumed.history == [(step, uninterrupted_history[step]) for step in range(KILL_AT_STEP + 1, 31)]


def test_resuming_a_run_that_does_not_exist_names_the_uuid(lab_dir):
    with pytest.raises(RunNotFoundError, match=r"run UUID 'no-such-run' does not exist under .*logs"):
        train_xl.train({}, resume='no-such-run', screen=False)


def test_resume_with_a_compressed_memory_equals_an_uninterrupted_run(lab_dir):
    """The checkpoint carries the compressed memories and the compression's weights: a run killed after its memories
    have been compressed for several steps resumes to the same losses and weights."""
    overrides = {**OVERRIDES, 'mem_len': 8, 'cmem_len': 4, 'compression_rate': 2}
    stopped = _stopped_run(lab_dir, 'compressive', signal.SIGKILL, overrides)
    assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-2000:]
    resumed = train_xl.train({}, resume='compressive', screen=False)
    uninterrupted = train_xl.train(dict(overrides), screen=False)
    assert [step for step, _ in resumed.history] == list(range(16, 31))
    expected = dict(uninterrupted.history)
    assert [(step, expected[step]) for step, _ in resumed.history] == resumed.history
    assert resumed.aux_losses["reconstruction"] == uninterrupted.aux_losses["reconstruction"] > 0.0
    assert any(name.startswith('compressed_memory.') for name in resumed.model.state_dict())
    for (name, ours), (_, theirs) in zip(resumed.model.state_dict().items(),
                                         uninterrupted.model.state_dict().items()):
        assert torch.equal(ours, theirs), name
