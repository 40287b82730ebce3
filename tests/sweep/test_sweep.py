"""
`python -m labml_txl.sweep` on tiny train_xl runs, as a user runs it: a 2 x 2 sweep stopped by Ctrl-C in its second
run and started again ends with four runs (none repeated, the stopped one resumed under its own UUID), the
comparison table and the plot; bad settings are refused before the first run.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labml_txl.runs.records import load_runs
from labml_txl.train.run_start import SWEEP_ENV

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


def test_a_sweep_stopped_and_started_again_ends_with_every_run_once(tmp_path):
    process = _sweep(tmp_path, TRAIN_XL, *GRID, *TINY, start_new_session=True)
    # Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the second run has a checkpoint
    deadline = time.time() + 240
    while time.time() < deadline:
        runs = _runs(tmp_path)
        if len(runs) == 2 and any((runs[1].path / 'checkpoints').glob('*/SHA256SUMS')):
            break
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    else:
        pytest.fail('the second run did not save a checkpoint in time')
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
