r"""
# Learned relative embeddings (`'learnable'`, Transformer-XL's `attn_type` 1)

The variant of Shaw et al. (2018) as Transformer-XL's code has it: the distance embeddings and the position bias are
learned tables instead of a projected sinusoid,

$$A_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{q_i^\top e_{i-j}}_{(b)} + \underbrace{b_{i-j}}_{(d)}$$

with $e$ = `r_emb` `[L, heads, d_head]`, $b$ = `r_bias` `[L, heads]` and $u$ = `r_w_bias` `[heads, d_head]`, per layer
and owned by the model (`MemTransformerLM`), which passes layer $N$'s with each call. Row $s$ of a table of $L$ rows is
distance $L - 1 - s$; for `klen` keys the last `klen` rows are used, and when `klen > L` the farthest row (row 0)
stands for every longer distance. Terms (b) and (d) go through the same relative shift as `'relative'`. The tables
are a decoder's (distances `klen - 1 .. 0`), so only Transformer-XL serves this scheme.
"""
import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..fast.dispatch import Plan
from .scheme import PositionScheme


def last_rows(table: torch.Tensor, n: int) -> torch.Tensor:
    """The last `n` rows of `table`; when it has fewer, its first row repeated in front to make `n`."""
    if n <= table.shape[0]:
        return table[table.shape[0] - n:]
    pad = table[0:1].expand((n - table.shape[0],) + tuple(table.shape[1:]))
    return torch.cat([pad, table], 0)


class LearnedRelative(PositionScheme):
    """
    Learned relative embeddings, the model's tables (no parameters on the attention).

    Position arguments:
        `r_emb` `[L, heads, d_head]`, `r_w_bias` `[heads, d_head]`, `r_bias` `[L, heads]`: the model's, of this layer.
    """
    joint_qkv = True
    # (the model's tables are a decoder's: it gives them)
    needs_model_positions = True

    def terms(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor, full_table: bool,
              r_emb: torch.Tensor = None, r_w_bias: torch.Tensor = None,
              r_bias: torch.Tensor = None) -> RelativeTerms:
        r"""$e_s$ and $b_s$ for the distances `seq_k - 1 .. 0`, with $u$: $(q_i + u)^\top k_j + q_i^\top e_s + b_s$."""
        if full_table or r_emb is None or r_w_bias is None or r_bias is None:
            raise ValueError("the learned relative embeddings ('learnable') are the model's tables of a decoder's "
                             "distances: a model that owns them (MemTransformerLM, attn_type=1) passes r_emb, "
                             "r_w_bias and r_bias with each call")
        return RelativeTerms(last_rows(r_emb, seq_k).transpose(0, 1), content_bias=r_w_bias,
                             entry_bias=last_rows(r_bias, seq_k).transpose(0, 1))
