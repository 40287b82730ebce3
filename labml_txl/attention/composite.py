r"""
# Attention in the head-major layout: the fast PyTorch composite

The same computation as `reference.py`, arranged for speed rather than for reading. Queries, keys and
values are `[batch, heads, seq, d_head]`, so every score and value product is one batched `@` over
`batch * heads` matrices; the relative shift is a strided view instead of a pad and a copy; the softmax runs over
the last, contiguous axis. Autograd differentiates it as it stands. `fast/dispatch.py` decides when it runs and tests it
against the reference.
"""
from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from ..positions.encoding import query_positions, rotate
from .masks import heads_mask
from .reference import RelativeTerms, masked_softmax


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """`[seq, batch, heads * d_head]` as the head-major `[batch, heads, seq, d_head]` (a view)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).permute(1, 2, 0, 3)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """`[batch, heads, seq, d_head]` back to `[seq, batch, heads * d_head]`, the heads concatenated."""
    batch, heads, seq, d_head = x.shape
    return x.permute(2, 0, 1, 3).reshape(seq, batch, heads * d_head)


def pad_table(table: torch.Tensor, klen: int) -> torch.Tensor:
    r"""
    Zero entries appended at the end of the relative table (axis -2) until it has at least `klen + 1` of them, so
    that `relative_shift_view` can read it with a row stride of at least `klen` (rows that never overlap).

    The appended entries play the part of the reference's zero pad: they land only where a decoder masks (the
    future, $j > m + i$). The table is `[.., L, d]`, not batch-sized, so the copy is small.
    """
    missing = klen + 1 - table.shape[-2]
    if missing <= 0:
        return table
    zeros = table.new_zeros(table.shape[:-2] + (missing, table.shape[-1]))
    return torch.cat([table, zeros], dim=-2)


def relative_shift_view(x: torch.Tensor, klen: int) -> torch.Tensor:
    r"""
    `relative_shift` as a strided view, without the pad-and-copy: `out[.., i, j] = x[.., i, j + qlen - 1 - i]`.

    With the last two axes of `x` contiguous (`[.., qlen, L]`, `L >= klen + 1`), that element sits at flat offset
    $i L + j + q - 1 - i = (q - 1) + i (L - 1) + j$: a view starting at $q - 1$ with row stride $L - 1$. Rows
    do not overlap because $L - 1 \ge k$, so the backward pass is a plain strided copy too.
    Entries with $j + q - 1 - i \ge L$ run into the next row; for a decoder they are the future and masked.

    Shape:
        `x` `[.., qlen, L]`; returns `[.., qlen, klen]` (a view of `x`).
    """
    qlen, rlen = x.shape[-2], x.shape[-1]
    if rlen < klen + 1:
        raise ValueError(f"relative_shift_view needs a table of at least klen + 1 = {klen + 1} entries, got {rlen}: "
                         f"pad it with pad_table first")
    flat = x.flatten(-2)
    shifted = flat.narrow(-1, qlen - 1, qlen * (rlen - 1)).unflatten(-1, (qlen, rlen - 1))
    return shifted if rlen - 1 == klen else shifted[..., :klen]


def shifted_position_scores(q: torch.Tensor, table: Optional[torch.Tensor], position_bias: Optional[torch.Tensor],
                   entry_bias: Optional[torch.Tensor], klen: int, scale: float) -> torch.Tensor:
    r"""
    $\mathit{scale} \cdot \mathop{shift}\bigl((Q + v) R^\top + b\bigr)$ indexed by key position, a view.

    The scale goes on $Q + v$ (four times fewer elements than the scores). Without a table the terms are the
    shifted $b$ alone, the same for every batch row (computed once, broadcast over the batch axis).

    Shape:
        `q` `[batch, heads, qlen, d_head]`, `table` `[heads, rlen, d_head]` or None, `position_bias` ($v$)
        `[heads, d_head]` or None, `entry_bias` ($b$) `[heads, rlen]` or None (not both None); returns
        `[batch or 1, heads, qlen, klen]`.
    """
    if table is None:
        # $\mathit{scale} \cdot b_s$ for every query row, `[1, heads, qlen, L]`, on a padded table
        b = pad_table(entry_bias[..., None], klen)[..., 0] * scale
        return relative_shift_view(b[None, :, None].expand(1, -1, q.shape[-2], -1).contiguous(), klen)
    q_v = (q if position_bias is None else q + position_bias[:, None]) * scale
    # $(Q + v) R^\top$ per table entry, on a table padded so that the shift is a view
    terms = torch.matmul(q_v, pad_table(table, klen).transpose(-1, -2))
    if entry_bias is not None:
        terms = terms + pad_table(entry_bias[..., None], klen)[..., 0][:, None] * scale
    return relative_shift_view(terms, klen)


def rotate_heads(q: torch.Tensor, k: torch.Tensor, k_memory: Optional[torch.Tensor], d_rotary: int
                 ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """
    Head-major queries and keys rotated by position (`encoding.rotate`): the memory's keys at
    `0 .. mlen - 1`, the segment's after them, the queries the last `qlen` of all `klen` (`query_positions`: with
    more queries than keys, the first before the first key).

    Shape:
        `q` `[batch, heads, qlen, d_head]`, `k` `[batch, heads, len, d_head]`, `k_memory`
        `[batch, heads, mlen, d_head]` or None; returns the three rotated (the last None without a memory).
    """
    mlen = 0 if k_memory is None else k_memory.shape[-2]
    klen = mlen + k.shape[-2]
    positions = torch.arange(klen, device=q.device)
    # The queries' own positions: more of them than keys (cross-attention) start before the first key
    q = rotate(q, query_positions(q.shape[-2], klen, q.device), d_rotary, seq_dim=-2)
    k = rotate(k, positions[mlen:], d_rotary, seq_dim=-2)
    if k_memory is not None:
        k_memory = rotate(k_memory, positions[:mlen], d_rotary, seq_dim=-2)
    return q, k, k_memory


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, values: torch.Tensor, scale: float,
                   masked: Optional[torch.Tensor], terms: Optional[RelativeTerms]) -> torch.Tensor:
    r"""
    $\sum_j \mathop{softmax}_j(\mathit{scale} \cdot A_{i,j})\, v_j$ by `scaled_dot_product_attention`: on $(Q + u, K,
    V)$ with the position terms $\mathit{scale} \cdot \mathop{shift}((Q + v) R^\top + b)$ as its additive bias
    ($-\infty$ where masked), or with the boolean mask alone without them. The queries and keys come rotated where
    `terms` rotate them (`rotate_heads`). No row may be fully masked.

    Shape:
        `q`, `k`, `values` `[batch, heads, len, d_head]`; `masked` True where masked, `[qlen, klen]` or
        `[qlen or 1, klen, batch or 1]`. Returns `[qlen, batch, heads * d_head]`.
    """
    masked = heads_mask(masked)
    if terms is None or not terms.has_position_scores:
        bias = None if masked is None else ~masked
    else:
        bias = shifted_position_scores(q, terms.table, terms.position_bias, terms.entry_bias, k.shape[-2], scale)
        # (`where` reads the view and the mask once; `masked_fill` would copy the view first)
        bias = (bias.contiguous() if masked is None else torch.where(masked, float('-inf'), bias)).to(q.dtype)
    if terms is not None and terms.content_bias is not None:
        # $Q + u$
        q = q + terms.content_bias[:, None]
    return merge_heads(F.scaled_dot_product_attention(q, k, values, attn_mask=bias, scale=scale))


def composite_attention(q: torch.Tensor, k: torch.Tensor, values: torch.Tensor, scale: float,
                        masked: Optional[torch.Tensor], terms: Optional[RelativeTerms],
                        dropout: Optional[nn.Module], rows_may_be_empty: bool = True
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""
    $\sum_j \mathop{softmax}_j(\mathit{scale} \cdot A_{i,j})\, v_j$ head-major: the scaled scores ($q_i^\top k_j$, plus
    the relative terms with `terms`), the masked softmax in place over the last axis, `dropout` on the weights.

    Shape:
        as `sdpa_attention`; returns `[qlen, batch, heads * d_head]` and the weights `[batch, heads, qlen, klen]`.
    """
    q = q.contiguous()
    batch, heads, qlen, d_head = q.shape
    klen = k.shape[-2]
    # $Q + u$
    q_u = q if terms is None or terms.content_bias is None else q + terms.content_bias[:, None]
    if terms is None or not terms.has_position_scores:
        # $\mathit{scale} \cdot Q K^\top$
        scores = torch.matmul(q_u, k.transpose(-1, -2)).mul_(scale)
    else:
        # $\mathit{scale} \cdot \mathop{shift}((Q + v) R^\top + b)$, by key position
        shifted = shifted_position_scores(q, terms.table, terms.position_bias, terms.entry_bias, klen, scale)
        shifted = shifted.expand(batch, heads, qlen, klen).reshape(batch * heads, qlen, klen)
        # $\mathit{scale} \cdot A^{rel} = \mathit{shifted} + \mathit{scale} \cdot (Q + u) K^\top$ in one product
        scores = torch.baddbmm(shifted, q_u.reshape(batch * heads, qlen, d_head),
                               k.reshape(batch * heads, klen, d_head).transpose(1, 2),
                               alpha=scale).view(batch, heads, qlen, klen)
    weights = masked_softmax(scores, heads_mask(masked), dim=-1, inplace=True, rows_may_be_empty=rows_may_be_empty)
    if dropout is not None:
        weights = dropout(weights)
    return merge_heads(torch.matmul(weights, values)), weights
