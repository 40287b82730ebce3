r"""
# Relative attention with learned relative embeddings (`attn_type` 1)

The variant of Shaw et al. (2018) as Transformer-XL's code has it: the distance embeddings and the position
bias are learned tables instead of a projected sinusoid,

$$A_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{q_i^\top e_{i-j}}_{(b)} + \underbrace{b_{i-j}}_{(d)}$$

with $e$ = `r_emb` `[L, n_head, d_head]`, $b$ = `r_bias` `[L, n_head]` and $u$ = `r_w_bias` `[n_head, d_head]`
(per layer, owned by the model). Row $s$ of a table of $L$ rows is distance $L - 1 - s$; for `klen` keys the
last `klen` rows are used, and when `klen > L` the farthest row (row 0) stands for every longer distance.
Terms (b) and (d) go through the same `relative_shift` as attention type 0.
"""
from typing import Optional

import torch
from torch import nn

from ..relative_attention import (content_scores, heads_mask, position_scores, relative_attention_weights_heads,
                                  relative_shift)
from .attention_base import XLAttentionBase


def last_rows(table: torch.Tensor, n: int) -> torch.Tensor:
    """The last `n` rows of `table`; when it has fewer, its first row repeated in front to make `n`."""
    if n <= table.shape[0]:
        return table[table.shape[0] - n:]
    pad = table[0:1].expand((n - table.shape[0],) + tuple(table.shape[1:]))
    return torch.cat([pad, table], 0)


class RelLearnableMultiHeadAttn(XLAttentionBase):
    """
    Args:
        n_head, d_model, d_head, dropout, dropatt, pre_lnorm: see `XLAttentionBase`.

    Shape:
        `w` `[qlen, bsz, d_model]`; `r_emb` `[L, n_head, d_head]`; `r_w_bias` `[n_head, d_head]`;
        `r_bias` `[L, n_head]`; `attn_mask` boolean `[qlen, klen, 1]`, True where masked;
        `mems` `[mlen, bsz, d_model]` or None. Output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm)
        # $W_q$, $W_{k}$ and $W_v$ in one matrix
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)

    @staticmethod
    def _distance_tables(r_emb: torch.Tensor, r_bias: torch.Tensor, klen: int):
        """$e_s$ `[n_head, klen, d_head]` and $b_s$ `[n_head, klen]` for the distances `klen - 1 .. 0` (views)."""
        return last_rows(r_emb, klen).transpose(0, 1), last_rows(r_bias, klen).transpose(0, 1)

    def forward(self, w: torch.Tensor, r_emb: torch.Tensor, r_w_bias: torch.Tensor, r_bias: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None, mems: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.fast:
            # The queries in the projection's layout (the kernel and SDPA read any strides)
            head_q, kv_memory, kv_segment = self._qkv_parts(self.qkv_net, w, mems)
            klen = kv_segment.shape[3] + (0 if kv_memory is None else kv_memory.shape[3])
            table, bias = self._distance_tables(r_emb, r_bias, klen)
            # Without gradients our kernel or SDPA; with them our kernel and its backward pass, where it serves
            if self._use_sdpa_bias():
                attn_vec = self._relative_attention_no_grad(head_q, kv_memory, kv_segment, table, r_w_bias, None,
                                                            attn_mask, r_bias=bias)
            else:
                attn_vec = self._kernel_attention(head_q, kv_memory, kv_segment, table, r_w_bias, None, attn_mask,
                                                  r_bias=bias)
            if attn_vec is not None:
                return self._output(w, attn_vec)
            head_q, head_k, head_v = self._joined_heads(head_q, kv_memory, kv_segment)
            # $(q_i + u)^\top k_j + \mathop{shift}(q_i^\top e_s + b_s)$
            attn_prob = relative_attention_weights_heads(head_q, head_k, table, r_w_bias, None, heads_mask(attn_mask),
                                                         self.scale, r_bias=bias,
                                                         zero_masked_rows=self.zero_masked_rows)
            return self._output(w, self._weigh_values(attn_prob, head_v))
        w_head_q, w_head_k, w_head_v = self._plain_heads(self.qkv_net, w, mems)
        klen = w_head_k.shape[0]
        # Distances `klen - 1 .. 0`
        r_emb = last_rows(r_emb, klen)
        r_bias = last_rows(r_bias, klen)

        # $(a) + (c) = (q_i + u)^\top k_j$
        ac = content_scores(w_head_q, w_head_k, r_w_bias)
        # $(b) = q_i^\top e_s$ and $(d) = b_s$ per table row $s$, then shifted to key positions
        bd = relative_shift(position_scores(w_head_q, r_emb) + r_bias[None, :, None])
        return self._output(w, self._attend(ac + bd, attn_mask, w_head_v))
