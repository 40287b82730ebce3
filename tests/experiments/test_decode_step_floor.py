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
from tolerance import rounding_bound  # noqa: E402


def step_rounding_bound(cfg: floor.BenchConfig) -> float:
    """tolerance.py's rule 2 for two float32 computations of one token's step (the lean step runs only in float32),
    each within `rounding_bound` of the exact one: the rounded additions on the longest path (per layer: the
    projections, the scores, the softmax's sum and the weights times the values over the memory and the token, the
    output, two layer norms of two passes each, the feed-forward's two; then the softmax layer and its log-softmax),
    of the size of the log-probabilities (`measure`'s model, memory and token)."""
    klen = cfg.gen_context + 1
    per_layer = (cfg.d_model + cfg.d_head + 2 * klen + cfg.n_head * cfg.d_head + 2 * (2 * cfg.d_model)
                 + cfg.d_model + cfg.d_inner)
    depth = cfg.n_layer * per_layer + cfg.d_model + cfg.n_token
    model = floor.make_xl(cfg, mem_len=cfg.gen_context).eval()
    prompt = torch.randint(cfg.n_token, (cfg.gen_context, 1), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, mems = model.log_probs(prompt, None)
        log_probs, _ = model.log_probs(torch.tensor([[3]]), mems)
    return 2 * rounding_bound(torch.float32, depth, max(1.0, log_probs.abs().max().item()))


def test_the_lean_step_is_the_models_step_and_every_contender_is_timed():
    seconds = floor.measure(floor.QUICK, compile_step=False, repeats=2)
    contenders = ['model step', 'model step, layers by their modules', 'lean step', 'products alone']
    assert set(seconds) == set(contenders) | {'max |lean - model|'}
    assert seconds['max |lean - model|'] <= step_rounding_bound(floor.QUICK)
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
