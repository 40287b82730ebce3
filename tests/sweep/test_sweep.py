"""
`python -m labml_txl.sweep` on tiny train_xl runs, as a user runs it: a 2 x 2 sweep stopped by Ctrl-C in its second
run and started again ends with four runs (none repeated, the stopped one resumed under its own UUID), the
comparison table and the plot; bad settings are refused before the first run. Killed before a run's first
checkpoint and started again, a sweep compares one run per point; started while it runs, it is refused naming the
process that runs it; a run of it resumed by hand stays its own; a folder given as its script is said to be one.
"""
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from labml_txl.runs.records import load_runs
from labml_txl.sweep import __main__ as sweep_cli
from labml_txl.train.run_start import SWEEP_ENV
from labml_txl.train.runs import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]
TRAIN_XL = str(REPO / 'experiments' / 'train_xl.py')
# Long enough (about 2,000 tiny steps) for the second run to be stopped after a checkpoint and before its end
TINY = ['n_layer=1', 'd_model=16', 'n_head=2', 'd_head=8', 'd_inner=32', 'tgt_len=8', 'batch_size=2',
        'max_step=1500', 'eval_interval=750', 'max_eval_steps=2', 'checkpoint_interval=50']
GRID = ['attention=relative,alibi', 'mem_len=0,8']


class Sweep:
    """`python -m labml_txl.sweep ARGS` in `cwd`, its output in files (a pipe nobody reads would fill and block it)."""

    def __init__(self, cwd: Path, *args: str, **popen):
        self.out, self.err = cwd / f'sweep-{time.monotonic_ns()}.out', cwd / f'sweep-{time.monotonic_ns()}.err'
        with open(self.out, 'w') as out, open(self.err, 'w') as err:
            # (one thread: tiny models run faster so, and the test does not depend on what else the machine runs)
            self.process = subprocess.Popen([sys.executable, '-m', 'labml_txl.sweep', *args], cwd=cwd, stdout=out,
                                            stderr=err, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'},
                                            **popen)
        self.pid = self.process.pid

    @property
    def returncode(self):
        return self.process.returncode

    def poll(self):
        return self.process.poll()

    def communicate(self, timeout: float):
        self.process.wait(timeout=timeout)
        return self.out.read_text(), self.err.read_text()


_sweep = Sweep


def _runs(project: Path):
    return sorted((r for r in load_runs(project) if any(t.startswith('sweep:') for t in r.tags)),
                  key=lambda r: r.started)


def _completed_lines(record) -> int:
    return (record.path / 'run_log.jsonl').read_text().count('"completed"')


def _has_checkpoint(record) -> bool:
    return any((record.path / 'checkpoints').glob('*/SHA256SUMS'))


def _wait_for(condition, process: Sweep, what: str, timeout: float = 240) -> None:
    """Until `condition()` holds while `process` runs; a failure saying `what` did not happen in time."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        assert process.poll() is None, process.communicate(timeout=10)
        time.sleep(0.2)
    pytest.fail(f'{what} in time')


@contextlib.contextmanager
def _killed_at_end(sweeps: List[Sweep]):
    """Each of `sweeps` (as the list holds them at the end) still running then, a failed test's, is killed with the
    scripts it started."""
    try:
        yield
    finally:
        for sweep in sweeps:
            if sweep.poll() is None:
                os.killpg(sweep.pid, signal.SIGKILL)
                sweep.process.wait(timeout=60)


def _comparison_rows(project: Path):
    """The lines of the runs in the comparison a sweep of `project` wrote (one sweep only there)."""
    (sweep_folder,) = (project / 'logs' / 'sweeps').iterdir()
    table = (sweep_folder / 'comparison.md').read_text()
    return [line for line in table.splitlines() if re.match(r'[0-9a-f]{8}', line)]


def test_a_sweep_stopped_and_started_again_ends_with_every_run_once(tmp_path):
    process = _sweep(tmp_path, TRAIN_XL, *GRID, *TINY, start_new_session=True)
    # Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the second run has a checkpoint
    _wait_for(lambda: len(runs := _runs(tmp_path)) == 2 and _has_checkpoint(runs[1]), process,
              'the second run did not save a checkpoint')
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert 'start it again with the same arguments to continue' in err
    first, stopped = _runs(tmp_path)
    assert first.status == 'completed' and stopped.status == 'interrupted'

    again = _sweep(tmp_path, TRAIN_XL, *GRID, *TINY)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert '4 runs of' in out and '(1 done, 1 to resume, 2 to start)' in out
    runs = _runs(tmp_path)
    assert len(runs) == 4
    assert {(r.config('attention').value, r.config('mem_len').value) for r in runs} == \
           {('relative', 0), ('relative', 8), ('alibi', 0), ('alibi', 8)}
    by_uuid = {r.uuid: r for r in runs}
    # The first run was not trained again; the stopped one continued under its own UUID to the end
    assert _completed_lines(by_uuid[first.uuid]) == 1
    assert by_uuid[stopped.uuid].status == 'completed' and by_uuid[stopped.uuid].last_step('loss.train') == 1499
    assert all(r.status == 'completed' and r.last_step('loss.train') == 1499 for r in runs)
    # The comparison and the plot, in the sweep's folder
    sweep_folder = next((tmp_path / 'logs' / 'sweeps').iterdir())
    table = (sweep_folder / 'comparison.md').read_text()
    assert all(r.uuid[:8] in table for r in runs) and 'attention' in table and 'mem_len' in table
    assert (sweep_folder / 'loss_valid.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'

    # Started a third time, there is nothing left to do
    third = _sweep(tmp_path, TRAIN_XL, *GRID, *TINY)
    out, _ = third.communicate(timeout=120)
    assert third.returncode == 0 and '(4 done, 0 to resume, 0 to start)' in out and len(_runs(tmp_path)) == 4


@pytest.mark.parametrize('args, message', [
    (['attention=relative,rotory'], r"attention='rotory' is not an option of TrainXLConfigs.attention. Did you mean "
                                    r"'rotary'\?"),
    (['mem_lenn=0,8'], r"train_xl.py has no setting 'mem_lenn'. Did you mean 'mem_len'\?"),
    (['pre_lnorm=true,maybe'], r"pre_lnorm='maybe' is not accepted"),
    (['resume=abc'], r"resume= is not a sweep setting"),
])
def test_bad_settings_are_refused_before_the_first_run(tmp_path, args, message):
    import re
    process = _sweep(tmp_path, TRAIN_XL, *args, *TINY)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2 and re.search(message, err), err
    assert not (tmp_path / 'logs').exists()


def test_a_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    process = _sweep(tmp_path, '--dry-run', TRAIN_XL, *GRID, *TINY)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    (sweep,) = re.findall(r'^sweep (\S+): 4 runs', out, re.MULTILINE)
    # each a line of shell: the sweep's tag in the environment, then the arguments as the sweep would run them
    commands = [shlex.split(line) for line in out.splitlines() if line.startswith(f'{SWEEP_ENV}=')]
    assert len(commands) == 4
    for command in commands:
        assert command[:3] == [f'{SWEEP_ENV}={sweep}', sys.executable, str(TRAIN_XL)] and 'max_step=1500' in command
    assert command[3:5] == ['attention=alibi', 'mem_len=8']
    assert not (tmp_path / 'logs').exists()


def test_a_dry_runs_list_setting_stays_one_argument(tmp_path):
    # issue 38: `cutoffs=[10, 20]` was printed unquoted, and a shell split it in two
    process = _sweep(tmp_path, '--dry-run', TRAIN_XL, 'attention=relative', 'cutoffs=[10, 20]', *TINY)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith(f'{SWEEP_ENV}=')]
    assert 'cutoffs=[10, 20]' in shlex.split(line)


def test_a_point_whose_model_cannot_be_built_is_refused_before_the_first_run(tmp_path):
    # train_xl's check_settings builds each point's configs and model (on the meta device) first: absolute_deeper
    # needs n_head * d_head = d_model, which d_model=32 breaks; absolute, the first point, would train
    settings = [s for s in TINY if not s.startswith('d_model=')] + ['d_model=32']
    process = _sweep(tmp_path, TRAIN_XL, 'attention=absolute,absolute_deeper', *settings)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, err
    assert 'n_head * d_head = 2 * 8 = 16 is not accepted with attn_type=3' in err and 'no run was started' in err
    assert not (tmp_path / 'logs').exists()


def test_a_sweep_killed_before_a_first_checkpoint_compares_one_run_per_point(tmp_path):
    # issue 38: the run the kill abandoned kept its tag, and the comparison listed 3 runs for 2 points
    settings = [s for s in TINY if not s.startswith('checkpoint_interval=')] + ['checkpoint_interval=0']
    killed = _sweep(tmp_path, TRAIN_XL, 'mem_len=0,8', *settings, start_new_session=True)
    with _killed_at_end([killed]):
        _wait_for(lambda: len(_runs(tmp_path)) == 1, killed, 'the first run did not start')
        os.killpg(killed.pid, signal.SIGKILL)
        killed.process.wait(timeout=60)
    (abandoned,) = _runs(tmp_path)
    assert abandoned.status == 'unfinished' and not _has_checkpoint(abandoned)
    # The killed sweep's lock is left with its process id in it, and does not block the next start
    (lock_file,) = (tmp_path / 'logs' / 'sweeps').glob('*/sweep.lock')
    assert lock_file.read_text().strip() == str(killed.pid)

    again = _sweep(tmp_path, TRAIN_XL, 'mem_len=0,8', *settings)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert '(0 done, 0 to resume, 2 to start)' in out
    assert f'start again: its run {abandoned.uuid[:8]} (unfinished) cannot be resumed' in out
    runs = _runs(tmp_path)
    new = [r for r in runs if r.uuid != abandoned.uuid]
    assert len(runs) == 3 and all(r.status == 'completed' for r in new)
    assert sorted(r.config('mem_len').value for r in new) == [0, 8]
    # One line per point: the runs that completed, not the abandoned one
    rows = _comparison_rows(tmp_path)
    assert len(rows) == 2 and {row.split()[0] for row in rows} == {r.uuid[:8] for r in new}, rows


def test_a_sweep_started_while_it_runs_is_refused_naming_the_first(tmp_path):
    # issue 38: the same sweep started twice at once trained every point twice
    first = _sweep(tmp_path, TRAIN_XL, *GRID, *TINY, start_new_session=True)
    sweeps = [first]
    with _killed_at_end(sweeps):
        _wait_for(lambda: len(_runs(tmp_path)) == 1, first, "the first sweep's first run did not start")
        second = _sweep(tmp_path, TRAIN_XL, *GRID, *TINY, start_new_session=True)
        sweeps.append(second)
        out, err = second.communicate(timeout=120)
        first_was_running = first.poll() is None
        runs = _runs(tmp_path)
    assert second.returncode == 2, (out, err)
    assert first_was_running, 'the first sweep ended before the second was refused'
    assert re.search(rf'^error: sweep train_xl-[0-9a-f]{{8}} is already being run by process {first.pid} \(it '
                     rf'holds \S+/logs/sweeps/train_xl-[0-9a-f]{{8}}/sweep.lock\)', err), err
    assert f'tail --pid={first.pid}' in err and f'kill {first.pid}' in err
    # The second planned nothing and started no run: no point has two runs (the first may have begun its second)
    assert 'runs of' not in out and len({r.comment for r in runs}) == len(runs), [r.comment for r in runs]


def test_a_sweep_killed_alone_leaves_its_script_training_and_a_new_start_is_refused_naming_it(tmp_path):
    """SIGKILL of the sweep's process alone: the script it started trains on, holding its run, and a sweep started
    again must not start that point anew beside it (nor fail trying to resume a run in use)."""
    point = ['attention=relative', 'mem_len=0']
    long = [*TINY[:-4], 'max_step=100000', *TINY[-3:]]  # (trains on until the test ends it)
    killed = _sweep(tmp_path, TRAIN_XL, *point, *long, start_new_session=True)
    with _killed_at_end([killed]):  # (the whole group at the end: the script that outlived the sweep too)
        _wait_for(lambda: len(runs := _runs(tmp_path)) == 1 and _has_checkpoint(runs[0]), killed,
                  'the run did not save a checkpoint')
        os.kill(killed.pid, signal.SIGKILL)
        killed.process.wait(timeout=60)
        (run,) = _runs(tmp_path)
        training = (run.path / LOCK_FILE).read_text().strip()
        assert run.status == 'running' and training != str(killed.pid)
        again = _sweep(tmp_path, TRAIN_XL, *point, *long)
        out, err = again.communicate(timeout=120)
    assert again.returncode == 2, (out, err)
    assert (f"error: run {run.uuid} of the point {' '.join([*point, *long])} is being trained by process "
            f"{training} (it holds {run.path / LOCK_FILE}), not by this sweep: wait for it to end" in err), err
    assert len(_runs(tmp_path)) == 1


def test_a_sweep_without_matplotlib_is_refused_before_its_first_run(tmp_path, monkeypatch, capsys):
    """The plot at the end needs matplotlib: found missing there, every run would have trained for nothing."""
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # what `import matplotlib` raises ImportError for
    monkeypatch.chdir(tmp_path)
    assert sweep_cli.main([TRAIN_XL, *GRID, *TINY]) == 2
    assert capsys.readouterr().err == ("error: plotting needs matplotlib: pip install matplotlib (or -e "
                                       "'.[experiments]')\n")
    assert list(tmp_path.iterdir()) == []


def test_a_sweeps_run_resumed_by_hand_stays_the_sweeps(tmp_path):
    # issue 38: resumed with the command the run printed, without LABML_TXL_SWEEP, the run lost its sweep: tag,
    # and the sweep started again would have trained that point anew
    point = ['attention=relative', 'mem_len=0']
    stopped = _sweep(tmp_path, TRAIN_XL, *point, *TINY, start_new_session=True)
    with _killed_at_end([stopped]):
        _wait_for(lambda: len(runs := _runs(tmp_path)) == 1 and _has_checkpoint(runs[0]), stopped,
                  'the run did not save a checkpoint')
        os.killpg(stopped.pid, signal.SIGINT)
        _, err = stopped.communicate(timeout=120)
    assert stopped.returncode == 130, err
    (run,) = _runs(tmp_path)
    (command,) = re.findall(r'resume with: (python \S+ resume=\w+)$', err, re.MULTILINE)
    assert command.endswith(f'resume={run.uuid}')

    by_hand = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600,
                             env={**{k: v for k, v in os.environ.items() if k != SWEEP_ENV}, 'OMP_NUM_THREADS': '1'})
    assert by_hand.returncode == 0, by_hand.stderr
    (resumed,) = _runs(tmp_path)
    assert resumed.uuid == run.uuid and resumed.status == 'completed' and resumed.tags == run.tags

    again = _sweep(tmp_path, TRAIN_XL, *point, *TINY)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert '(1 done, 0 to resume, 0 to start)' in out and len(_runs(tmp_path)) == 1


def test_a_folder_given_as_the_script_is_said_to_be_one_with_its_scripts(tmp_path):
    # issue 38: the experiments folder was said not to exist
    experiments = REPO / 'experiments'
    process = _sweep(tmp_path, str(experiments), 'mem_len=0,16')
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and 'does not exist' not in err, err
    assert f'error: {experiments} is a folder: give one of its scripts, e.g. {TRAIN_XL} (' in err
    listed = err.split('those that take key=value settings: ', 1)[1].split(')')[0].split(', ')
    # the scripts with SETTINGS, and not those without (the benchmarks)
    assert {'train_xl.py', 'char_transformer.py', 'reverse.py'} <= set(listed) and 'benchmark.py' not in listed

    (tmp_path / 'scripts').mkdir()
    (tmp_path / 'scripts' / 'helper.py').write_text('VALUE = 1\n')
    process = _sweep(tmp_path, 'scripts', 'mem_len=0,16')
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and "scripts is a folder, and none of its .py files has SETTINGS" in err, err
    assert not (tmp_path / 'logs').exists()
