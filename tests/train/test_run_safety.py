"""
A resume never damages its run: bad overrides are refused before anything is written, ids that are not runs are
errors, one process at a time trains a run, and runs are found in the labml project of the working directory.
"""
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from labml import lab

from labml_txl.configs.validation import ConfigTypeError
from labml_txl.file_lock import FileLock
from labml_txl.train.checkpoint import CheckpointError, checkpoint_steps
from labml_txl.train.runs import LOCK_FILE, RunInUseError, RunNotFoundError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import train_xl  # noqa: E402

SMALL = {'n_layer': 1, 'd_model': 16, 'n_head': 2, 'd_head': 8, 'd_inner': 16, 'tgt_len': 8, 'mem_len': 8,
         'batch_size': 2, 'max_step': 4, 'eval_interval': 2, 'max_eval_steps': 1, 'checkpoint_interval': 2}


@pytest.fixture
def lab_dir(tmp_path):
    lab.configure({'path': str(tmp_path)})
    yield tmp_path
    lab.configure({'path': str(REPO)})


@pytest.fixture
def finished_run(lab_dir, monkeypatch):
    monkeypatch.setenv('RUN_UUID', 'finished')
    trainer = train_xl.train(dict(SMALL), screen=False)
    monkeypatch.delenv('RUN_UUID')
    run_path = trainer.checkpoint_dir.parent
    return run_path, (run_path / 'overrides.json').read_bytes()


def _files(run_path: Path) -> dict:
    """The run's files and their bytes, but for the records of which process holds it (our lock, labml's pid)."""
    return {p.relative_to(run_path): p.read_bytes() for p in run_path.rglob('*')
            if p.is_file() and p.name not in (LOCK_FILE, 'run.pid')}


@pytest.mark.parametrize('overrides, error, message', [
    ({'d_model': 32, 'd_inner': 32}, CheckpointError, r"is from a model of another shape: .* has shape \[\d+, 16\] "
                                                      r"in the checkpoint but \[\d+, 32\] in the model"),
    ({'n_layer': 'abc'}, ConfigTypeError, r"n_layer='abc' is not accepted: TrainXLConfigs\.n_layer takes an "
                                          r"integer"),
    ({'pre_lnorm': 'yes'}, ConfigTypeError, r"pre_lnorm='yes' is not accepted"),
    # The optimizer's and the schedule's state come from the checkpoint: a new learning rate was once recorded in
    # overrides.json and ignored (the printed rate ran on from the saved schedule)
    ({'lr': 0.01, 'max_step': 6}, ValueError, r"lr=0.01: not accepted with resume=, because run finished resumes its "
                                              r"optimizer and learning-rate schedule from its checkpoint"),
    ({'scheduler': 'constant', 'mom': 0.9}, ValueError, r"scheduler=constant mom=0.9: not accepted with resume="),
])
def test_a_failed_resume_leaves_the_run_as_it_was(finished_run, overrides, error, message):
    run_path, saved = finished_run
    before = _files(run_path)
    with pytest.raises(error, match=message):
        train_xl.train(overrides, resume='finished', screen=False)
    assert (run_path / 'overrides.json').read_bytes() == saved
    assert _files(run_path) == before
    # and the run resumes as before
    resumed = train_xl.train({'max_step': 6}, resume='finished', screen=False)
    assert [step for step, _ in resumed.history] == [5, 6] and checkpoint_steps(run_path / 'checkpoints') == [4, 6]


# Settings that change what the model keeps between segments but no weight (max pooling has none), so that only the
# checkpoint's memories show the change: the run once recorded them and failed at its first step, every later resume
# the same way
LAYOUT_CHANGED = r"checkpoint .*checkpoints/4 holds memories this model cannot continue from: {}.*\. The settings given"


@pytest.mark.parametrize('overrides, message', [
    ({'mem_len': 0}, r"2 memories are not accepted: this model keeps no memory now"),
    ({'cmem_len': 4, 'compression': 'max_pool', 'compression_rate': 2},
     r"2 memories are not accepted: expected n_layer \+ 1 = 2 tensors .*, then n_layer = 1 compressed memories"),
])
def test_a_resume_that_changes_what_the_model_keeps_is_refused_before_anything_is_written(finished_run, overrides,
                                                                                            message):
    run_path, saved = finished_run
    before = _files(run_path)
    with pytest.raises(CheckpointError, match=LAYOUT_CHANGED.format(message)):
        train_xl.train({**overrides, 'max_step': 6}, resume='finished', screen=False)
    assert _files(run_path) == before
    resumed = train_xl.train({'max_step': 6}, resume='finished', screen=False)
    assert [step for step, _ in resumed.history] == [5, 6]


def test_a_compressive_run_resumed_without_its_compressed_memory_is_refused(lab_dir, monkeypatch):
    """The issue's case: `compression=max_pool` has no weights, so `cmem_len=0` changes no shape."""
    monkeypatch.setenv('RUN_UUID', 'compressive')
    compressive = {**SMALL, 'cmem_len': 4, 'compression': 'max_pool', 'compression_rate': 2}
    run_path = train_xl.train(compressive, screen=False).checkpoint_dir.parent
    monkeypatch.delenv('RUN_UUID')
    before = _files(run_path)
    with pytest.raises(CheckpointError, match=LAYOUT_CHANGED.format(r"3 memories are not accepted: expected "
                                                                    r"n_layer \+ 1 = 2 tensors \[mlen, bsz, "
                                                                    r"d_model\] \(the input of every layer and "
                                                                    r"the last output\), as returned")):
        train_xl.train({'cmem_len': 0, 'max_step': 6}, resume='compressive', screen=False)
    assert _files(run_path) == before
    resumed = train_xl.train({'max_step': 6}, resume='compressive', screen=False)
    assert [step for step, _ in resumed.history] == [5, 6]


@pytest.mark.parametrize('argument, message', [
    ('resume=None', r"resume=None is not accepted: give the UUID of the run to continue"),
    ('resume=', r"resume='' is not accepted: give the UUID"),
    ('resume=no-such-run', r"run UUID 'no-such-run' does not exist under .*logs \(runs there: finished\)"),
])
def test_resume_needs_the_uuid_of_a_run(finished_run, capsys, argument, message):
    assert train_xl.main([argument, 'max_step=8']) == 2
    assert re.search(message, capsys.readouterr().err), argument
    assert not [p for p in finished_run[0].parent.iterdir() if p.name != 'finished'], 'no new run was started'


def test_a_run_of_another_project_given_by_its_path_is_refused_and_left_as_it_was(finished_run, tmp_path_factory,
                                                                                   capsys):
    """Its path was joined to this project's experiments folder as it was, which gave the path itself: the run of
    the other project was trained, and its run.yaml given the path for its UUID."""
    other = tmp_path_factory.mktemp('other_project')
    (other / '.labml.yaml').write_text('check_repo_dirty: false\n')
    theirs = other / 'logs' / 'train_xl' / 'theirs'
    shutil.copytree(finished_run[0], theirs)
    before = _files(theirs)
    assert train_xl.main([f'resume={theirs}', 'max_step=8']) == 2
    assert (f"error: resume='{theirs}' is not accepted: it is a path, and a run is named by its UUID, the name of "
            f"its folder (theirs), in the labml project of the working directory" in capsys.readouterr().err)
    assert _files(theirs) == before


def test_a_full_disk_while_the_metrics_are_written_names_the_file_and_the_checkpoint_to_resume_from(
        lab_dir, monkeypatch, capsys):
    """The issue's case: `error: [Errno 28] No space left on device`, naming neither."""
    from labml_txl.train import metrics_file

    def full_disk(path, mode='r', *args, **kwargs):
        if 'a' in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write of an open file: no file named
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(metrics_file, 'open', full_disk, raising=False)
    monkeypatch.setenv('RUN_UUID', 'full')
    assert train_xl.main([f'{key}={value}' for key, value in SMALL.items()]) == 2
    run_path = lab_dir / 'logs' / 'train_xl' / 'full'
    assert (f"error: {run_path / 'log.jsonl'}: No space left on device; the checkpoint of step 4 is intact "
            f"({run_path / 'checkpoints' / '4'}): once the cause is mended (for a full disk, space freed), resume "
            f"with: python " in capsys.readouterr().err)
    monkeypatch.undo()
    resumed = train_xl.train({'max_step': 6}, resume='full', screen=False)
    assert [step for step, _ in resumed.history] == [5, 6]


def test_resuming_a_run_that_does_not_exist_names_the_uuid(lab_dir):
    with pytest.raises(RunNotFoundError, match=r"run UUID 'no-such-run' does not exist under .*logs"):
        train_xl.train({}, resume='no-such-run', screen=False)


def _slow_training(lab_path: Path, run_uuid: str, resume: bool = False) -> subprocess.Popen:
    """A training in a subprocess whose steps take 0.2 s each, long enough to be found training."""
    script = textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {str(REPO / 'experiments')!r})
        from labml import lab
        lab.configure({{'path': {str(lab_path)!r}}})
        from labml_txl.train.trainer import Trainer
        train_window = Trainer.train_window
        def slow_train_window(self, segments):
            time.sleep(0.2)
            return train_window(self, segments)
        Trainer.train_window = slow_train_window
        import train_xl
        train_xl.train({dict(SMALL, max_step=1000)!r}, resume={run_uuid if resume else None!r}, screen=False)
    ''')
    return subprocess.Popen([sys.executable, '-c', script], env={**os.environ, 'RUN_UUID': run_uuid},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_until_training(lab_path: Path, run_uuid: str, process: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for lock in lab_path.glob(f'logs/*/{run_uuid}/{LOCK_FILE}'):
            pid = lock.parent / 'run.pid'
            if FileLock(lock).holder() == str(process.pid) and pid.exists() and pid.read_text() == str(process.pid):
                return lock.parent
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.1)
    raise AssertionError('the training never started')


def test_one_process_trains_a_run_at_a_time(finished_run, lab_dir):
    run_path, saved = finished_run
    training = _slow_training(lab_dir, 'finished', resume=True)
    try:
        _wait_until_training(lab_dir, 'finished', training)
        # A second resume of the same run fails at once, naming the run and the process that trains it
        started = time.monotonic()
        with pytest.raises(RunInUseError, match=rf"run finished is being trained by process {training.pid} "
                                                rf"\(it holds .*{LOCK_FILE}\)"):
            train_xl.train({}, resume='finished', screen=False)
        assert time.monotonic() - started < 30
    finally:
        training.send_signal(signal.SIGKILL)
        training.wait(timeout=60)
    # The lock died with its process: the run resumes
    resumed = train_xl.train({'max_step': 6}, resume='finished', screen=False)
    assert resumed.step == 6


def test_a_run_is_found_in_the_project_of_the_working_directory(tmp_path):
    """A user's own script outside this repository, in a project of its own, trains and resumes its runs."""
    project = tmp_path / 'my_project'
    (project / 'scripts').mkdir(parents=True)
    (project / '.labml.yaml').write_text('check_repo_dirty: false\n')
    script = project / 'scripts' / 'my_training.py'
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(REPO / 'experiments')!r})
        import train_xl
        sys.exit(train_xl.main(sys.argv[1:]))
    '''))
    argv = [f'{key}={value}' for key, value in SMALL.items()]
    env = {**os.environ, 'RUN_UUID': 'mine'}
    first = subprocess.run([sys.executable, str(script), *argv], cwd=project / 'scripts', env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert checkpoint_steps(project / 'logs' / 'train_xl' / 'mine' / 'checkpoints') == [2, 4]
    resumed = subprocess.run([sys.executable, str(script), 'resume=mine', 'max_step=6'], cwd=project, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert checkpoint_steps(project / 'logs' / 'train_xl' / 'mine' / 'checkpoints') == [4, 6]
    assert not (REPO / 'logs' / 'train_xl' / 'mine').exists()


def test_a_newer_checkpoint_without_checksums_is_named_and_never_overwritten(finished_run):
    """Before: the resume started from step 2 without a word, and its save of step 4 removed the folder 4."""
    run_path, _ = finished_run
    newest = run_path / 'checkpoints' / '4'
    (newest / 'SHA256SUMS').unlink()
    kept = {p.name: p.read_bytes() for p in newest.iterdir()}
    with pytest.warns(RuntimeWarning) as warned:
        resumed = train_xl.train({'max_step': 6}, resume='finished', screen=False)
    messages = [str(w.message) for w in warned]
    assert any(re.search(rf"checkpoint {newest} has no SHA256SUMS.*falling back", m) for m in messages), messages
    assert any(re.search(rf"checkpoint {newest} has no SHA256SUMS.*kept as {newest}\.unverified", m)
               for m in messages), messages
    assert [step for step, _ in resumed.history] == [3, 4, 5, 6]
    assert {p.name: p.read_bytes() for p in (run_path / 'checkpoints' / '4.unverified').iterdir()} == kept


def test_a_resume_takes_the_runs_own_learning_rate_and_the_settings_that_apply(finished_run):
    # Giving the value the run already has changes nothing and is accepted; max_step and clip apply
    resumed = train_xl.train({'lr': 0.00025, 'max_step': 6, 'clip': 0.5}, resume='finished', screen=False)
    assert resumed.step == 6 and resumed.conf.clip == 0.5
