r"""
# Sinusoidal position embeddings of Transformer-XL

Transformer-XL encodes a *distance* (attention type 0) or an absolute position counted back from the end of
the attended window (type 2) with the fixed sinusoid of *Attention Is All You Need*,

$$R_p = [\sin(p\,\omega_0), \dots, \sin(p\,\omega_{d/2-1}), \cos(p\,\omega_0), \dots, \cos(p\,\omega_{d/2-1})],
  \qquad \omega_i = 1 / 10000^{2i/d}$$

with sines and cosines concatenated rather than interleaved. Being a fixed function of $p$, it extends to
distances never seen in training, which is what lets evaluation use a longer memory than training.
The frequencies are kept in the buffer `inv_freq` (the original's name, so its checkpoints load).
"""
from typing import Optional

import torch
from torch import nn

from ..positions.encoding import sinusoid_inverse_frequencies, sinusoidal_embeddings

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class PositionalEmbedding(nn.Module):
    """
    Sinusoidal embeddings of positions or distances.

    Args:
        demb: number of features; must be even.

    Shape:
        `pos_seq` `[L]` (float); output `[L, 1, demb]`, or `[L, bsz, demb]` when `bsz` is given, in the dtype
        of `pos_seq`. Positions are exact only in float32 or float64: give them in one of those and cast the
        result. A buffer converted to fp16/bf16 (by `model.half()`) is not used; the frequencies are then
        recomputed in float32.
    """

    def __init__(self, demb: int):
        super().__init__()
        self.demb = demb
        # $\omega_i = 1 / 10000^{2i/d}$
        self.register_buffer('inv_freq', sinusoid_inverse_frequencies(demb))

    def forward(self, pos_seq: torch.Tensor, bsz: Optional[int] = None) -> torch.Tensor:
        inv_freq = self.inv_freq
        if inv_freq.dtype in _LOW_PRECISION:
            inv_freq = sinusoid_inverse_frequencies(self.demb, device=inv_freq.device)
        # $R_p$, `[L, 1, demb]`
        pos_emb = sinusoidal_embeddings(pos_seq, inv_freq)[:, None, :]
        if bsz is not None:
            return pos_emb.expand(-1, bsz, -1)
        return pos_emb
