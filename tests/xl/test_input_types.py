"""
What the model's entry points take, and a run's `overrides.json` that cannot be read.

Token ids that are not a tensor (a numpy array, a list) are refused at every entry point (`forward`,
`forward_hidden`, `log_probs`, `logits`, `generation.generate`) with a `TypeError` naming the type given and the one
taken, and how to convert, as torch's own modules refuse them; never an `AttributeError` from inside the dispatcher.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from labml import lab

from labml_txl.xl.generation import generate
from labml_txl.train.runs import OVERRIDES_FILE, load_overrides
from .helpers import small_model

N_TOKEN = 40
REPO = Path(__file__).resolve().parents[2]


def ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, N_TOKEN, size=(5, 2))


ENTRY_POINTS = {
    'forward': lambda model, data: model(data, torch.as_tensor(ids(1))),
    'forward_hidden': lambda model, data: model.forward_hidden(data),
    'log_probs': lambda model, data: model.log_probs(data),
    'logits': lambda model, data: model.logits(data),
    'generate': lambda model, data: generate(model, data, 2),
}


@pytest.mark.parametrize('entry', sorted(ENTRY_POINTS))
@pytest.mark.parametrize('given, type_name', [(ids(), 'numpy.ndarray'), (ids().tolist(), 'list')])
def test_ids_that_are_not_a_tensor_are_refused_naming_both_types(entry, given, type_name):
    model = small_model()
    with pytest.raises(TypeError) as info:
        ENTRY_POINTS[entry](model, given)
    message = str(info.value)
    assert f'got {type_name}' in message and 'torch.Tensor' in message and 'torch.as_tensor' in message, message


def test_a_target_that_is_not_a_tensor_is_refused_naming_both_types():
    model = small_model()
    with pytest.raises(TypeError, match='target must be a torch.Tensor.*got numpy.ndarray.*torch.as_tensor'):
        model(torch.as_tensor(ids()), ids(1))


def test_the_same_ids_as_a_tensor_are_taken():
    model = small_model()
    loss, *_ = model(torch.as_tensor(ids()), torch.as_tensor(ids(1)))
    assert loss.shape == (5, 2)
    assert generate(model, torch.as_tensor(ids()), 2).shape == (2, 2)


# -- overrides.json --

@pytest.mark.parametrize('content, wrong', [
    ('{\n"d_model": 128,\n}', 'is not JSON'),
    ('{"d_model": 12', 'is not JSON'),
    ('[["d_model", 128]]', 'holds a list'),
    (b'\xff\xfe{}', 'is not JSON'),
])
def test_an_overrides_file_that_cannot_be_read_is_an_error_naming_it(tmp_path, content, wrong):
    path = tmp_path / OVERRIDES_FILE
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_overrides(tmp_path)
    message = str(info.value)
    assert str(path) in message and wrong in message and 'JSON object' in message and '\n' not in message, message


def test_an_overrides_file_is_read(tmp_path):
    (tmp_path / OVERRIDES_FILE).write_text(json.dumps({'d_model': 128, 'preset': 'none'}))
    assert load_overrides(tmp_path) == {'d_model': 128, 'preset': 'none'}


@pytest.fixture
def lab_dir(tmp_path):
    lab.configure({'path': str(tmp_path)})
    yield tmp_path
    lab.configure({'path': str(REPO)})


def test_resuming_a_run_with_a_damaged_overrides_file_is_one_error_naming_it(lab_dir, capsys):
    """Before: `error: Expecting property name enclosed in double quotes: line 3 column 1 (char 17)`, no file."""
    sys.path.insert(0, str(REPO / 'experiments'))
    import train_xl
    path = lab_dir / 'logs' / 'transformer_xl' / 'damaged' / OVERRIDES_FILE
    path.parent.mkdir(parents=True)
    path.write_text('{\n"d_model": 16,\n}\n')
    assert train_xl.main(['resume=damaged']) == 2
    err = capsys.readouterr().err.strip('\n').split('\n')
    assert len(err) == 1 and err[0].startswith(f'error: {path} is not JSON (Expecting '), err
