r"""
# A model's decoder layers for a few rows, in one call of our kernel: generation's one-token steps

A one-token step of a layer is five small products, one attention over the kept memory and two layer norms. Run
through the layer's modules, each of them also pays for module calls, a dispatcher's choice, dropout that is off
and the views between them, and while Python runs between two kernels the threads that share the products fall
asleep: for one row that is several times the work itself (`docs/performance.md`). Where `dispatch.decoder_layers`
chooses it for a call of a few rows (`qlen * bsz`, at most `native.few_rows_linear.MOST_ROWS`), all layers run in
one call of `native.decoder_layer.decoder_layers`, which computes each in C++ as

$$h = \mathop{LN}\bigl(x + W_o\,\mathop{Attn}(W_q x,\ [W_k; W_v]\,[m \circ x])\bigr), \qquad
  \mathit{out} = \mathop{LN}\bigl(h + W_2 \max(0, W_1 h + b_1) + b_2\bigr)$$

(post-LN; with `pre_lnorm`, $h = x + W_o\,\mathop{Attn}(\mathop{LN}(x), \dots)$ and
$\mathit{out} = h + \mathop{FFN}(\mathop{LN}(h))$). Everything a layer has of its own comes from its modules: the
weights, the position terms (`position_terms`: the projected table and $u$, $v$ of type 0, the learned tables of
type 1), the scale and the norms; the keys and values of the memory are those kept from the step before
(`kv_memo.py`), looked up by the model. The order of the steps is that of `XLAttentionBase._project`, `_output` and
`PositionwiseFF`, and `tests/xl/test_fused_step.py` holds the call to the modules.
"""
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from ..fast import dispatch
from ..fast.dispatch import Plan
from ..fast.native import decoder_layer as native_decoder_layer
from ..fast.parameter_versions import ParameterSnapshot
from ..attention.reference import RelativeTerms
from .attention_base import KeysValues, XLAttentionBase
from .positionwise_ff import PositionwiseFF


class _Parts(NamedTuple):
    """What the kernel reads of a layer, gathered once and kept while the layer's slots hold the same modules and
    parameters (`snapshot`): a call then reads no module attribute but the flags that may change between calls."""
    snapshot: ParameterSnapshot
    # The layer and every module in it (whose hooks the fused call would not run)
    modules: Tuple[nn.Module, ...]
    attn: XLAttentionBase
    ff: PositionwiseFF
    # The dropout modules whose `training` and `p` decide whether any is on
    dropouts: Tuple[nn.Module, ...]
    # The projections' matrices (`projection_weights`), $W_o$, $W_1$, $b_1$, $W_2$, $b_2$
    weights: Tuple[torch.Tensor, ...]
    # Why the layer's structure rules the fused call out, or None
    structure: Optional[str]

    @classmethod
    def of(cls, layer: nn.Module) -> '_Parts':
        attn, ff = layer.dec_attn, layer.pos_ff
        first, _, dropout_1, second, dropout_2 = ff.CoreNet
        return cls(ParameterSnapshot(layer), tuple(layer.modules()), attn, ff,
                   (attn.drop, attn.dropatt, dropout_1, dropout_2),
                   attn.projection_weights() + (attn.o_net.weight, first.weight, first.bias, second.weight,
                                                second.bias),
                   _structure_refusal(layer, attn, ff))

    def of_layer(self, layer: nn.Module) -> bool:
        """Whether these are `layer`'s parts as it is now."""
        return self.modules[0] is layer and self.snapshot.unchanged()


def _structure_refusal(layer: nn.Module, attn: XLAttentionBase, ff: PositionwiseFF) -> Optional[str]:
    if not all(type(module).forward.__module__.startswith('labml_txl.xl.') for module in (layer, attn, ff)):
        return 'a class overrides forward, which the fused call would not run'
    if len(attn.projection_weights()) != 1:
        return ('absolute positions or a scheme of their own (attention types 2 to 6): the kernel computes '
                "Transformer-XL's relative attention, with a table")
    if not getattr(type(attn).get_scores, 'scores_from_terms', False):
        return 'the scores come from an overridden get_scores, which only the reference calls'
    for norm in (attn.layer_norm, ff.layer_norm):
        if not (type(norm) is nn.LayerNorm and norm.weight is not None and norm.bias is not None
                and len(norm.normalized_shape) == 1):
            return f'a {type(norm).__name__}: the kernel computes an affine LayerNorm over the last axis'
    return None


class LayerStep(NamedTuple):
    """One layer's part of a fused call: what the kernel reads of it, its position terms and its memory's keys and
    values."""
    parts: _Parts
    # The attention's position terms, from the layer's position arguments
    terms: RelativeTerms
    # The keys and values of the memory `[2, bsz, n_head, mlen, d_head]`, or None without a memory
    mems_kv: Optional[torch.Tensor]
    # How many keys: the memory's and the segment's
    klen: int

    def arguments(self, window: int) -> native_decoder_layer.LayerArguments:
        attn, ff, terms = self.parts.attn, self.parts.ff, self.terms
        k_memory, values_memory = (None, None) if self.mems_kv is None else self.mems_kv.unbind(0)
        return native_decoder_layer.LayerArguments(
            attn.n_head, attn.pre_lnorm, *self.parts.weights, _norm(attn.layer_norm), _norm(ff.layer_norm),
            k_memory, values_memory, terms.table, terms.content_bias, terms.position_bias, terms.entry_bias,
            attn.scale, window)


class Stack(NamedTuple):
    """A fused call: the first layer's input, how many keys each query sees, and every layer's part."""
    # `[qlen, bsz, d_model]`
    x: torch.Tensor
    window: int
    layers: List[LayerStep]


# What the model gives for layer `i`: its position arguments (as its `forward` takes them), its memory and that
# memory's kept keys and values (None, None without a memory)
LayerInputs = Callable[[int], Tuple[tuple, Optional[torch.Tensor], Optional[torch.Tensor]]]


class FusedLayers:
    """A model's choice of the fused call, with what the kernel reads of each of its layers (kept per layer index
    while the layer is the same, with the same modules and parameters)."""

    def __init__(self):
        self.parts: Dict[int, _Parts] = {}

    def clear(self) -> None:
        self.parts = {}

    def _parts(self, i: int, layer: nn.Module) -> _Parts:
        parts = self.parts.get(i)
        if parts is None or not parts.of_layer(layer):
            parts = self.parts[i] = _Parts.of(layer)
        return parts

    def chosen_stack(self, plan: Plan, layers: nn.ModuleList, x: torch.Tensor, inputs_of: LayerInputs,
                     window: int) -> Optional[Stack]:
        """
        The fused call of all `layers` where `dispatch.decoder_layers` chooses it, else None (their modules run).

        Args:
            plan: the call's `dispatch.Plan`.
            layers: the model's decoder layers (of `layers.py`).
            x: the first layer's input `[qlen, bsz, d_model]`; each later layer takes the one before's output.
            inputs_of: layer `i`'s position arguments, memory and kept keys and values (asked only where nothing
                in the run refuses the fused call first).
            window: how many keys up to its own position each query sees.
        """
        stack = Stack(x, window, [])

        def fused_refusal() -> Optional[str]:
            qlen = x.shape[0]
            for i, layer in enumerate(layers):
                parts = self._parts(i, layer)
                if parts.structure is not None:
                    return f'layer {i}: {parts.structure}'
                position_args, mems, mems_kv = inputs_of(i)
                klen = qlen + (0 if mems_kv is None else mems_kv.shape[3])
                step = LayerStep(parts, parts.attn.position_terms(plan, qlen, klen, x, *position_args), mems_kv,
                                 klen)
                refusal = _refusal(plan, stack, step, mems)
                if refusal is not None:
                    return f'layer {i}: {refusal}'
                stack.layers.append(step)
            return None

        if dispatch.decoder_layers(plan, x.shape[0] * x.shape[1], fused_refusal) == 'fused':
            return stack
        return None


def _has_hooks(modules: Tuple[nn.Module, ...]) -> bool:
    """Whether calling these modules would run a hook: their own or a global one (`nn.Module.__call__`'s test)."""
    return bool(module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks
                or module_hooks._global_backward_hooks or module_hooks._global_backward_pre_hooks
                or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                       for m in modules))


def _refusal(plan: Plan, stack: Stack, step: LayerStep, mems: Optional[torch.Tensor]) -> Optional[str]:
    """Why the kernel may not compute `step` in `stack`, of what may change between calls, or None."""
    if _has_hooks(step.parts.modules):
        return 'a module of the layer has hooks, which the fused call would not run'
    attention = dispatch.attention_kernel_refusal(plan, stack.x, step.klen, step.terms, stack.window)
    if attention is not None:
        return f'the attention kernel does not serve it: {attention}'
    if any(dropout.training and dropout.p > 0 for dropout in step.parts.dropouts):
        return 'dropout in training'
    if mems is not None and mems.shape[0] > 0 and step.mems_kv is None:
        return ("the memory's keys and values are not kept (a memory this model did not return, or changed "
                "parameters): projecting the memory is not a few rows")
    if stack.x.dtype != torch.float32 or not all(w.dtype == torch.float32 and w.is_contiguous()
                                                 for w in step.parts.weights):
        return 'the kernel takes float32 inputs and contiguous float32 weights'
    return None


def run(stack: Stack) -> Tuple[List[torch.Tensor], List[KeysValues]]:
    """
    Every layer's output and the `KeysValues` of its attention (the memory's as kept, the segment's computed here),
    as calling the layers one after another with `return_kv=True` gives them.

    Shape:
        `stack.x` `[qlen, bsz, d_model]`; returns outputs `[qlen, bsz, d_model]`.
    """
    qlen, bsz, d_model = stack.x.shape
    x = stack.x.reshape(qlen * bsz, d_model).contiguous()
    outputs, projections = native_decoder_layer.decoder_layers(
        x, qlen, [step.arguments(stack.window) for step in stack.layers])
    keys_values = []
    for step, qkv in zip(stack.layers, projections):
        attn = step.parts.attn
        # The segment's keys and values, $[W_k; W_v] x$, in the layout the modules give them
        kv = attn._kv_heads(qkv.view(qlen, bsz, -1)[:, :, attn.n_head * attn.d_head:])
        keys_values.append(KeysValues(step.mems_kv, kv))
    return [out.view(qlen, bsz, d_model) for out in outputs], keys_values


def _norm(norm: nn.LayerNorm) -> tuple:
    return norm.weight, norm.bias, norm.eps
