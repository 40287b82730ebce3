r"""
# Rotary position embeddings (`'rotary'`)

From *RoFormer: Enhanced Transformer with Rotary Position Embedding* (Su et al., 2021). Queries and keys are
rotated by their position before the dot product: feature $i$ is paired with feature $i + d/2$ and the pair at
position $m$ is turned by the angle $m \theta_i$, $\theta_i = 10000^{-2i/d}$,

$$\begin{pmatrix} x^{(i)}_m \\ x^{(i + d/2)}_m \end{pmatrix} \mapsto
  \begin{pmatrix} x^{(i)}_m \cos m\theta_i - x^{(i + d/2)}_m \sin m\theta_i \\
                  x^{(i + d/2)}_m \cos m\theta_i + x^{(i)}_m \sin m\theta_i \end{pmatrix}$$

so that the score of query $m$ and key $n$ depends on their positions only through $m - n$. Only the first $d$ of
each head's $d_k$ features are rotated (`rotary_fraction` of them, rounded down to an even number); the others
pass as they are.

Positions: the queries are the last `seq_q` of the `seq_k` key positions, as for `'relative'` (with a memory in
front of the keys, the memory comes first): query $i$ at $m_i = \mathit{seq_k} - \mathit{seq_q} + i$, key $j$ at $j$.
Each side is turned by its own positions (`positional_encoding.query_positions`), so cross-attention with more
queries than keys (a target longer than its source) is defined too: its first queries sit before the first key, at
negative positions, and the score depends on $m_i - j = i - j + \mathit{seq_k} - \mathit{seq_q}$ alone, the distance
ALiBi and T5 bias use for the same pair.

This file says what the scheme adds (`position_terms`: a rotation of so many features); the rotation itself is
`positional_encoding.rotate`, applied by the score hook's reading of the terms (`relative_attention.scores_of_terms`)
or, for the faster implementations, to the head-major queries and keys before them (`dispatch.attend`).
"""
from typing import Optional

import torch

from ..fast.dispatch import Plan
from ..transformer.mha import MultiHeadAttention
from ..attention.reference import RelativeTerms


def rotary_features(d_k: int, rotary_fraction: float) -> int:
    """The number of features of a head of `d_k` that `rotary_fraction` rotates (rounded down to an even number), or a
    `ValueError` naming what is accepted."""
    if isinstance(rotary_fraction, bool) or not isinstance(rotary_fraction, (int, float)) \
            or not 0 < rotary_fraction <= 1:
        raise ValueError(f"rotary_fraction={rotary_fraction!r} is not accepted: the fraction of each head's "
                         f"features that are rotated, a number in (0, 1]")
    d_rotary = int(d_k * rotary_fraction) // 2 * 2
    if d_rotary < 2:
        raise ValueError(f"rotary_fraction={rotary_fraction} rotates {d_rotary} of the {d_k} features "
                         f"of a head: at least one pair (2 features) must be rotated")
    return d_rotary


class RotaryMultiHeadAttention(MultiHeadAttention):
    """
    Multi-head attention with rotary position embeddings of the queries and keys.

    Args:
        heads, d_model, dropout_prob, bias, impl: as `MultiHeadAttention`.
        rotary_fraction: the fraction of each head's features that are rotated, in (0, 1]; the count is rounded
            down to an even number, at least 2.

    Shape:
        as `MultiHeadAttention`.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True, *,
                 rotary_fraction: float = 1.0, impl: str = 'auto'):
        super().__init__(heads, d_model, dropout_prob=dropout_prob, bias=bias, impl=impl)
        self.d_rotary = rotary_features(self.d_k, rotary_fraction)

    def position_terms(self, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor) -> Optional[RelativeTerms]:
        r"""$A_{m,n} = \mathop{RoPE}(q_m, m)^\top \mathop{RoPE}(k_n, n)$: the first `d_rotary` features rotated."""
        return RelativeTerms(rotary_features=self.d_rotary)
