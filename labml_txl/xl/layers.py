r"""
# Transformer-XL decoder layers

Each layer is attention over the memory and the segment (`dec_attn`) followed by the position-wise
feed-forward network (`pos_ff`), both with residual connections and layer normalisation.
One class per attention type, as in the original, so parameter names match its checkpoints:

* `RelPartialLearnableDecoderLayer`: `attn_type` 0, the paper's relative attention;
* `RelLearnableDecoderLayer`: `attn_type` 1, learned relative embeddings;
* `DecoderLayer`: `attn_type` 2 and 3, absolute positions added to the inputs by the model, and 4 to 6, positions in
  the attention's position terms (`position_scheme_attn.py`).

`mems_kv`, `plan` and `return_kv` go to the attention as it takes them (`xl/attention_base.py`); with `return_kv`
the layer returns its output and the attention's `KeysValues`.
"""
from typing import Optional

import torch
from torch import nn

from ..fast.dispatch import Plan

from .multi_head_attn import MultiHeadAttn
from .positionwise_ff import PositionwiseFF
from .rel_learnable_attn import RelLearnableMultiHeadAttn
from .rel_partial_learnable_attn import RelPartialLearnableMultiHeadAttn


class RelPartialLearnableDecoderLayer(nn.Module):
    """
    Args:
        n_head, d_model, d_head: attention sizes; d_inner: hidden features of the feed-forward network;
        dropout, dropatt: dropout on outputs and on attention weights; pre_lnorm: pre-LN instead of post-LN;
        untie_r: the layer owns its $u$, $v$ biases.
        original_numerics, norm: see `XLAttentionBase`.

    Shape:
        see `RelPartialLearnableMultiHeadAttn`; output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float = 0.0, pre_lnorm: bool = False, untie_r: bool = False,
                 original_numerics: bool = False, norm: str = 'layer_norm'):
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(n_head, d_model, d_head, dropout, dropatt=dropatt,
                                                         pre_lnorm=pre_lnorm, untie_r=untie_r,
                                                         original_numerics=original_numerics, norm=norm)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm=pre_lnorm, norm=norm)

    def forward(self, dec_inp: torch.Tensor, r: torch.Tensor, r_w_bias: Optional[torch.Tensor] = None,
                r_r_bias: Optional[torch.Tensor] = None, dec_attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None, mems_kv: Optional[torch.Tensor] = None, *,
                plan: Optional[Plan] = None, return_kv: bool = False):
        plan = Plan.now(dec_inp.device) if plan is None else plan
        output = self.dec_attn(dec_inp, r, r_w_bias, r_r_bias, attn_mask=dec_attn_mask, mems=mems, mems_kv=mems_kv,
                               plan=plan, return_kv=return_kv)
        return _feed_forward(self.pos_ff, output, plan, return_kv)


class RelLearnableDecoderLayer(nn.Module):
    """
    Args:
        as `RelPartialLearnableDecoderLayer` (with `norm`), without `untie_r` (the biases are per layer already) and
        `original_numerics` (the original computes this type as this package does).

    Shape:
        see `RelLearnableMultiHeadAttn`; output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float = 0.0, pre_lnorm: bool = False, norm: str = 'layer_norm'):
        super().__init__()
        self.dec_attn = RelLearnableMultiHeadAttn(n_head, d_model, d_head, dropout, dropatt=dropatt,
                                                  pre_lnorm=pre_lnorm, norm=norm)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm=pre_lnorm, norm=norm)

    def forward(self, dec_inp: torch.Tensor, r_emb: torch.Tensor, r_w_bias: torch.Tensor, r_bias: torch.Tensor,
                dec_attn_mask: Optional[torch.Tensor] = None, mems: Optional[torch.Tensor] = None,
                mems_kv: Optional[torch.Tensor] = None, *, plan: Optional[Plan] = None, return_kv: bool = False):
        plan = Plan.now(dec_inp.device) if plan is None else plan
        output = self.dec_attn(dec_inp, r_emb, r_w_bias, r_bias, attn_mask=dec_attn_mask, mems=mems, mems_kv=mems_kv,
                               plan=plan, return_kv=return_kv)
        return _feed_forward(self.pos_ff, output, plan, return_kv)


class DecoderLayer(nn.Module):
    """
    Args:
        as `RelLearnableDecoderLayer`; attn_class: `MultiHeadAttn` or one of its schemes (`position_scheme_attn.py`),
        taking the arguments of `MultiHeadAttn` (a `functools.partial` with the scheme's settings).

    Shape:
        see `MultiHeadAttn`; output `[qlen, bsz, d_model]`.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float = 0.0, pre_lnorm: bool = False, norm: str = 'layer_norm',
                 attn_class: type = MultiHeadAttn):
        super().__init__()
        self.dec_attn = attn_class(n_head, d_model, d_head, dropout, dropatt=dropatt, pre_lnorm=pre_lnorm, norm=norm)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm=pre_lnorm, norm=norm)

    def forward(self, dec_inp: torch.Tensor, dec_attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None, mems_kv: Optional[torch.Tensor] = None, *,
                plan: Optional[Plan] = None, return_kv: bool = False):
        plan = Plan.now(dec_inp.device) if plan is None else plan
        output = self.dec_attn(dec_inp, attn_mask=dec_attn_mask, mems=mems, mems_kv=mems_kv, plan=plan,
                               return_kv=return_kv)
        return _feed_forward(self.pos_ff, output, plan, return_kv)


def _feed_forward(pos_ff: PositionwiseFF, output, plan: Plan, return_kv: bool):
    """The feed-forward network on the attention's output (with `return_kv`, an `(output, KeysValues)` pair)."""
    if return_kv:
        output, kv = output
        return pos_ff(output, plan=plan), kv
    return pos_ff(output, plan=plan)
