r"""
# Relative multi-head attention of Transformer-XL (`attn_type` 0, the paper's)

$$A^{rel}_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{(q_i + v)^\top W_{k,R} R_{i-j}}_{(b) + (d)}$$

with $q, k, v$ from one joint projection `qkv_net` ($W_q$, $W_{k,E}$, $W_v$, no bias) of the memory and the
segment, $W_{k,R}$ = `r_net` applied to the sinusoidal table $R$ of distances `klen - 1 .. 0`, and the
shared `relative_attention_scores` (terms and shift: `labml_txl/attention/reference.py`).
$u$ = `r_w_bias` and $v$ = `r_r_bias` are learned, `[n_head, d_head]`: given by the model (one pair for all
layers, the original PyTorch code) or, with `untie_r=True`, owned by this layer (the authors' TensorFlow code
and their published WikiText-103 model).
"""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..fast.dispatch import Plan
from ..fast.parameter_versions import track_fused_optimizer_steps
from ..attention.reference import RelativeTerms
from .attention_base import KeysValues, XLAttentionBase


class RelPartialLearnableMultiHeadAttn(XLAttentionBase):
    """
    Args:
        n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm: see `XLAttentionBase`.
        original_numerics: round the scaled scores to float32 before the softmax, as the original does
            (`attn_score.float().masked_fill(...).type_as(attn_score)`): a change only in float64.
        untie_r: own the biases `r_w_bias` ($u$) and `r_r_bias` ($v$) instead of taking them in `forward`.

    Shape:
        `w` `[qlen, bsz, d_model]`; `r` the sinusoidal table `[klen, 1, d_model]` (distances `klen - 1 .. 0`);
        `r_w_bias`, `r_r_bias` `[n_head, d_head]` (None with `untie_r`); `attn_mask` boolean
        `[qlen, klen, 1]`, True where masked; `mems` `[mlen, bsz, d_model]` or None; `mems_kv` the keys and values
        of `mems` `[2, bsz, n_head, mlen, d_head]` when they are known (then `mems` is not projected again).
        Output `[qlen, bsz, d_model]`, with `return_kv` also the `KeysValues` computed.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, untie_r: bool = False, original_numerics: bool = False,
                 norm: str = 'layer_norm'):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, original_numerics, norm)
        # $W_q$, $W_{k,E}$ and $W_v$ in one matrix
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        # $W_{k,R}$
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.untie_r = untie_r
        # $W_{k,R} R$ kept in no-grad evaluation: `(table, its version, r_net.weight, its version, result)`
        self._table_memo = None
        if untie_r:
            # $u$ and $v$ of this layer
            self.r_w_bias = nn.Parameter(torch.empty(n_head, d_head))
            self.r_r_bias = nn.Parameter(torch.empty(n_head, d_head))

    def _projected_table(self, plan: Plan, r: torch.Tensor) -> torch.Tensor:
        """$W_{k,R} R$ as `[n_head, rlen, d_head]`.

        Where the plan keeps caches (no-grad evaluation) the result is kept while the table is the same tensor (the
        model's cached one) and `r_net` is unchanged: one-token steps over a full memory then project nothing of
        length `klen`."""
        def project():
            return self.r_net(r).reshape(r.shape[0], self.n_head, self.d_head).transpose(0, 1)

        if not plan.keeps_caches:
            self._table_memo = None
            return project()
        weight, memo = self.r_net.weight, self._table_memo
        if (memo is None or memo[0] is not r or memo[1] != r._version or memo[2] is not weight
                or memo[3] != weight._version):
            # The memo trusts version counters, which fused optimizer steps do not bump by themselves
            track_fused_optimizer_steps()
            self._table_memo = memo = (r, r._version, weight, weight._version, project())
        return memo[4]

    @property
    def rounds_scores_to_float32(self) -> bool:
        return self.original_numerics

    def projection_weights(self) -> Tuple[torch.Tensor, ...]:
        return (self.qkv_net.weight,)

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor, r: torch.Tensor,
                       r_w_bias: Optional[torch.Tensor] = None,
                       r_r_bias: Optional[torch.Tensor] = None) -> RelativeTerms:
        """$W_{k,R} R$ with $u$ and $v$: this layer's own with `untie_r`, else the model's shared ones given."""
        if self.untie_r:
            r_w_bias, r_r_bias = self.r_w_bias, self.r_r_bias
        elif r_w_bias is None or r_r_bias is None:
            raise ValueError("r_w_bias and r_r_bias are required: this layer was built with untie_r=False, "
                             "so the model passes its shared biases u and v")
        # $A^{rel}_{i,j} = (q_i + u)^\top k_j + (q_i + v)^\top W_{k,R} R_{i-j}$
        return RelativeTerms(self._projected_table(plan, r), content_bias=r_w_bias, position_bias=r_r_bias)

    def forward(self, w: torch.Tensor, r: torch.Tensor, r_w_bias: Optional[torch.Tensor] = None,
                r_r_bias: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None, mems_kv: Optional[torch.Tensor] = None, *,
                plan: Optional[Plan] = None,
                return_kv: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, KeysValues]]:
        plan = Plan.now(w.device) if plan is None else plan
        q, kv = self._project(plan, self.qkv_net.weight, w, mems, mems_kv)
        terms = self.position_terms(plan, q.shape[2], kv.klen, q, r, r_w_bias, r_r_bias)
        out = self._output(plan, w, self._attend(plan, q, kv, terms, attn_mask))
        return (out, kv) if return_kv else out
