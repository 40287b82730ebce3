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
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..fast.dispatch import Plan
from ..attention.reference import RelativeTerms
from .attention_base import KeysValues, XLAttentionBase


def last_rows(table: torch.Tensor, n: int) -> torch.Tensor:
    """The last `n` rows of `table`; when it has fewer, its first row repeated in front to make `n`."""
    if n <= table.shape[0]:
        return table[table.shape[0] - n:]
    pad = table[0:1].expand((n - table.shape[0],) + tuple(table.shape[1:]))
    return torch.cat([pad, table], 0)


class RelLearnableMultiHeadAttn(XLAttentionBase):
    """
    Args:
        n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm: see `XLAttentionBase`.

    Shape:
        `w` `[qlen, bsz, d_model]`; `r_emb` `[L, n_head, d_head]`; `r_w_bias` `[n_head, d_head]`;
        `r_bias` `[L, n_head]`; `attn_mask` boolean `[qlen, klen, 1]`, True where masked;
        `mems` `[mlen, bsz, d_model]` or None; `mems_kv` as `RelPartialLearnableMultiHeadAttn` takes it.
        Output `[qlen, bsz, d_model]`, with `return_kv` also the `KeysValues` computed.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm'):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm=norm)
        # $W_q$, $W_{k}$ and $W_v$ in one matrix
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)

    def projection_weights(self) -> Tuple[torch.Tensor, ...]:
        return (self.qkv_net.weight,)

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor, r_emb: torch.Tensor,
                       r_w_bias: torch.Tensor, r_bias: torch.Tensor) -> RelativeTerms:
        """$e_s$ and $b_s$ for the distances `klen - 1 .. 0`, with $u$: $(q_i + u)^\top k_j + q_i^\top e_s + b_s$."""
        return RelativeTerms(last_rows(r_emb, klen).transpose(0, 1), content_bias=r_w_bias,
                             entry_bias=last_rows(r_bias, klen).transpose(0, 1))

    def forward(self, w: torch.Tensor, r_emb: torch.Tensor, r_w_bias: torch.Tensor, r_bias: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None, mems: Optional[torch.Tensor] = None,
                mems_kv: Optional[torch.Tensor] = None, *, plan: Optional[Plan] = None,
                return_kv: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, KeysValues]]:
        plan = Plan.now(w.device) if plan is None else plan
        q, kv = self._project(plan, self.qkv_net.weight, w, mems, mems_kv)
        terms = self.position_terms(plan, q.shape[2], kv.klen, q, r_emb, r_w_bias, r_bias)
        out = self._output(plan, w, self._attend(plan, q, kv, terms, attn_mask))
        return (out, kv) if return_kv else out
