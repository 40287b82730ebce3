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
Each side is turned by its own positions (`encoding.query_positions`), so cross-attention with more
queries than keys (a target longer than its source) is defined too: its first queries sit before the first key, at
negative positions, and the score depends on $m_i - j = i - j + \mathit{seq_k} - \mathit{seq_q}$ alone, the distance
ALiBi and T5 bias use for the same pair.

This file says what the scheme adds (`Rotary.terms`: a rotation of so many features, the same in `MultiHeadAttention`
and in Transformer-XL, where the keys kept of a memory are kept unrotated and turned at each use); the rotation itself
is `encoding.rotate`, applied by the score hook's reading of the terms (`reference.scores_of_terms`) or, for the faster
implementations, to the head-major queries and keys before them (`dispatch.attend`).
"""
import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..fast.dispatch import Plan
from .scheme import PositionScheme, SchemeSettings


def check_rotary_fraction(rotary_fraction: float) -> None:
    """A `ValueError` naming what is accepted unless `rotary_fraction` is a number in (0, 1]."""
    if isinstance(rotary_fraction, bool) or not isinstance(rotary_fraction, (int, float)) \
            or not 0 < rotary_fraction <= 1:
        raise ValueError(f"rotary_fraction={rotary_fraction!r} is not accepted: the fraction of each head's "
                         f"features that are rotated, a number in (0, 1]")


def rotary_features(d_k: int, rotary_fraction: float) -> int:
    """The number of features of a head of `d_k` that `rotary_fraction` rotates (rounded down to an even number), or a
    `ValueError` naming what is accepted."""
    check_rotary_fraction(rotary_fraction)
    d_rotary = int(d_k * rotary_fraction) // 2 * 2
    if d_rotary < 2:
        raise ValueError(f"rotary_fraction={rotary_fraction} rotates {d_rotary} of the {d_k} features "
                         f"of a head: at least one pair (2 features) must be rotated")
    return d_rotary


class Rotary(PositionScheme):
    """
    Rotary position embeddings of queries and keys (RoFormer), `rotary_fraction` of the features; no parameters.

    Args:
        rotary_fraction: the fraction of each head's features that are rotated, in (0, 1]; the count is rounded
            down to an even number, at least 2 (checked against the head size when the scheme is attached).
    """

    def __init__(self, rotary_fraction: float = 1.0):
        check_rotary_fraction(rotary_fraction)
        self.rotary_fraction = rotary_fraction

    @classmethod
    def from_settings(cls, settings: SchemeSettings) -> 'Rotary':
        return cls(settings.rotary_fraction)

    def add_parameters(self, attn: nn.Module, d_model: int, heads: int, d_head: int) -> None:
        # The rotated features of a head
        self.d_rotary = rotary_features(d_head, self.rotary_fraction)

    def terms(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor,
              full_table: bool) -> RelativeTerms:
        r"""$A_{m,n} = \mathop{RoPE}(q_m, m)^\top \mathop{RoPE}(k_n, n)$: the first `d_rotary` features rotated
        (no table: the same for either)."""
        return RelativeTerms(rotary_features=self.d_rotary)
