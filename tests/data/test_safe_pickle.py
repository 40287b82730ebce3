"""The restricted unpickler: plain data and torch.save files come back equal; anything that would run code is
refused, named, and does not run."""
import builtins
import os
import pickle
import sys
from collections import Counter, OrderedDict

import numpy as np
import pytest
import torch

from labml_txl.data.files import DataFileFormatError, MissingDataFileError
from labml_txl.data.safe_pickle import ForbiddenGlobalError, NumpyArray, load_file, loads

PLAIN = {
    'list': [1, 2.5, None, True, False], 'tuple': (1, 'a', ()), 'set': {1, 2, 3}, 'frozenset': frozenset({'x'}),
    'bytes': b'\x00\xff\x80', 'empty bytes': b'', 'str': 'café 東京', 'big int': 2 ** 80, 'negative': -3,
    'float': -1.5e-300, 'counter': Counter('abracadabra'), 'ordered': OrderedDict([('b', 1), ('a', 2)]),
    'nested': {'k': [{'x': (1, [2])}], 3: 'int key'},
}


@pytest.mark.parametrize('protocol', range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_comes_back_equal_at_every_protocol(protocol):
    loaded = loads(pickle.dumps(PLAIN, protocol=protocol))
    assert loaded == PLAIN
    assert type(loaded['counter']) is Counter and type(loaded['ordered']) is OrderedDict
    assert list(loaded['ordered']) == ['b', 'a']


def test_torch_save_files_come_back_equal_zip_and_legacy(tmp_path):
    data = {'ids': torch.arange(10), 'x': torch.randn(3, 4), 'counter': Counter('hello'), 'plain': PLAIN}
    for legacy in (False, True):
        path = tmp_path / f'data-{legacy}.pt'
        torch.save(data, path, _use_new_zipfile_serialization=not legacy)
        loaded = load_file(path)
        assert torch.equal(loaded['ids'], data['ids']) and torch.equal(loaded['x'], data['x'])
        assert loaded['counter'] == data['counter'] and loaded['plain'] == PLAIN


class SystemCall:
    """A pickle that runs a shell command when loaded by `pickle`."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class Eval:
    """A pickle that evaluates Python source when loaded by `pickle`."""

    def __init__(self, source):
        self.source = source

    def __reduce__(self):
        return builtins.eval, (self.source,)


def touch(path):
    return f"open({str(path)!r}, 'w').write('ran')"


def test_a_reduce_calling_os_system_is_refused_named_and_not_run(tmp_path):
    marker = tmp_path / 'ran'
    for protocol in (0, 2, 4):
        data = pickle.dumps({'vocab': [1, SystemCall(f'touch {marker}')]}, protocol=protocol)
        with pytest.raises(ForbiddenGlobalError) as info:
            loads(data)
        assert (info.value.module, info.value.name) == (os.system.__module__, 'system')
        assert f"{os.system.__module__}.system" in str(info.value) and 'collections.Counter' in str(info.value)
    # the same protocol-0 call spelled with the INST opcode
    with pytest.raises(ForbiddenGlobalError, match='os.system'):
        loads(b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n.")
    assert not marker.exists()
    # the control: pickle itself runs it
    pickle.loads(pickle.dumps(SystemCall(f'touch {marker}')))
    assert marker.exists()


def test_builtins_eval_and_getattr_are_refused_and_not_run(tmp_path):
    marker = tmp_path / 'ran'
    with pytest.raises(ForbiddenGlobalError) as info:
        loads(pickle.dumps(Eval(touch(marker)), protocol=4))
    assert (info.value.module, info.value.name) == ('builtins', 'eval')
    assert 'builtins.eval' in str(info.value)
    with pytest.raises(ForbiddenGlobalError, match=r"builtins\.getattr \(module 'builtins', name 'getattr'\)"):
        loads(b'\x80\x02cbuiltins\ngetattr\n.')
    assert not marker.exists()


def test_a_module_a_pickle_names_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / 'imported'
    (tmp_path / 'module_with_side_effect.py').write_text(f"{touch(marker)}\ndef f(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ForbiddenGlobalError, match='module_with_side_effect.f'):
        loads(b'\x80\x02cmodule_with_side_effect\nf\n)R.')
    assert not marker.exists() and 'module_with_side_effect' not in sys.modules


@pytest.mark.parametrize('legacy', [False, True])
def test_code_in_a_torch_save_file_is_refused_naming_the_file(tmp_path, legacy):
    marker, path = tmp_path / 'ran', tmp_path / 'evil.pt'
    torch.save({'ids': torch.arange(3), 'x': Eval(touch(marker))}, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(ForbiddenGlobalError) as info:
        load_file(path)
    # torch.save writes protocol 2, which spells builtins as Python 2 did
    assert (info.value.module, info.value.name, info.value.source) == ('__builtin__', 'eval', path)
    assert str(path) in str(info.value)
    assert not marker.exists()


@pytest.mark.filterwarnings('ignore::DeprecationWarning', 'ignore:.*TorchScript archive:UserWarning')
def test_a_torchscript_archive_is_refused_before_torch_loads_it(tmp_path):
    path = tmp_path / 'scripted.pt'
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    assert isinstance(torch.load(path, weights_only=False), torch.jit.ScriptModule)  # what torch.load would do
    with pytest.raises(DataFileFormatError, match='TorchScript archive'):
        load_file(path)


ARRAYS = {
    'int64': np.arange(7, dtype=np.int64),
    'big-endian int32, 2-D': np.arange(6, dtype='>i4').reshape(2, 3),
    'Fortran order float64': np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    'uint8': np.array([0, 200, 255], dtype=np.uint8),
    'bool': np.array([True, False, True]),
    'float32 scalar array': np.array(1.25, dtype=np.float32),
    'empty int64': np.zeros((0,), dtype=np.int64),
}


@pytest.mark.parametrize('protocol', [0, 1, 2, 3, 4])
@pytest.mark.parametrize('name', list(ARRAYS))
def test_numpy_arrays_become_equal_tensors(name, protocol):
    array = ARRAYS[name]
    loaded = loads(pickle.dumps({'a': array}, protocol=protocol))['a']
    assert isinstance(loaded, NumpyArray)
    expected = torch.from_numpy(array.astype(array.dtype.newbyteorder('='), order='C'))
    assert loaded.tensor.dtype == expected.dtype and torch.equal(loaded.tensor, expected)


def test_a_numpy_object_array_is_refused():
    with pytest.raises(pickle.UnpicklingError, match="dtype 'O8' is not read"):
        loads(pickle.dumps(np.array([1, 'a'], dtype=object), protocol=2))


def test_files_that_are_not_pickles_or_not_there(tmp_path):
    text = tmp_path / 'vocab.txt'
    text.write_text('the 10\ncat 3\n')
    with pytest.raises(DataFileFormatError, match='vocab.txt could not be read as a pickle'):
        load_file(text)
    with pytest.raises(MissingDataFileError, match='missing.pkl'):
        load_file(tmp_path / 'missing.pkl')
