r"""
# A model's decoder layers for a few rows, in one call of our kernel: generation's one-token steps

A one-token step of a layer is five small products, one attention over the kept memory and two layer norms. Run
through the layer's modules, each of them also pays for module calls, a dispatcher's choice, dropout that is off
and the views between them, and while Python runs between two kernels the threads that share the products fall
asleep. Where `dispatch.decoder_layers` chooses it, all layers run in one call of
`native.decoder_layer.decoder_layers`, which computes each in C++ as

$$h = \mathop{LN}\bigl(x + W_o\,\mathop{Attn}(W_q x,\ [W_k; W_v]\,[m \circ x])\bigr), \qquad
  \mathit{out} = \mathop{LN}\bigl(h + W_2 \max(0, W_1 h + b_1) + b_2\bigr)$$

(post-LN; with `pre_lnorm`, $h = x + W_o\,\mathop{Attn}(\mathop{LN}(x), \dots)$ and
$\mathit{out} = h + \mathop{FFN}(\mathop{LN}(h))$). Everything a layer has of its own comes from its modules
(`LayerParts`): the weights, the scale and the norms; its position terms come from its attention's `position_terms`,
and the keys and values of the memory are those kept from the step before (`kv_memo.py`). The order of the steps is
that of the attention's `_project` and `_output` and of `PositionwiseFF`; `tests/xl/test_fused_step.py` holds the
call to the modules. This file decides nothing: what may run fused is `dispatch.decoder_layers`'s choice.
"""
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..fast.native import decoder_layer as native_decoder_layer
from ..fast.parameter_versions import ParameterSnapshot
from .attention import KeysValues, XLAttention
from .positionwise_ff import PositionwiseFF


class LayerParts(NamedTuple):
    """What the kernel reads of a layer, and what the dispatcher asks of its structure, gathered once and kept while
    the layer holds the same modules and parameters (`snapshot`)."""
    snapshot: ParameterSnapshot
    # The layer and every module in it (whose hooks the fused call would not run)
    modules: Tuple[nn.Module, ...]
    attn: XLAttention
    ff: PositionwiseFF
    # The dropout modules whose `training` and `p` decide whether any is on
    dropouts: Tuple[nn.Module, ...]
    # The projections' matrices (`projection_weights`), $W_o$, $W_1$, $b_1$, $W_2$, $b_2$
    weights: Tuple[torch.Tensor, ...]
    # Whether $W_q$, $W_k$, $W_v$ are one matrix (`qkv_net`: Transformer-XL's relative types, with a table)
    joint_projection: bool
    # Whether the layer, its attention and its feed-forward network run this package's `forward`
    own_forwards: bool
    # Whether the attention's scores are those of its `RelativeTerms` (`dispatch.replaceable_scores`)
    replaceable_scores: bool
    # The first of the two norms that is not an affine `LayerNorm` over the last axis, or None
    other_norm: Optional[nn.Module]

    @classmethod
    def of(cls, layer: nn.Module) -> 'LayerParts':
        attn, ff = layer.dec_attn, layer.pos_ff
        first, _, dropout_1, second, dropout_2 = ff.CoreNet
        projections = attn.projection_weights()
        return cls(ParameterSnapshot(layer), tuple(layer.modules()), attn, ff,
                   (attn.drop, attn.dropatt, dropout_1, dropout_2),
                   projections + (attn.o_net.weight, first.weight, first.bias, second.weight, second.bias),
                   len(projections) == 1,
                   all(type(m).forward.__module__.startswith('labml_txl.xl.') for m in (layer, attn, ff)),
                   getattr(type(attn).get_scores, 'replaceable_scores', False),
                   next((norm for norm in (attn.layer_norm, ff.layer_norm) if not _affine_layer_norm(norm)), None))

    def of_layer(self, layer: nn.Module) -> bool:
        """Whether these are `layer`'s parts as it is now."""
        return self.modules[0] is layer and self.snapshot.unchanged()


def _arguments(parts: LayerParts, terms: RelativeTerms, mems_kv: Optional[torch.Tensor],
               window: int) -> native_decoder_layer.LayerArguments:
    attn, ff = parts.attn, parts.ff
    k_memory, values_memory = (None, None) if mems_kv is None else mems_kv.unbind(0)
    return native_decoder_layer.LayerArguments(
        attn.n_head, attn.pre_lnorm, *parts.weights, _norm(attn.layer_norm), _norm(ff.layer_norm),
        k_memory, values_memory, terms.table, terms.content_bias, terms.position_bias, terms.entry_bias,
        attn.scale, window)


def run(x: torch.Tensor, window: int, layers: Sequence[LayerParts], terms: Sequence[RelativeTerms],
        mems_kv: Sequence[Optional[torch.Tensor]]) -> Tuple[List[torch.Tensor], List[KeysValues]]:
    """
    Every layer's output and the `KeysValues` of its attention (the memory's as kept, the segment's computed here),
    as calling the layers one after another with `return_kv=True` gives them.

    Args:
        x: the first layer's input; each later layer takes the one before's output.
        window: how many keys up to its own position each query sees.
        layers: what the kernel reads of each layer.
        terms: each layer's position terms.
        mems_kv: each layer's memory's keys and values `[2, bsz, n_head, mlen, d_head]`, or None without a memory.

    Shape:
        `x` `[qlen, bsz, d_model]`; returns outputs `[qlen, bsz, d_model]`.
    """
    qlen, bsz, d_model = x.shape
    outputs, projections = native_decoder_layer.decoder_layers(
        x.reshape(qlen * bsz, d_model).contiguous(), qlen,
        [_arguments(parts, layer_terms, kept, window) for parts, layer_terms, kept in zip(layers, terms, mems_kv)])
    keys_values = []
    for parts, kept, qkv in zip(layers, mems_kv, projections):
        attn = parts.attn
        # The segment's keys and values, $[W_k; W_v] x$, in the layout the modules give them
        kv = attn._kv_heads(qkv.view(qlen, bsz, -1)[:, :, attn.n_head * attn.d_head:])
        keys_values.append(KeysValues(kept, kv))
    return [out.view(qlen, bsz, d_model) for out in outputs], keys_values


def _affine_layer_norm(norm: nn.Module) -> bool:
    return (type(norm) is nn.LayerNorm and norm.weight is not None and norm.bias is not None
            and len(norm.normalized_shape) == 1)


def _norm(norm: nn.LayerNorm) -> tuple:
    return norm.weight, norm.bias, norm.eps
