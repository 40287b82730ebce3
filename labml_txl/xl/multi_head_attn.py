r"""
# Multi-head attention with absolute positions (`attn_type` 2 and 3)

$$A_{i,j} = q_i^\top k_j$$

with the queries `q_net` ($W_q$) of the segment and keys and values `kv_net` ($W_k$, $W_v$) of the memory
followed by the segment, no biases. Positions are not seen here: the model adds them to the inputs.

With `pre_lnorm`, the queries come from the layer-normalised segment like the keys and values. The original
took them from the un-normalised input, an inconsistency not copied by default; `original_numerics=True` copies it
(for checkpoints trained with the original). The two agree without `pre_lnorm`.
"""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..fast.dispatch import Plan
from ..attention.reference import RelativeTerms
from .attention_base import KeysValues, XLAttentionBase


class MultiHeadAttn(XLAttentionBase):
    """
    Args:
        n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm: see `XLAttentionBase`.
        original_numerics: with `pre_lnorm`, the queries from the un-normalised input, as the original.

    Shape:
        `h` `[qlen, bsz, d_model]`; `attn_mask` boolean `[qlen, klen, 1]`, True where masked;
        `mems` `[mlen, bsz, d_model]` or None. Output `[qlen, bsz, d_model]`, with `return_kv` also the
        `KeysValues` computed.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm', original_numerics: bool = False):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, original_numerics, norm)
        # $W_q$
        self.q_net = nn.Linear(d_model, n_head * d_head, bias=False)
        # $W_k$ and $W_v$ in one matrix
        self.kv_net = nn.Linear(d_model, 2 * n_head * d_head, bias=False)

    @property
    def raw_queries(self) -> bool:
        return self.original_numerics

    def projection_weights(self) -> Tuple[torch.Tensor, ...]:
        return self.q_net.weight, self.kv_net.weight

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor) -> Optional[RelativeTerms]:
        """What a positional scheme on this attention adds to $q_i^\top k_j$ (`position_scheme_attn.py`), for `qlen`
        queries that are the last of `klen` key positions, in the dtype and on the device of `like`; None here (the
        model adds positions to the inputs)."""
        return None

    def forward(self, h: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, mems: Optional[torch.Tensor] = None,
                mems_kv: Optional[torch.Tensor] = None, *, plan: Optional[Plan] = None,
                return_kv: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, KeysValues]]:
        plan = Plan.now(h.device) if plan is None else plan
        # $[W_q; W_k; W_v]$ as one product of the segment
        q, kv = self._project(plan, torch.cat(self.projection_weights()), h, mems, mems_kv)
        # $A_{i,j} = q_i^\top k_j$, with the position terms of a scheme
        terms = self.position_terms(plan, q.shape[2], kv.klen, q)
        out = self._output(plan, h, self._attend(plan, q, kv, terms, attn_mask))
        return (out, kv) if return_kv else out
