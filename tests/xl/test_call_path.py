"""
The path of a training step from `MemTransformerLM.forward` to the computation of the scores, as
docs/architecture.md draws it: at most six of this package's frames (PyTorch's `nn.Module.__call__` between them
aside), whichever implementation the dispatcher picks.
"""
import sys
from pathlib import Path

import pytest
import torch

import labml_txl
from labml_txl.fast import dispatch
from labml_txl.fast.native import attention as native_attention
from labml_txl.xl import MemTransformerLM

PACKAGE = Path(labml_txl.__file__).resolve().parent


def _our_frames_from_forward():
    """The qualified names of this package's frames from the innermost caller up to `MemTransformerLM.forward`."""
    names, frame = [], sys._getframe(2)
    while frame is not None:
        if Path(frame.f_code.co_filename).resolve().is_relative_to(PACKAGE):
            names.append(frame.f_code.co_qualname)
            if frame.f_code.co_qualname == 'MemTransformerLM.forward':
                return names[::-1]
        frame = frame.f_back
    raise AssertionError('not called from MemTransformerLM.forward')


@pytest.mark.parametrize('dropatt, implementation', [
    (0.0, 'causal_relative_attention'),
    (0.1, 'composite_attention'),
], ids=['kernel', 'composite'])
def test_a_training_step_reaches_the_scores_in_six_frames(monkeypatch, dropatt, implementation):
    paths = []
    owner = native_attention if implementation == 'causal_relative_attention' else dispatch
    original = getattr(owner, implementation)

    def spy(*args, **kwargs):
        paths.append(_our_frames_from_forward() + [implementation])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, implementation, spy)
    torch.manual_seed(0)
    model = MemTransformerLM(50, 2, 2, 16, 8, 32, dropout=0.1, dropatt=dropatt, tgt_len=6, mem_len=6).train()
    data = torch.randint(50, (6, 2))
    loss, *mems = model(data, data)
    model(data, data, *mems)[0].mean().backward()
    assert len(paths) == 4, 'one call per layer and segment'
    assert all(path == paths[0] for path in paths)
    assert paths[0] == ['MemTransformerLM.forward', 'MemTransformerLM._forward', 'DecoderLayer.forward',
                        'XLAttention.forward', 'attend', implementation]
