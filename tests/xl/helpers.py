"""Shared helpers of the Transformer-XL tests."""
from pathlib import Path

import torch

from labml_txl.xl import MemTransformerLM
from tolerance import assert_close_rounding, assert_same_function, xl_config, xl_depths

# Vectors computed by the original Transformer-XL code (`tests/reference/xl/README.md` says how)
REFERENCE_DIR = Path(__file__).resolve().parents[1] / 'reference' / 'xl'


def reference_files():
    """The reference vectors, or a single `None` so that a missing folder fails a test instead of skipping."""
    files = sorted(REFERENCE_DIR.glob('*.pt'))
    return files if files else [None]


def small_config(**overrides):
    """Keyword arguments of a tiny `MemTransformerLM`."""
    config = dict(n_token=40, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  tgt_len=5, ext_len=0, mem_len=5)
    config.update(overrides)
    return config


def plain_and_fast(**overrides):
    """Two tiny `MemTransformerLM`s with the same weights (seed 0): the plain path (`impl='reference'`, the
    original's computation) and the fast one (`impl='auto'`, the dispatcher's choice), in training mode."""
    torch.manual_seed(0)
    plain = MemTransformerLM(**small_config(**overrides), impl='reference')
    fast = MemTransformerLM(**small_config(**overrides), impl='auto')
    fast.load_state_dict(plain.state_dict())
    return plain, fast


def small_model(seed: int = 0, **overrides):
    """A tiny float64 `MemTransformerLM` in eval mode, with the original's initialisation."""
    torch.manual_seed(seed)
    return MemTransformerLM(**small_config(**overrides)).double().eval()


def assert_the_same_step(model, klen, fast_log_probs, plain_log_probs, fast_mems=(), plain_mems=()):
    """The fast model's step against the plain one's: in float64 the same function (rule 1), in float32 within
    the rounding of two float32 computations of `model` over `klen` keys (rule 2)."""
    if fast_log_probs.dtype == torch.float64:
        assert_same_function(fast_log_probs, plain_log_probs)
        for a, b in zip(fast_mems, plain_mems, strict=True):
            assert_same_function(a, b)
        return
    inputs, log_probs = xl_depths(xl_config(model), klen)
    assert_close_rounding(fast_log_probs, plain_log_probs, depth=log_probs)
    for a, b, depth in zip(fast_mems, plain_mems, inputs[:len(fast_mems)], strict=True):
        assert_close_rounding(a, b, depth=depth)
