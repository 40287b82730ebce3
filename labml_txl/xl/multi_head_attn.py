r"""
# Multi-head attention with absolute positions (`attn_type` 2 and 3)

$$A_{i,j} = q_i^\top k_j$$

with the queries `q_net` ($W_q$) of the segment and keys and values `kv_net` ($W_k$, $W_v$) of the memory
followed by the segment, no biases. Positions are not seen here: the model adds them to the inputs.

With `pre_lnorm`, the queries come from the layer-normalised segment like the keys and values (the
original took them from the un-normalised input, an inconsistency not copied here; the two agree without
`pre_lnorm`).
"""
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..relative_attention import from_heads, heads_mask, to_heads

from .attention_base import XLAttentionBase


class MultiHeadAttn(XLAttentionBase):
    """
    Args:
        n_head, d_model, d_head, dropout, dropatt, pre_lnorm: see `XLAttentionBase`.

    Shape:
        `h` `[qlen, bsz, d_model]`; `attn_mask` boolean `[qlen, klen, 1]`, True where masked;
        `mems` `[mlen, bsz, d_model]` or None. Output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm)
        # $W_q$
        self.q_net = nn.Linear(d_model, n_head * d_head, bias=False)
        # $W_k$ and $W_v$ in one matrix
        self.kv_net = nn.Linear(d_model, 2 * n_head * d_head, bias=False)

    def forward(self, h: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None) -> torch.Tensor:
        qlen, bsz = h.shape[0], h.shape[1]
        c = self._keys_input(h, mems)
        klen = c.shape[0]
        if self.fast and not self.round_scores_to_float32:
            return self._output(h, self._sdpa(c, qlen, attn_mask))
        head_q = self.q_net(c[-qlen:]).reshape(qlen, bsz, self.n_head, self.d_head)
        head_k, head_v = torch.chunk(self.kv_net(c), 2, dim=-1)
        head_k = head_k.reshape(klen, bsz, self.n_head, self.d_head)
        head_v = head_v.reshape(klen, bsz, self.n_head, self.d_head)
        # $q_i^\top k_j$
        score = torch.einsum('ibnd,jbnd->ijbn', head_q, head_k)
        return self._output(h, self._attend(score, attn_mask, head_v))

    def _sdpa(self, c: torch.Tensor, qlen: int, attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
        r"""$\mathop{softmax}_j(q_i^\top k_j / \sqrt{d_{head}}) v_j$ by `scaled_dot_product_attention`, head-major;
        returns the concatenated heads `[qlen, bsz, n_head * d_head]`."""
        head_q = to_heads(self.q_net(c[c.shape[0] - qlen:]), self.n_head, self.d_head)
        kv = self._kv_view(self.kv_net(c))
        if attn_mask is not None and self.zero_masked_rows:
            # A fully masked row must give zero weights, which SDPA does not promise: the explicit softmax
            score = torch.matmul(head_q, kv[0].transpose(-1, -2)) * self._fold_scale
            return self._attend_heads(score, attn_mask, kv[1])
        # True where a key may be seen, as SDPA takes it
        allowed = None if attn_mask is None else ~heads_mask(attn_mask)
        dropout_p = self.dropatt.p if self.training else 0.0
        attn_vec = F.scaled_dot_product_attention(head_q, kv[0], kv[1], attn_mask=allowed, dropout_p=dropout_p,
                                                  scale=self.scale)
        return from_heads(attn_vec)
