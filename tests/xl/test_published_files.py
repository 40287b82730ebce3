"""
The files of a published model that cannot be used, as a user meets them: a `model.safetensors` or
`pytorch_model.bin` cut short or damaged, a pickle that asks for code, a disk that fills while `save_pretrained`
writes. Each is one `error:` line that names the file, and exit code 2, from `eval_xl.py` (through `run_script`,
as every script), never a traceback; a failed save leaves the folder as it was.
"""
import errno
import json
import pickle
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from labml_txl.xl import MemTransformerLM
from labml_txl.xl.formats.hf import BIN_FILE, CONFIG_FILE, SAFETENSORS_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import eval_xl  # noqa: E402


class CodeToRun:
    """A class a pickle names: unpickling it would import this module and call the class."""


def tiny_model(seed: int = 0) -> MemTransformerLM:
    torch.manual_seed(seed)
    return MemTransformerLM(n_token=20, n_layer=1, n_head=2, d_model=8, d_head=4, d_inner=16, dropout=0.0,
                            dropatt=0.0, tgt_len=4, mem_len=4).eval()


@pytest.fixture
def folder(tmp_path) -> Path:
    """A Hugging Face folder of a tiny model, as `save_pretrained` writes it (no vocabulary: the model is read
    first, and fails first)."""
    path = tmp_path / 'model'
    tiny_model().save_pretrained(path)
    return path


def as_bin(folder: Path) -> Path:
    """The folder's weights as Hugging Face's older `pytorch_model.bin` (a `torch.save` of the state_dict)."""
    tensors = safetensors.torch.load_file(str(folder / SAFETENSORS_FILE))
    (folder / SAFETENSORS_FILE).unlink()
    torch.save(tensors, folder / BIN_FILE)
    return folder / BIN_FILE


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def one_error_line(capsys, argv) -> str:
    """The single `error:` line `eval_xl.py` prints for `argv`, checking the exit code is 2."""
    assert eval_xl.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip('\n').split('\n')
    assert len(lines) == 1 and lines[0].startswith('error: '), err
    return lines[0]


def test_a_truncated_safetensors_file_is_one_error_naming_it(folder, capsys):
    weights = folder / SAFETENSORS_FILE
    # Cut in the header (the user's case: "incomplete metadata"), then in the tensors' data
    for keep in (20, weights.stat().st_size - 100):
        truncate(weights, keep)
        line = one_error_line(capsys, [f'pretrained={folder}'])
        assert str(weights) in line and 'truncated or damaged' in line, line
        tiny_model().save_pretrained(folder)


def test_a_damaged_safetensors_file_is_one_error_naming_it(folder, capsys):
    weights = folder / SAFETENSORS_FILE
    data = bytearray(weights.read_bytes())
    # The header's JSON broken
    data[10:14] = b'\xff\xfe{{'
    weights.write_bytes(bytes(data))
    line = one_error_line(capsys, [f'pretrained={folder}'])
    assert str(weights) in line and 'truncated or damaged' in line, line


def test_a_truncated_or_damaged_bin_file_is_one_error_naming_it(folder, capsys):
    weights = as_bin(folder)
    full = weights.read_bytes()
    for damaged in (full[:len(full) // 2], b'not a torch.save file at all'):
        weights.write_bytes(damaged)
        line = one_error_line(capsys, [f'pretrained={folder}'])
        assert str(weights) in line and 'truncated or damaged' in line, line


def test_a_bin_file_that_asks_for_code_is_one_error_naming_it(folder, capsys):
    weights = as_bin(folder)
    state = torch.load(weights, weights_only=True)
    state['transformer.extra'] = CodeToRun()
    torch.save(state, weights)
    line = one_error_line(capsys, [f'pretrained={folder}'])
    assert str(weights) in line and f'{__name__}.CodeToRun' in line and 'refused' in line, line


def test_a_vocabulary_that_asks_for_code_is_one_error_naming_it(folder, capsys):
    vocab = folder / 'vocab.pkl'
    vocab.write_bytes(pickle.dumps({'idx2sym': ['a'], 'sym2idx': {'a': 0}, 'special': CodeToRun()}))
    line = one_error_line(capsys, [f'pretrained={folder}'])
    assert str(vocab) in line and f'{__name__}.CodeToRun' in line and 'refused' in line, line
    # The same through vocab=PATH, a file elsewhere
    elsewhere = folder.parent / 'cache.pkl'
    vocab.rename(elsewhere)
    line = one_error_line(capsys, [f'pretrained={folder}', f'vocab={elsewhere}'])
    assert str(elsewhere) in line and 'refused' in line, line


# How a full disk fails the write of the weights: as Python's OSError, or as safetensors' own error (what the
# user saw: safetensors 0.4 wraps the OS error in its message)
FULL_DISK_ERRORS = {
    'OSError': lambda filename: OSError(errno.ENOSPC, 'No space left on device', filename),
    'SafetensorError': lambda filename: safetensors.SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
}


@pytest.fixture(params=sorted(FULL_DISK_ERRORS))
def full_disk(request, monkeypatch):
    """Every write of the weights fails as on a full disk (ENOSPC), after writing part of the file."""
    def save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b'\0' * 10)
        raise FULL_DISK_ERRORS[request.param](filename)
    monkeypatch.setattr(safetensors.torch, 'save_file', save_file)


def test_a_full_disk_during_save_pretrained_leaves_no_folder(tmp_path, full_disk):
    target = tmp_path / 'new' / 'model'
    with pytest.raises(OSError) as info:
        tiny_model().save_pretrained(target)
    message = str(info.value)
    assert '\n' not in message and str(target) in message and 'No space left on device' in message, message
    assert 'writing model.safetensors failed' in message and 'no folder is left' in message, message
    assert info.value.errno == errno.ENOSPC
    # Nothing left behind: not the folder, not the parent made for it, no temporary folder
    assert sorted(tmp_path.iterdir()) == []


def test_a_full_disk_during_save_pretrained_keeps_the_model_there(folder, full_disk):
    (folder / 'vocab.pkl').write_bytes(pickle.dumps({'idx2sym': [], 'sym2idx': {}}))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(OSError, match='No space left on device') as info:
        tiny_model(seed=1).save_pretrained(folder)
    assert str(folder) in str(info.value) and 'the folder is left as it was' in str(info.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ['model']
    # The model there still loads
    assert MemTransformerLM.from_pretrained(folder).n_token == 20


def test_save_pretrained_replaces_the_model_in_a_folder(folder):
    """The temporary folder's files replace those of an earlier save; other files (the vocabulary) stay."""
    (folder / 'vocab.pkl').write_bytes(b'kept')
    model = tiny_model(seed=1)
    model.save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == [CONFIG_FILE, SAFETENSORS_FILE, 'vocab.pkl']
    assert sorted(p.name for p in folder.parent.iterdir()) == ['model']
    assert (folder / 'vocab.pkl').read_bytes() == b'kept'
    loaded = MemTransformerLM.from_pretrained(folder)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    assert json.loads((folder / CONFIG_FILE).read_text())['n_layer'] == 1
