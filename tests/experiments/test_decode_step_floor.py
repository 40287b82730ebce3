"""
`experiments/decode_step_floor.py` on tiny sizes: its lean step computes the model's one-token step (the check before
timing passes, and catches a step that does not), and every contender is timed. No test looks at wall-clock time.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import decode_step_floor as floor  # noqa: E402


def test_the_lean_step_is_the_models_step_and_every_contender_is_timed():
    seconds = floor.measure(floor.QUICK, compile_step=False, repeats=2)
    contenders = ['model step', 'model step, layers by their modules', 'lean step', 'products alone']
    assert set(seconds) == set(contenders) | {'max |lean - model|'}
    assert seconds['max |lean - model|'] <= 1e-4
    assert all(seconds[name] > 0 for name in contenders)
    table = floor.table(seconds).splitlines()
    assert table[0] == '| one token, batch 1, full memory | median | model step / this |'
    assert [line.split(' | ')[0] for line in table[2:]] == ['| ' + name for name in contenders]


def test_a_lean_step_that_computes_something_else_is_caught_before_timing(monkeypatch):
    step = floor.LeanStep.__call__
    monkeypatch.setattr(floor.LeanStep, '__call__', lambda self, token, product: step(self, token, product) * 1.01)
    with pytest.raises(RuntimeError, match="does not compute the model's step"):
        floor.measure(floor.QUICK, compile_step=False, repeats=1)


def test_the_lean_step_is_refused_for_a_model_it_is_not_written_for():
    model = floor.make_xl(floor.QUICK, attn_type=1).eval()
    with torch.no_grad():
        _, mems = model.log_probs(torch.randint(floor.QUICK.n_token, (4, 1)), None)
    with pytest.raises(ValueError, match='attention type 0'):
        floor.LeanStep(model, mems)
