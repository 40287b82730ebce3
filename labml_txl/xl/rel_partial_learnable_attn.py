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

from ..parameter_versions import track_fused_optimizer_steps
from ..relative_attention import (CausalPositionBias, heads_mask, pad_table, relative_attention_scores,
                                  relative_attention_scores_heads, relative_attention_weights_heads)
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
        # $W_{k,R} R$ kept in no-grad evaluation: `(table, its version, r_net.weight, its version, result)`
        self._table_memo = None
        # The position bias through SDPA under a causal mask, kept between calls (a model gives its layers one)
        self.causal_bias = CausalPositionBias()
        if untie_r:
            # $u$ and $v$ of this layer
            self.r_w_bias = nn.Parameter(torch.empty(n_head, d_head))
            self.r_r_bias = nn.Parameter(torch.empty(n_head, d_head))

    def _projected_table(self, r: torch.Tensor) -> torch.Tensor:
        """$W_{k,R} R$ as `[n_head, rlen + 1, d_head]` (one zero entry appended, see `pad_table`).

        In no-grad evaluation the result is kept while the table is the same tensor (the model's cached one) and
        `r_net` is unchanged: one-token steps over a full memory then project nothing of length `klen`."""
        def project():
            r_head_k = self.r_net(r).reshape(r.shape[0], self.n_head, self.d_head).transpose(0, 1)
            # With the zero entry `relative_shift_view` needs (`klen = rlen` for the model's decoder table)
            return pad_table(r_head_k, r.shape[0])

        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            self._table_memo = None
            return project()
        weight, memo = self.r_net.weight, self._table_memo
        if (memo is None or memo[0] is not r or memo[1] != r._version or memo[2] is not weight
                or memo[3] != weight._version):
            # The memo trusts version counters, which fused optimizer steps do not bump by themselves
            track_fused_optimizer_steps()
            self._table_memo = memo = (r, r._version, weight, weight._version, project())
        return memo[4]

    def forward(self, w: torch.Tensor, r: torch.Tensor, r_w_bias: Optional[torch.Tensor] = None,
                r_r_bias: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.untie_r:
            r_w_bias, r_r_bias = self.r_w_bias, self.r_r_bias
        elif r_w_bias is None or r_r_bias is None:
            raise ValueError("r_w_bias and r_r_bias are required: this layer was built with untie_r=False, "
                             "so the model passes its shared biases u and v")
        if self.fast:
            r_head_k = self._projected_table(r)
            if self._use_sdpa_bias():
                # Head-major `[bsz, n_head, len, d_head]`, the table `[n_head, rlen, d_head]`. The projection adds
                # $u$ to the queries (its bias), so $Q + v = (Q + u) + (v - u)$. The kernel and SDPA read the
                # queries in the projection's layout (no copy), and the output comes back in the layout that
                # concatenates the heads with a view.
                head_q_u, kv_memory, kv_segment = self._qkv_parts(self.qkv_net, w, mems, query_bias=r_w_bias)
                attn_vec = self._relative_attention_no_grad(head_q_u, kv_memory, kv_segment, r_head_k, None,
                                                            r_r_bias - r_w_bias, attn_mask,
                                                            causal_bias=self.causal_bias)
                return self._output(w, attn_vec)
            head_q, kv_memory, kv_segment = self._qkv_parts(self.qkv_net, w, mems)
            # Our kernel with its own backward pass where it serves
            attn_vec = self._kernel_attention(head_q, kv_memory, kv_segment, r_head_k, r_w_bias, r_r_bias, attn_mask)
            if attn_vec is not None:
                return self._output(w, attn_vec)
            head_q, head_k, head_v = self._joined_heads(head_q, kv_memory, kv_segment)
            if self.round_scores_to_float32:
                score = relative_attention_scores_heads(head_q, head_k, r_head_k, r_w_bias, r_r_bias,
                                                        scale=self._fold_scale)
                return self._output(w, self._attend_heads(score, attn_mask, head_v))
            attn_prob = relative_attention_weights_heads(head_q, head_k, r_head_k, r_w_bias, r_r_bias,
                                                         heads_mask(attn_mask), self.scale,
                                                         zero_masked_rows=self.zero_masked_rows)
            return self._output(w, self._weigh_values(attn_prob, head_v))
        w_head_q, w_head_k, w_head_v = self._plain_heads(self.qkv_net, w, mems)
        # $W_{k,R} R$, `[rlen, n_head, d_head]`
        r_head_k = self.r_net(r).reshape(r.shape[0], self.n_head, self.d_head)

        # $A^{rel}_{i,j} = (q_i + u)^\top k_j + (q_i + v)^\top W_{k,R} R_{i-j}$
        score = relative_attention_scores(w_head_q, w_head_k, r_head_k, r_w_bias, r_r_bias)
        return self._output(w, self._attend(score, attn_mask, w_head_v))
