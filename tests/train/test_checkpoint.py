"""Checkpoints: atomic writes, fall-back past a corrupt file, and errors that name the file."""
import pytest
import torch

from labml_txl.train.checkpoint import (CheckpointError, checkpoint_steps, load_latest_checkpoint, load_model_state,
                                        save_checkpoint)


def test_saves_and_keeps_only_the_newest(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {'step': step, 'x': torch.full((3,), float(step))})
    assert checkpoint_steps(tmp_path) == [20, 30]
    step, state = load_latest_checkpoint(tmp_path)
    assert step == 30 and torch.equal(state['x'], torch.full((3,), 30.0))
    assert not list(tmp_path.rglob('*.tmp'))


@pytest.mark.parametrize('damage', ['truncate', 'garbage'])
def test_corrupt_newest_checkpoint_is_named_and_the_previous_used(tmp_path, damage):
    save_checkpoint(tmp_path, 1, {'step': 1})
    newest = save_checkpoint(tmp_path, 2, {'step': 2, 'big': torch.randn(1000)})
    data = newest.read_bytes()
    newest.write_bytes(data[:len(data) // 2] if damage == 'truncate' else b'not a checkpoint' * 10)
    with pytest.warns(RuntimeWarning, match=rf"checkpoint {newest} cannot be read.*falling back"):
        step, state = load_latest_checkpoint(tmp_path)
    assert step == 1 and state == {'step': 1}


def test_all_corrupt_is_an_error(tmp_path):
    path = save_checkpoint(tmp_path, 5, {'step': 5})
    path.write_bytes(b'')
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError, match=r"no readable checkpoint.*\[5\]"):
        load_latest_checkpoint(tmp_path)


def test_no_checkpoint_is_none(tmp_path):
    assert load_latest_checkpoint(tmp_path / 'absent') is None


def test_checkpoint_of_another_shape_names_the_tensor_and_both_shapes():
    saved = torch.nn.Linear(4, 3).state_dict()
    with pytest.raises(CheckpointError, match=r"run-x is from a model of another shape: weight has shape \[3, 4\] "
                                              r"in the checkpoint but \[5, 4\] in the model"):
        load_model_state(torch.nn.Linear(4, 5), saved, 'run-x')
