r"""
# Transformer-XL's decoder layer

Each layer is attention over the memory and the segment (`dec_attn`, `attention.py`, with the layer's positional
scheme) followed by the position-wise feed-forward network (`pos_ff`), both with residual connections and layer
normalisation. One class for every attention type: the parameter names of each type are the attention's
(`qkv_net` for the original's types 0 and 1, `q_net` and `kv_net` otherwise) and its scheme's.

The position arguments the model gives (the sinusoids and $u$, $v$ of type 0, the learned tables of type 1) go to
the attention as they come, as do `mems_kv`, `plan`, `return_kv` and `branch`; with `return_kv` the layer returns its output and
the attention's `KeysValues`.
"""
from typing import Optional

import torch
from torch import nn

from ..fast.dispatch import Plan
from ..positions.scheme import PositionScheme
from .attention import XLAttention
from .positionwise_ff import PositionwiseFF


class DecoderLayer(nn.Module):
    """
    Args:
        n_head, d_model, d_head: attention sizes; d_inner: hidden features of the feed-forward network;
        dropout, dropatt: dropout on outputs and on attention weights; pre_lnorm: pre-LN instead of post-LN;
        positions, original_numerics, norm: see `XLAttention`.

    Shape:
        see `XLAttention`; output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float = 0.0, pre_lnorm: bool = False, *, positions: PositionScheme,
                 original_numerics: bool = False, norm: str = 'layer_norm'):
        super().__init__()
        self.dec_attn = XLAttention(n_head, d_model, d_head, dropout, dropatt=dropatt, pre_lnorm=pre_lnorm,
                                    positions=positions, original_numerics=original_numerics, norm=norm)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm=pre_lnorm, norm=norm)

    def forward(self, dec_inp: torch.Tensor, *position_args: torch.Tensor,
                dec_attn_mask: Optional[torch.Tensor] = None, mems: Optional[torch.Tensor] = None,
                mems_kv: Optional[torch.Tensor] = None, plan: Optional[Plan] = None, return_kv: bool = False,
                branch=None):
        plan = Plan.now(dec_inp.device) if plan is None else plan
        output = self.dec_attn(dec_inp, *position_args, attn_mask=dec_attn_mask, mems=mems, mems_kv=mems_kv,
                               plan=plan, return_kv=return_kv, branch=branch)
        if return_kv:
            output, kv = output
            return self.pos_ff(output, plan=plan), kv
        return self.pos_ff(output, plan=plan)
