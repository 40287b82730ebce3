r"""
# Attention with linear biases (`'alibi'`)

From *Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation* (Press et al., 2022).
No position embeddings: each head $h$ penalises a key by its distance from the query, after the scale,

$$\mathop{softmax}_j\Bigl(\frac{q_i^\top k_j}{\sqrt{d_k}} - m_h\, |i - j|\Bigr)$$

with fixed slopes $m_h$: for $n$ heads, a power of two, the geometric sequence $m_h = 2^{-8h/n}$, $h = 1 \dots n$;
otherwise the slopes of the largest power of two $2^k < n$, followed by every other slope of the sequence for
$2^{k+1}$ heads until there are $n$ (the paper's rule).

Positions: the queries are the last `seq_q` of the `seq_k` key positions, as for `'relative'`. A causal decoder
sees keys $j \le i$, so $|i - j| = i - j$, the paper's bias; an encoder sees the same penalty on both sides.
"""
import math
from typing import List

import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..fast.dispatch import Plan
from .encoding import relative_distances
from .scheme import PositionScheme


def alibi_slopes(heads: int) -> List[float]:
    """The slopes $m_1 \\dots m_n$ of `heads` heads (see the module docstring)."""
    power = 2 ** math.floor(math.log2(heads))
    # $2^{-8h/2^k}$, $h = 1 \dots 2^k$
    slopes = [2 ** (-8 * h / power) for h in range(1, power + 1)]
    if power < heads:
        # Every other slope of $2^{k+1}$ heads, $2^{-8h/2^{k+1}}$ for odd $h$, until there are `heads`
        slopes += [2 ** (-8 * h / (2 * power)) for h in range(1, 2 * power + 1, 2)][:heads - power]
    return slopes


def alibi_entry_bias(distances: torch.Tensor, slopes: torch.Tensor, scale: float) -> torch.Tensor:
    r"""$-m_h |d| / \mathit{scale}$ for each distance $d$ of a relative table `[rlen]`, as the bias per entry of
    `RelativeTerms` `[heads, rlen]`: it is added before the attention's scale, which leaves the paper's
    $-m_h |i - j|$. In the dtype of `distances`."""
    # $-m_h |d|$, `[heads, rlen]`
    return -slopes.to(distances.dtype)[:, None] * distances.abs()[None, :] / scale


class Alibi(PositionScheme):
    """
    Linear distance biases per head, the paper's fixed slopes (ALiBi).

    On the attention: the buffer `slopes` (not a parameter, not in a checkpoint).
    """

    def add_parameters(self, attn: nn.Module, d_model: int, heads: int, d_head: int) -> None:
        # $m_h$, fixed (a buffer, so it moves with the module, not a parameter or a checkpoint entry)
        attn.register_buffer('slopes', torch.tensor(alibi_slopes(heads)), persistent=False)

    def terms(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor,
              full_table: bool) -> RelativeTerms:
        r"""$q_i^\top k_j - m_h |i - j| \sqrt{d_k}$ before the scale $1/\sqrt{d_k}$, which leaves the paper's
        $\frac{q_i^\top k_j}{\sqrt{d_k}} - m_h |i - j|$: a bias per distance of the table."""
        distances = relative_distances(seq_q, seq_k, bidirectional=full_table, dtype=like.dtype, device=like.device)
        return RelativeTerms(entry_bias=alibi_entry_bias(distances, attn.slopes, attn.scale))
