r"""
# Relative multi-head attention of Transformer-XL (`attn_type` 0, the paper's)

$$A^{rel}_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{(q_i + v)^\top W_{k,R} R_{i-j}}_{(b) + (d)}$$

with $q, k, v$ from one joint projection `qkv_net` ($W_q$, $W_{k,E}$, $W_v$, no bias) of the memory and the
segment, $W_{k,R}$ = `r_net` applied to the sinusoidal table $R$ of distances `klen - 1 .. 0`, and the
shared `relative_attention_scores` (terms and shift: `labml_txl/relative_attention.py`).
$u$ = `r_w_bias` and $v$ = `r_r_bias` are learned, `[n_head, d_head]`: given by the model (one pair for all
layers, the original PyTorch code) or, with `untie_r=True`, owned by this layer (the authors' TensorFlow code
and their published WikiText-103 model).
"""
from typing import Optional

import torch
from torch import nn

from ..relative_attention import relative_attention_scores
from .attention_base import XLAttentionBase


class RelPartialLearnableMultiHeadAttn(XLAttentionBase):
    """
    Args:
        n_head, d_model, d_head, dropout, dropatt, pre_lnorm: see `XLAttentionBase`.
        untie_r: own the biases `r_w_bias` ($u$) and `r_r_bias` ($v$) instead of taking them in `forward`.

    Shape:
        `w` `[qlen, bsz, d_model]`; `r` the sinusoidal table `[klen, 1, d_model]` (distances `klen - 1 .. 0`);
        `r_w_bias`, `r_r_bias` `[n_head, d_head]` (None with `untie_r`); `attn_mask` boolean
        `[qlen, klen, 1]`, True where masked; `mems` `[mlen, bsz, d_model]` or None. Output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, untie_r: bool = False):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm)
        # $W_q$, $W_{k,E}$ and $W_v$ in one matrix
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        # $W_{k,R}$
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.untie_r = untie_r
        if untie_r:
            # $u$ and $v$ of this layer
            self.r_w_bias = nn.Parameter(torch.empty(n_head, d_head))
            self.r_r_bias = nn.Parameter(torch.empty(n_head, d_head))

    def forward(self, w: torch.Tensor, r: torch.Tensor, r_w_bias: Optional[torch.Tensor] = None,
                r_r_bias: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.untie_r:
            r_w_bias, r_r_bias = self.r_w_bias, self.r_r_bias
        elif r_w_bias is None or r_r_bias is None:
            raise ValueError("r_w_bias and r_r_bias are required: this layer was built with untie_r=False, "
                             "so the model passes its shared biases u and v")
        qlen, bsz = w.shape[0], w.shape[1]
        w_heads = self.qkv_net(self._keys_input(w, mems))
        w_head_q, w_head_k, w_head_v = torch.chunk(w_heads, 3, dim=-1)
        klen = w_head_k.shape[0]
        # Queries only for the segment: the last `qlen` of the `klen` positions
        w_head_q = w_head_q[-qlen:].reshape(qlen, bsz, self.n_head, self.d_head)
        w_head_k = w_head_k.reshape(klen, bsz, self.n_head, self.d_head)
        w_head_v = w_head_v.reshape(klen, bsz, self.n_head, self.d_head)
        # $W_{k,R} R$, `[rlen, n_head, d_head]`
        r_head_k = self.r_net(r).reshape(r.shape[0], self.n_head, self.d_head)

        # $A^{rel}_{i,j} = (q_i + u)^\top k_j + (q_i + v)^\top W_{k,R} R_{i-j}$
        score = relative_attention_scores(w_head_q, w_head_k, r_head_k, r_w_bias, r_r_bias)
        return self._output(w, self._attend(score, attn_mask, w_head_v))
