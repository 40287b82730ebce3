"""
Two CPU processes under torchrun (gloo), each on half of every batch's columns, end with the parameters of one
process trained on the whole global batch: both in float64 (the default dtype while they build and train), the
same function (tests/tolerance.py's rule 1).
"""
import json
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from labml import lab

from tolerance import SAME_FUNCTION, assert_same_function

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import train_xl  # noqa: E402

OVERRIDES = {'n_layer': 2, 'd_model': 32, 'n_head': 2, 'd_head': 16, 'd_inner': 64, 'dropout': 0.0,
             'tgt_len': 12, 'mem_len': 12, 'batch_size': 8, 'batch_chunk': 2, 'max_step': 6, 'eval_interval': 3,
             'max_eval_steps': 2, 'checkpoint_interval': 3, 'device': 'cpu',
             # SGD keeps the comparison about the gradients: Adam divides by sqrt(v), which turns float32 rounding
             # in a near-zero gradient (summed in another order across processes) into a visible step
             'optimizer': 'sgd', 'lr': 0.1, 'mom': 0.9}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# With a compressed memory, whose first step compresses nothing (its memory is not full yet): the compression's
# parameters take part in every step all the same, as DistributedDataParallel needs
COMPRESSIVE = {'cmem_len': 4, 'compression_rate': 2}


@pytest.mark.parametrize('extra', [{}, COMPRESSIVE], ids=['memory', 'compressed_memory'])
def test_two_processes_equal_one_process_on_the_global_batch(tmp_path, extra):
    overrides = {**OVERRIDES, **extra}
    out = tmp_path / 'rank0.pt'
    (tmp_path / 'lab').mkdir()
    (tmp_path / 'single').mkdir()
    script = tmp_path / 'worker.py'
    script.write_text(textwrap.dedent(f'''
        import sys, torch
        sys.path.insert(0, {str(REPO / 'experiments')!r})
        from labml import lab
        lab.configure({{'path': {str(tmp_path / 'lab')!r}}})
        import train_xl
        torch.set_default_dtype(torch.float64)
        trainer = train_xl.train({overrides!r}, screen=False)
        if trainer.distributed.is_main:
            torch.save({{'model': trainer.model.state_dict(), 'history': trainer.history,
                         'group_left': not torch.distributed.is_initialized(),
                         'checkpoints': sorted(p.name for p in trainer.checkpoint_dir.iterdir())}}, {str(out)!r})
    '''))
    launched = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
                               '--master_addr', '127.0.0.1', '--master_port', str(_free_port()), str(script)],
                              capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    distributed = torch.load(out, weights_only=False)

    lab.configure({'path': str(tmp_path / 'single')})
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        single = train_xl.train(dict(overrides), screen=False)
    finally:
        torch.set_default_dtype(default_dtype)
        lab.configure({'path': str(REPO)})
    assert single.model.layers[0].dec_attn.qkv_net.weight.dtype == torch.float64
    for name, param in single.model.state_dict().items():
        if param.dtype == torch.float64:
            assert_same_function(distributed["model"][name], param, msg=lambda m: f"{name}: {m}")
        else:
            # (the sinusoids' frequencies, a float32 buffer computed alike in both)
            assert name.endswith('inv_freq') and torch.equal(distributed["model"][name], param), name
    # The loss each step reports is the mean over the whole batch on every rank
    assert len(distributed['history']) == len(single.history) > 0
    for (step, loss), (single_step, single_loss) in zip(distributed['history'], single.history):
        assert step == single_step and abs(loss - single_loss) <= SAME_FUNCTION * max(1.0, abs(single_loss))
    # Only rank 0 wrote checkpoints
    assert distributed['checkpoints'] == ['3', '6']
    # The run left the process group: a process that exits with gloo's threads running can abort at exit
    assert distributed['group_left']
    assert not list((tmp_path / 'lab').glob('logs/*/*.1/checkpoints'))


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SIGTERM reaches rank 1 only, during step 4: both ranks finish step 4, rank 0 writes its checkpoint with
    every column's memories, both exit 143; the run then resumes from step 4 in one process."""
    (tmp_path / 'lab').mkdir()
    script = tmp_path / 'worker.py'
    script.write_text(textwrap.dedent(f'''
        import json, os, signal, sys
        sys.path.insert(0, {str(REPO / 'experiments')!r})
        from labml import lab
        lab.configure({{'path': {str(tmp_path / 'lab')!r}}})
        from labml_txl.train.interruption import TrainingInterrupted
        from labml_txl.train.trainer import Trainer
        train_window = Trainer.train_window
        def signalled_train_window(self, segments):
            if self.step + 1 == 4 and self.distributed.rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return train_window(self, segments)
        Trainer.train_window = signalled_train_window
        import train_xl
        rank = os.environ['RANK']
        try:
            train_xl.train({OVERRIDES!r}, screen=False)
        except TrainingInterrupted as stopped:
            record = {{'step': stopped.step, 'signal': stopped.signal_number,
                       'checkpoint': str(stopped.checkpoint) if stopped.checkpoint else None}}
            open({str(tmp_path)!r} + f'/rank{{rank}}.json', 'w').write(json.dumps(record))
            sys.exit(stopped.exit_code)
    '''))
    launched = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
                               '--master_addr', '127.0.0.1', '--master_port', str(_free_port()), str(script)],
                              capture_output=True, text=True, timeout=300)
    assert launched.returncode != 0
    records = [json.loads((tmp_path / f'rank{rank}.json').read_text()) for rank in (0, 1)]
    assert [(r['step'], r['signal']) for r in records] == [(4, signal.SIGTERM)] * 2, launched.stderr[-3000:]
    checkpoint = Path(records[0]['checkpoint'])
    assert checkpoint.name == '4' and checkpoint.parents[1].name.endswith('.0') and records[1]['checkpoint'] is None
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ['3', '4']
    run_uuid = checkpoint.parents[1].name[:-len('.0')]

    lab.configure({'path': str(tmp_path / 'lab')})
    try:
        resumed = train_xl.train({}, resume=run_uuid, screen=False)
    finally:
        lab.configure({'path': str(REPO)})
    assert [step for step, _ in resumed.history] == [5, 6]
