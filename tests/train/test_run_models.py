"""
The models of a labml run (labml 0.4's add_pytorch_models / save_checkpoint / load, `labml_txl.train.run_models`):
saved into the run's checkpoints at the global step, loaded by run UUID from the newest or a given one, and every
mistake an exception before the run starts. These call the functions directly: labml itself is left unchanged
(`labml_txl.compat`, which puts them on labml, is tested with labml_nn's own scripts in tests/test_compat.py).
"""
from pathlib import Path

import pytest
import torch
from labml import experiment, lab, tracker

from labml_txl.train import run_models
from labml_txl.train.checkpoint import CheckpointError, checkpoint_steps, read_checkpoint
from labml_txl.train.runs import RunNotFoundError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab_dir(tmp_path):
    lab.configure({'path': str(tmp_path)})
    yield tmp_path
    lab.configure({'path': str(REPO)})


def _model(width: int = 4) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.LayerNorm(width))


def _trained_run(uuid: str, steps_and_scales) -> dict:
    """A finished run `uuid` that saved model 'model' at each step, its weights scaled by the step's scale;
    returns each step's state dict as saved."""
    experiment.create(name='compat', uuid=uuid, writers=set())
    model = _model()
    run_models.add_pytorch_models({'model': model})
    saved = {}
    with run_models.start():
        for step, scale in steps_and_scales:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(scale)
            tracker.set_global_step(step)
            run_models.save_checkpoint()
            saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
    return saved


def _equal(state, model):
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_saves_at_the_global_step_and_loads_the_newest_or_the_given_one(lab_dir):
    saved = _trained_run('first', [(10, 1.0), (20, 2.0)])
    folder = lab_dir / 'logs' / 'compat' / 'first' / 'checkpoints'
    assert checkpoint_steps(folder) == [10, 20]  # every checkpoint kept, as labml 0.4 kept them
    assert set(read_checkpoint(folder / '10')['models']) == {'model'}

    for checkpoint, step in ((None, 20), (-1, 20), (10, 10)):
        experiment.create(name='compat', writers=set())
        model = _model()
        run_models.add_pytorch_models(model=model)  # the keyword form
        run_models.load('first', checkpoint)
        assert not _equal(saved[step], model)
        run_models.start()
        assert _equal(saved[step], model)
        assert experiment_run().start_step == step and experiment_run().load_run == 'first'


def experiment_run():
    from labml.internal.experiment import experiment_singleton
    return experiment_singleton().run


def test_a_model_registered_after_start_or_after_load_is_loaded(lab_dir):
    saved = _trained_run('source', [(5, 3.0)])
    experiment.create(name='compat', writers=set())
    run_models.load('source')  # before registering, as labml_nn's sampling/experiment_tiny.py does
    early = _model()
    run_models.add_pytorch_models({'model': early})
    assert not _equal(saved[5], early)
    run_models.start()
    assert _equal(saved[5], early)

    experiment.create(name='compat', writers=set())
    run_models.load('source')
    run_models.start()
    late = _model()
    run_models.add_pytorch_models({'model': late})
    assert _equal(saved[5], late)


def test_a_completed_block_saves_and_a_failed_one_does_not(lab_dir):
    experiment.create(name='compat', uuid='completed', writers=set())
    model = _model()
    run_models.add_pytorch_models({'model': model})
    with run_models.start():
        tracker.set_global_step(7)
    folder = lab_dir / 'logs' / 'compat' / 'completed' / 'checkpoints'
    assert checkpoint_steps(folder) == [7]
    assert _equal(read_checkpoint(folder / '7')['models']['model'], model)

    experiment.create(name='compat', uuid='failed', writers=set())
    run_models.add_pytorch_models({'model': _model()})
    with pytest.raises(ZeroDivisionError):
        with run_models.start():
            tracker.set_global_step(8)
            1 / 0
    assert not (lab_dir / 'logs' / 'compat' / 'failed' / 'checkpoints').exists()


def test_an_evaluation_session_saves_nothing(lab_dir):
    experiment.evaluate()
    run_models.add_pytorch_models({'model': _model()})
    with run_models.start():
        assert run_models.save_checkpoint() is None
    assert not list(lab_dir.rglob('checkpoints'))


def test_load_none_forgets_an_earlier_load(lab_dir):
    _trained_run('source', [(5, 3.0)])
    experiment.create(name='compat', writers=set())
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_models.add_pytorch_models({'model': model})
    run_models.load('source')
    run_models.load(None, None)
    run_models.start()
    assert _equal(before, model)


def test_a_new_experiment_forgets_the_models_and_the_load(lab_dir):
    _trained_run('source', [(5, 3.0)])
    experiment.create(name='compat', writers=set())
    run_models.add_pytorch_models({'model': _model()})
    run_models.load('source')
    experiment.create(name='compat', writers=set())
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_models.add_pytorch_models({'model': model})  # the name is free again
    run_models.start()
    assert _equal(before, model)


def test_an_unknown_run_or_step_is_an_error_naming_it(lab_dir):
    _trained_run('known', [(10, 1.0)])
    experiment.create(name='compat', writers=set())
    with pytest.raises(RunNotFoundError, match=r"run UUID 'unknown' does not exist under .*runs there: known\); "
                                                r"runs are looked for in labml's current project"):
        run_models.load('unknown')
    with pytest.raises(CheckpointError, match=r"run known has no checkpoint of step 11 .* of steps \[10\]"):
        run_models.load('known', 11)
    for run_uuid in ('', 3):
        with pytest.raises(TypeError, match='give the UUID of a run'):
            run_models.load(run_uuid)
    for checkpoint in (True, 1.5, -2):
        with pytest.raises(ValueError, match=rf"checkpoint={checkpoint!r} is not accepted"):
            run_models.load('known', checkpoint)


def test_a_run_without_checkpoints_is_an_error(lab_dir):
    experiment.create(name='compat', uuid='empty', writers=set())
    with run_models.start():
        pass
    experiment.create(name='compat', writers=set())
    with pytest.raises(CheckpointError, match='run empty has no checkpoint in'):
        run_models.load('empty')


def test_a_checkpoint_of_other_shapes_or_without_the_model_stops_the_start(lab_dir):
    _trained_run('narrow', [(10, 1.0)])
    experiment.create(name='compat', writers=set())
    run_models.add_pytorch_models({'model': _model(width=6)})
    run_models.load('narrow')
    with pytest.raises(CheckpointError, match=r"model 'model'\) is from a model of another shape: 0.weight has "
                                              r"shape \[4, 3\] in the checkpoint but \[6, 3\] in the model"):
        run_models.start()
    assert not experiment_run().run_path.exists()  # the run did not start

    experiment.create(name='compat', writers=set())
    run_models.add_pytorch_models({'generator': _model()})
    run_models.load('narrow')
    with pytest.raises(CheckpointError, match=r"has no model named 'generator': it holds \['model'\]"):
        run_models.start()


def test_registering_a_name_or_a_module_twice_is_an_error(lab_dir):
    experiment.create(name='compat', writers=set())
    model = _model()
    run_models.add_pytorch_models({'model': model})
    with pytest.raises(ValueError, match="a model named 'model' is already registered"):
        run_models.add_pytorch_models({'model': _model()})
    with pytest.raises(ValueError, match="model 'copy' is the module already registered as 'model'"):
        run_models.add_pytorch_models(copy=model)
    shared = _model()
    with pytest.raises(ValueError, match="model 'b' is the module already registered as 'a'"):
        run_models.add_pytorch_models({'a': shared, 'b': shared})
    assert list(run_models.current_run_models().models) == ['model']  # a refused call registers nothing


@pytest.mark.parametrize('args, kwargs, error, message', [
    ((), {}, ValueError, 'got no models'),
    (([torch.nn.Linear(1, 1)],), {}, TypeError, 'give a dictionary'),
    (({'model': torch.nn.Linear(1, 1)},), {'other': torch.nn.Linear(1, 1)}, TypeError, 'not both'),
    (({'model': torch.zeros(1)},), {}, TypeError, "model 'model' is a Tensor: add_pytorch_models takes "
                                                  "torch.nn.Module"),
    (({1: torch.nn.Linear(1, 1)},), {}, TypeError, 'must be a non-empty string'),
])
def test_bad_registrations_are_errors(lab_dir, args, kwargs, error, message):
    experiment.create(name='compat', writers=set())
    with pytest.raises(error, match=message):
        run_models.add_pytorch_models(*args, **kwargs)


def test_calls_out_of_order_are_errors(lab_dir):
    _trained_run('source', [(5, 3.0)])
    experiment.create(name='compat', writers=set())
    run_models.add_pytorch_models({'model': _model()})
    with pytest.raises(RuntimeError, match=r'save_checkpoint\(\) was called outside a started run'):
        run_models.save_checkpoint()
    with run_models.start():
        with pytest.raises(RuntimeError, match=r'load\(\) was called after experiment.start\(\)'):
            run_models.load('source')

    experiment.create(name='compat', writers=set())
    with run_models.start():
        with pytest.raises(RuntimeError, match='there are no models to save'):
            run_models.save_checkpoint()
