"""Checkpoints: atomic writes, checksums that find damage anywhere, fall-back past a corrupt checkpoint, a format that
runs no code when loaded, and errors that name the file."""
import errno
import json
import random
import struct

import pytest
import torch

from labml_txl.train import checkpoint as checkpoint_module
from labml_txl.train.checkpoint import (CHECKSUMS_FILE, STATE_FILE, TENSORS_FILE, CheckpointError, checkpoint_steps,
                                        load_latest_checkpoint, load_model_state, read_checkpoint, save_checkpoint)


def _training_like_state():
    """What a trainer saves: weights with a tied pair, Adam's state keyed by integers, a schedule, RNG states."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7))
    model[1].weight = model[0].weight
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.tensor([1, 2])).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    return {'step': 3, 'best_valid': None, 'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
            'scheduler': scheduler.state_dict(), 'mems': [torch.randn(2, 3, 4), torch.randn(2, 3, 4).double()],
            'rng': {'torch': torch.get_rng_state(), 'python': random.getstate()}, 'nested': ((1, 2.5), [None])}


def _assert_same(a, b, path='state'):
    """Equal values of the same types (an OrderedDict, such as a state_dict, comes back as a dict in its order)."""
    assert type(a) is type(b) or isinstance(a, dict) and type(b) is dict, (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            _assert_same(a[key], b[key], f'{path}[{key!r}]')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f'{path}[{i}]')
    else:
        assert a == b, (path, a, b)


def test_a_training_state_comes_back_equal(tmp_path):
    state = _training_like_state()
    assert state['scheduler']['best'] == float('inf')
    folder = save_checkpoint(tmp_path, 3, state)
    _assert_same(state, read_checkpoint(folder))
    # The state file is strict JSON (no Infinity or NaN tokens): any JSON reader parses it
    json.loads((folder / STATE_FILE).read_text(), parse_constant=lambda token: pytest.fail(token))


def test_loading_runs_no_pickle(tmp_path, monkeypatch):
    folder = save_checkpoint(tmp_path, 1, _training_like_state())
    monkeypatch.setattr(torch, 'load', lambda *a, **k: pytest.fail('torch.load (pickle) was called'))
    monkeypatch.setattr('pickle.loads', lambda *a, **k: pytest.fail('pickle was called'))
    assert read_checkpoint(folder)['step'] == 3


def test_saves_and_keeps_only_the_newest(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {'step': step, 'x': torch.full((3,), float(step))})
    assert checkpoint_steps(tmp_path) == [20, 30]
    step, state = load_latest_checkpoint(tmp_path)
    assert step == 30 and torch.equal(state['x'], torch.full((3,), 30.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ['20', '30']


def test_keep_none_keeps_every_checkpoint(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {'x': torch.full((3,), float(step))}, keep=None)
    assert checkpoint_steps(tmp_path) == [10, 20, 30]
    assert torch.equal(read_checkpoint(tmp_path / '10')['x'], torch.full((3,), 10.0))


def _tensor_data_offset(path, name):
    """Where tensor `name`'s bytes start in a safetensors file (8-byte header length, JSON header, data)."""
    raw = path.read_bytes()
    (header_length,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8:8 + header_length])
    return 8 + header_length + header[name]['data_offsets'][0]


def _overwrite(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize('damage', ['64 bytes of a weight', 'one digit of the state', 'truncated', 'garbage',
                                    'checksums lost'])
def test_damage_anywhere_is_named_and_the_previous_checkpoint_used(tmp_path, damage):
    save_checkpoint(tmp_path, 1, {'step': 1, 'weight': torch.zeros(100)})
    newest = save_checkpoint(tmp_path, 2, {'step': 2, 'weight': torch.randn(100)})
    tensors, state = newest / TENSORS_FILE, newest / STATE_FILE
    if damage == '64 bytes of a weight':
        _overwrite(tensors, _tensor_data_offset(tensors, 't0') + 40, bytes(range(64)))
        named = tensors
    elif damage == 'one digit of the state':
        state.write_text(state.read_text().replace('"step": 2', '"step": 3'))
        named = state
    elif damage == 'truncated':
        tensors.write_bytes(tensors.read_bytes()[:len(tensors.read_bytes()) // 2])
        named = tensors
    elif damage == 'garbage':
        tensors.write_bytes(b'not a checkpoint' * 10)
        named = tensors
    else:
        (newest / CHECKSUMS_FILE).write_text('')
        named = newest
    with pytest.warns(RuntimeWarning, match=rf"checkpoint {named}.*falling back to the previous"):
        step, loaded = load_latest_checkpoint(tmp_path)
    assert step == 1 and torch.equal(loaded['weight'], torch.zeros(100))


def test_all_corrupt_is_an_error(tmp_path):
    folder = save_checkpoint(tmp_path, 5, {'step': 5})
    (folder / STATE_FILE).write_bytes(b'')
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError, match=r"no readable checkpoint.*\[5\]"):
        load_latest_checkpoint(tmp_path)


def test_no_checkpoint_is_none(tmp_path):
    assert load_latest_checkpoint(tmp_path / 'absent') is None


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {'step': 1})
    write = checkpoint_module._write

    def full_disk(path, data):
        if path.name == TENSORS_FILE:
            raise OSError(errno.ENOSPC, 'No space left on device')
        write(path, data)

    monkeypatch.setattr(checkpoint_module, '_write', full_disk)
    with pytest.raises(CheckpointError, match=r"could not write the checkpoint of step 2 .*No space left on device "
                                              r"\(the disk is full: free space, then resume the run\); the "
                                              r"checkpoint of step 1 is intact"):
        save_checkpoint(tmp_path, 2, {'step': 2, 'x': torch.ones(3)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ['1']
    assert load_latest_checkpoint(tmp_path) == (1, {'step': 1})


def test_a_save_killed_part_way_leaves_the_previous_checkpoints(tmp_path):
    """A folder being written is not a checkpoint until it is renamed; the next save removes it."""
    save_checkpoint(tmp_path, 1, {'step': 1})
    unfinished = tmp_path / '.partial-2-12345'
    unfinished.mkdir()
    (unfinished / TENSORS_FILE).write_bytes(b'half')
    assert checkpoint_steps(tmp_path) == [1] and load_latest_checkpoint(tmp_path) == (1, {'step': 1})
    save_checkpoint(tmp_path, 3, {'step': 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ['1', '3']


class _RunsCode:
    def __reduce__(self):
        return (print, ('this ran while loading',))


def test_checkpoints_of_the_earlier_format_load_as_data_only(tmp_path):
    (tmp_path / '4').mkdir()
    torch.save({'step': 4, 'x': torch.ones(2)}, tmp_path / '4' / 'checkpoint.pt')
    step, state = load_latest_checkpoint(tmp_path)
    assert step == 4 and torch.equal(state['x'], torch.ones(2))
    torch.save({'step': 5, 'payload': _RunsCode()}, tmp_path / '4' / 'checkpoint.pt')
    with pytest.raises(CheckpointError, match=r"checkpoint .*4 cannot be read \(UnpicklingError"):
        read_checkpoint(tmp_path / '4')


def test_checkpoint_of_another_shape_names_the_tensor_and_both_shapes():
    saved = torch.nn.Linear(4, 3).state_dict()
    with pytest.raises(CheckpointError, match=r"run-x is from a model of another shape: weight has shape \[3, 4\] "
                                              r"in the checkpoint but \[5, 4\] in the model"):
        load_model_state(torch.nn.Linear(4, 5), saved, 'run-x')


@pytest.mark.parametrize('loss', ['missing', 'a folder', 'not text'])
def test_a_checkpoint_without_readable_checksums_is_named_and_the_previous_used(tmp_path, loss):
    """Before: a folder without `SHA256SUMS` was passed over without a word."""
    save_checkpoint(tmp_path, 1, {'step': 1, 'weight': torch.zeros(4)})
    newest = save_checkpoint(tmp_path, 2, {'step': 2, 'weight': torch.ones(4)})
    (newest / CHECKSUMS_FILE).unlink()
    if loss == 'a folder':
        (newest / CHECKSUMS_FILE).mkdir()
    elif loss == 'not text':
        (newest / CHECKSUMS_FILE).write_bytes(b'\xff\xfe\x00garbage')
    reason = r"has no SHA256SUMS" if loss == 'missing' else r"cannot be read"
    with pytest.warns(RuntimeWarning, match=rf"checkpoint {newest} {reason}.*falling back to the previous"):
        step, loaded = load_latest_checkpoint(tmp_path)
    assert step == 1 and torch.equal(loaded['weight'], torch.zeros(4))


def test_only_checkpoints_without_checksums_is_an_error_naming_them(tmp_path):
    (save_checkpoint(tmp_path, 5, {'step': 5}) / CHECKSUMS_FILE).unlink()
    with pytest.warns(RuntimeWarning, match=r"has no SHA256SUMS"), \
            pytest.raises(CheckpointError, match=r"no readable checkpoint.*\[5\]"):
        load_latest_checkpoint(tmp_path)


def test_a_checkpoint_that_does_not_verify_is_set_aside_not_overwritten(tmp_path):
    """Before: a save of the same step removed the folder, whose files may well be intact, without a word."""
    save_checkpoint(tmp_path, 1, {'step': 1})
    unverified = save_checkpoint(tmp_path, 2, {'step': 2, 'weight': torch.ones(4)})
    (unverified / CHECKSUMS_FILE).unlink()
    kept = {p.name: p.read_bytes() for p in unverified.iterdir()}
    with pytest.warns(RuntimeWarning, match=rf"checkpoint {unverified} has no SHA256SUMS.*it is kept as "
                                            rf"{unverified}\.unverified instead of being overwritten"):
        save_checkpoint(tmp_path, 2, {'step': 2, 'weight': torch.zeros(4)})
    assert {p.name: p.read_bytes() for p in (tmp_path / '2.unverified').iterdir()} == kept
    assert torch.equal(read_checkpoint(tmp_path / '2')['weight'], torch.zeros(4))
    # A second one goes beside the first
    (unverified / CHECKSUMS_FILE).unlink()
    with pytest.warns(RuntimeWarning, match=rf"kept as {unverified}\.unverified-2 "):
        save_checkpoint(tmp_path, 2, {'step': 2})
    assert checkpoint_steps(tmp_path) == [1, 2]
