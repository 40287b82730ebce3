"""Shared helpers of the Transformer-XL tests."""
from pathlib import Path

import torch

from labml_txl.xl import MemTransformerLM

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
