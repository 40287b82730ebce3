r"""
# Which implementation computes it: the one place that decides

Every formula of this package is written once, readably: attention in `attention/reference.py` (the
specification), the layers in their modules. Faster implementations of the same numbers exist:

| operation | implementations, in the order they are tried |
| --- | --- |
| attention (relative or plain) | `kernel` (ours, `native/attention.py`), `sdpa` (`scaled_dot_product_attention`, the position terms as its bias), `composite` (head-major PyTorch, `attention/composite.py`), `reference` (`attention/reference.py`) |
| linear layer | `few rows` (ours, `native/few_rows_linear.py`), `prepacked` (oneDNN, `prepacked_linear.py`), `F.linear` |
| residual + layer norm | `kernel` (`native/layer_norm.py`), `PyTorch` |
| dropout | `kernel` (`native/dropout.py`), `16-bit` (`dropout.py`), `nn.Dropout` |
| a Transformer-XL model's layers, a few rows | `fused` (all layers in one call of ours, `native/decoder_layer.py`, given them by `xl/fused_step.py`), `modules` (each layer's modules, each operation chosen as above) |

This module chooses among them, once per call, from the inputs and the state of the run: device, dtype, whether
gradients are recorded, autocast, `torch.compile`, dropout, the mask. Model code asks it (`attend`, `linear`,
`residual_layer_norm`, `dropout_path`, `decoder_layers`) and never tests that state itself. Each refused
implementation has a reason, as `torch.nn.TransformerEncoderLayer` names why its fast path is not taken;
`recording()` collects the choices:

    with dispatch.recording() as choices:
        model(data, target)
    print(dispatch.summary(choices))

`impl='reference'` asks for the specification wherever one is written (attention's reference, `F.linear`, PyTorch's
layer norm): the original's computation, to compare against. Dropout draws the same masks either way.
"""
import contextlib
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as module_hooks

from ..attention.composite import composite_attention, rotate_heads, sdpa_attention
from ..attention.masks import decoder_key_window, heads_mask
from ..attention.reference import RelativeTerms, attention, scores_of_terms
from ..errors import require_one_of
# (`dropout` calls `dropout_path` here: a module import, read at call time, whichever is imported first)
from . import dropout as seeded_dropout, prepacked_linear
from .native import attention as native_attention
from .native import decoder_layer as native_decoder_layer
from .native import dropout as native_dropout
from .native import few_rows_linear as native_few_rows
from .native import layer_norm as native_layer_norm
from .native.build import native_kernels_enabled

if TYPE_CHECKING:
    from ..xl.fused_step import LayerParts

def check_impl(impl: str) -> str:
    """`impl`, or a `ValueError` naming what is accepted."""
    return require_one_of('impl', impl, {'auto': 'the fastest implementation that serves each call',
                                         'reference': 'the readable specification, to compare against'})


@dataclass(frozen=True)
class Plan:
    """The state a call runs in, taken once at its entry (`Plan.now`) and passed to what it calls."""
    impl: str
    device_type: str
    grad: bool
    autocast: Optional[torch.dtype]
    compiling: bool
    # Whether our C++ kernels may run (not `LABML_TXL_NATIVE=0`, not inside `native.disabled()`)
    native: bool = True

    @classmethod
    def now(cls, device: torch.device, impl: str = 'auto') -> 'Plan':
        device_type = device.type
        autocast = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        return cls(check_impl(impl), device_type, torch.is_grad_enabled(), autocast, torch.compiler.is_compiling(),
                   native_kernels_enabled())

    @property
    def keeps_caches(self) -> bool:
        """Whether values derived from parameters (kept keys and values, projected tables) may be kept across calls:
        without gradients (nothing to differentiate through them), outside `torch.compile` (it folds them), and not
        for the reference (the original recomputes them)."""
        return self.keeps_shapes and not self.grad

    @property
    def keeps_shapes(self) -> bool:
        """Whether values that depend only on shapes (positions, masks) may be kept: outside `torch.compile`, and not
        for the reference."""
        return self.impl == 'auto' and not self.compiling


@dataclass(frozen=True)
class Choice:
    """What ran for one call, and why each implementation tried before it was refused."""
    operation: str
    chosen: str
    refused: Tuple[Tuple[str, str], ...] = ()

    def __str__(self) -> str:
        why = ''.join(f'; not {name}: {reason}' for name, reason in self.refused)
        return f'{self.operation}: {self.chosen}{why}'


_recorders: List[List[Choice]] = []


@contextlib.contextmanager
def recording() -> Iterator[List[Choice]]:
    """Collect every `Choice` made inside the block (for debugging and the benchmark)."""
    choices: List[Choice] = []
    _recorders.append(choices)
    try:
        yield choices
    finally:
        # (by identity: two blocks may have recorded equal lists)
        del _recorders[next(i for i, recorder in enumerate(_recorders) if recorder is choices)]


def summary(choices: List[Choice]) -> str:
    """The distinct choices, one a line, with how often each was made."""
    return '\n'.join(f'{n:6d} x {choice}' for choice, n in Counter(str(c) for c in choices).most_common())


def _decide(operation: str, candidates: List[Tuple[str, Optional[str]]]) -> str:
    """The first candidate without a reason against it (the last has none); recorded with the reasons before it."""
    refused = []
    for name, reason in candidates:
        if reason is None:
            if _recorders:
                choice = Choice(operation, name, tuple(refused))
                for choices in _recorders:
                    choices.append(choice)
            return name
        refused.append((name, reason))
    raise AssertionError(f'no implementation of {operation} took the call: {refused}')


# -- attention --

ScoreHook = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def replaceable_scores(get_scores: Callable) -> Callable:
    """Mark a module's `get_scores` as the scores its `RelativeTerms` describe (or $q_i^\\top k_j$ without terms),
    which the fast implementations compute without calling it. An override without the mark is called by the
    reference path, the only one that runs it."""
    get_scores.replaceable_scores = True
    return get_scores


def score_hook(module: nn.Module, **arguments) -> Optional[ScoreHook]:
    """`module.get_scores` (with `arguments` bound) where its class overrides it with scores of its own, for
    `attend`'s `get_scores`; None where it is a marked one (`replaceable_scores`)."""
    if getattr(type(module).get_scores, 'replaceable_scores', False):
        return None
    return lambda q, k: module.get_scores(q, k, **arguments)


def _dropout_active(dropout: Optional[nn.Module]) -> bool:
    return dropout is not None and dropout.training and dropout.p > 0


def _may_mask_a_whole_row(masked: Optional[torch.Tensor], window: Optional[int]) -> bool:
    """Whether some query has every key masked (a decoder's window mask, `window`, never does)."""
    return masked is not None and window is None and bool(masked.all(dim=1).any())


def _kernel_refusal(plan: Plan, klen: int, terms: Optional[RelativeTerms], window: Optional[int],
                    tensors: List[torch.Tensor]) -> Optional[str]:
    """Why our attention kernel may not compute an attention of these terms over `klen` keys, or None."""
    if terms is None or terms.table is None:
        return "no relative table (the kernel computes Transformer-XL's position terms with one)"
    if terms.table.shape[-2] < klen:
        return f'a table of {terms.table.shape[-2]} entries for {klen} keys: the kernel reads one entry per distance'
    return _kernel_run_refusal(plan, window, tensors)


def _kernel_run_refusal(plan: Plan, window: Optional[int], tensors: List[torch.Tensor]) -> Optional[str]:
    """Why our attention kernel may not run in this call, on these tensors, each query seeing `window` keys (None:
    not a decoder's window), whatever the position terms; or None."""
    if not plan.native:
        return 'our kernels are disabled (LABML_TXL_NATIVE=0 or native.disabled())'
    if plan.device_type != 'cpu':
        return f'on {plan.device_type}: the kernel runs on the CPU'
    if plan.autocast is not None:
        return f'under autocast to {plan.autocast}: the kernel computes in float32'
    if plan.compiling:
        return 'inside torch.compile, which does not trace it'
    other = next((t for t in tensors if t.dtype != torch.float32 or t.device.type != 'cpu'), None)
    if other is not None:
        return f'an input is {other.dtype} on {other.device.type}: the kernel takes float32 CPU tensors'
    if window is None:
        return "the mask is not a decoder's causal or same_length window"
    if not native_attention.kernel_available():
        return 'the kernel could not be built, or failed its first check'
    return None


def choose_attention(plan: Plan, q: torch.Tensor, klen: int, masked: Optional[torch.Tensor],
                     terms: Optional[RelativeTerms], get_scores: Optional[ScoreHook], dropout: Optional[nn.Module],
                     need_weights: bool, round_scores_to_float32: bool, tensors: List[torch.Tensor]
                     ) -> Tuple[str, Optional[int]]:
    """The implementation of `attend` for this call and, for a decoder's window mask, the number of keys each query
    sees (None for another mask)."""
    qlen = q.shape[-2]
    # (the mask is read only in eager mode: under `torch.compile` reading it would break the graph)
    masked_2d = None if plan.compiling else heads_mask(masked)
    window = decoder_key_window(masked_2d, qlen, klen) if masked_2d is not None and masked_2d.dim() == 2 else None
    if plan.impl == 'reference':
        everything = "impl='reference' asks for the specification"
        return _decide('attention', [('kernel', everything), ('sdpa', everything), ('composite', everything),
                                     ('reference', None)]), window
    # A reason that holds for every implementation but the reference
    common = None
    if get_scores is not None:
        common = 'the scores come from an overridden get_scores, which only the reference calls'
    elif round_scores_to_float32 and q.dtype == torch.float64:
        # (in float32 or narrower the rounding changes nothing: every implementation serves)
        common = 'float64 scores are rounded to float32 before the softmax (only the reference shows them)'
    kernel = common or _kernel_refusal(plan, klen, terms, window, [q] + tensors)
    if kernel is None and need_weights:
        kernel = 'the weights are asked for (need_weights), which the kernel never keeps'
    if kernel is None and _dropout_active(dropout):
        kernel = 'attention dropout in training: the kernel has none'
    sdpa = common
    if sdpa is None and need_weights:
        sdpa = 'the weights are asked for (need_weights), which SDPA never shows'
    if sdpa is None and terms is not None and plan.grad and any(t.requires_grad for t in terms.tensors()):
        sdpa = ('gradients are recorded through the position terms: SDPA has no fused backward for a bias that '
                'needs one (slower than the composite)')
    if sdpa is None and _dropout_active(dropout):
        sdpa = 'attention dropout in training: SDPA would draw its own masks, other than the other paths draw'
    if sdpa is None and masked is not None and plan.compiling:
        sdpa = 'inside torch.compile the mask is not read, and a query with every key masked would give NaN in SDPA'
    elif sdpa is None and _may_mask_a_whole_row(masked, window):
        sdpa = 'a query has every key masked: SDPA gives NaN there, the others give zero weights'
    chosen = _decide('attention', [('kernel', kernel), ('sdpa', sdpa), ('composite', common), ('reference', None)])
    return chosen, window


def attend(plan: Plan, q: torch.Tensor, k: torch.Tensor, values: torch.Tensor, *, scale: float,
           masked: Optional[torch.Tensor] = None, terms: Optional[RelativeTerms] = None,
           get_scores: Optional[ScoreHook] = None, dropout: Optional[nn.Module] = None, need_weights: bool = False,
           k_memory: Optional[torch.Tensor] = None, values_memory: Optional[torch.Tensor] = None,
           round_scores_to_float32: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    r"""
    $\mathop{Attn}_i = \sum_j \mathop{softmax}_j(\mathit{scale} \cdot A_{i,j})\, v_j$ over the keys not `masked`,
    with `dropout` on the weights, by the implementation `choose_attention` picks. $A$ is $q_i^\top k_j$, or as
    `terms` describe it (`RelativeTerms`: the queries and keys rotated by position, a relative table, a bias per
    distance), or whatever `get_scores` computes (labml_nn's hook: the reference then calls it on the seq-first
    queries and keys).

    The queries are the last `qlen` of the `klen` key positions. Keys and values come in one part (`k`, `values`)
    or two: the memory's (`k_memory`, `values_memory`) then the segment's; the kernel reads both where they are.

    Shape:
        `q` `[batch, heads, qlen, d_head]`, `k`, `values` `[batch, heads, len, d_head]`, `k_memory`, `values_memory`
        `[batch, heads, mlen, d_head]` or None (any strides); `masked` True where a key is masked, `[qlen, klen]` or
        `[qlen or 1, klen, batch or 1]`; `get_scores(q, k)` takes `[len, batch, heads, d_head]` and returns
        `[qlen, klen, batch, heads]`. Returns `[qlen, batch, heads * d_head]` and, with `need_weights`, the
        weights `[qlen, klen, batch, heads]` (else None).
    """
    klen = k.shape[-2] + (0 if k_memory is None else k_memory.shape[-2])
    tensors = [t for t in (k, values, k_memory, values_memory) if t is not None]
    tensors += [] if terms is None else terms.tensors()
    chosen, window = choose_attention(plan, q, klen, masked, terms, get_scores, dropout, need_weights,
                                      round_scores_to_float32, tensors)
    if chosen != 'reference' and terms is not None and terms.rotary_features:
        # RoFormer's rotation by position first (the reference rotates inside `scores_of_terms`)
        q, k, k_memory = rotate_heads(q, k, k_memory, terms.rotary_features)
        terms = replace(terms, rotary_features=0)
    if chosen == 'kernel':
        needs_grad = plan.grad and any(t.requires_grad for t in [q] + tensors)
        return native_attention.causal_relative_attention(
            q, k, values, terms.table, terms.content_bias, terms.position_bias, scale, terms.entry_bias, window,
            k_memory=k_memory, values_memory=values_memory, needs_grad=needs_grad), None
    if k_memory is not None:
        k, values = torch.cat([k_memory, k], dim=-2), torch.cat([values_memory, values], dim=-2)
    if chosen == 'reference':
        return _reference(q, k, values, scale, masked, terms, get_scores, dropout, need_weights,
                          round_scores_to_float32, rows_may_be_empty=window is None)
    if chosen == 'sdpa':
        return sdpa_attention(q, k, values, scale, masked, terms), None
    out, weights = composite_attention(q, k, values, scale, masked, terms, dropout,
                                       rows_may_be_empty=window is None)
    return out, (weights.permute(2, 3, 0, 1) if need_weights else None)


def _reference(q, k, values, scale, masked, terms, get_scores, dropout, need_weights, round_scores_to_float32,
               rows_may_be_empty):
    """`relative_attention.attention` on the seq-first views of the head-major inputs."""
    q, k, values = (t.permute(2, 0, 1, 3) for t in (q, k, values))
    scores = scores_of_terms(q, k, terms) if get_scores is None else get_scores(q, k)

    def head_major_dropout(weights: torch.Tensor) -> torch.Tensor:
        # Dropped in the element order of `[batch, heads, qlen, klen]`: the masks the other paths draw
        return dropout(weights.permute(2, 3, 0, 1)).permute(2, 3, 0, 1)

    out, weights = attention(scores, values, masked, scale, None if dropout is None else head_major_dropout,
                             round_scores_to_float32, rows_may_be_empty)
    return out.flatten(-2), (weights if need_weights else None)


# -- linear layers, layer norm, dropout --

def _inference_refusal(plan: Plan, x: Optional[torch.Tensor] = None,
                       weight: Optional[torch.Tensor] = None) -> Optional[str]:
    """Why a path without backward, for float32 inference on the CPU, may not run this call (with these input and
    weight where given), or None."""
    if plan.impl == 'reference':
        return "impl='reference'"
    if plan.grad:
        return 'gradients are recorded (it has no backward)'
    if plan.device_type != 'cpu' or any(t is not None and t.dtype != torch.float32 for t in (x, weight)):
        return 'it serves float32 on the CPU'
    if plan.autocast is not None or plan.compiling:
        return 'under autocast or torch.compile'
    return None


def _few_rows_refusal(plan: Plan, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]
                      ) -> Optional[str]:
    """Why our few-rows kernel (`native/few_rows_linear.py`) may not compute this product, or None."""
    refusal = _inference_refusal(plan, x, weight)
    if refusal is not None:
        return refusal
    if not plan.native:
        return 'our kernels are disabled'
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not 1 <= rows <= native_few_rows.MOST_ROWS:
        return (f'{rows} rows: the kernel takes 1 to {native_few_rows.MOST_ROWS} (from about 32 rows the GEMM '
                f'libraries are as fast or faster)')
    if not weight.is_contiguous() or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous())):
        return 'the kernel reads a contiguous weight and bias'
    if not native_few_rows.kernel_available():
        return 'the kernel could not be built, or failed its first check'
    return None


def _prepacked_refusal(plan: Plan, x: torch.Tensor, weight: torch.Tensor) -> Optional[str]:
    """Why oneDNN's product with `weight` prepacked (`prepacked_linear.py`) may not run this call, or None."""
    refusal = _inference_refusal(plan, x, weight)
    if refusal is not None:
        return refusal
    if not isinstance(weight, nn.Parameter):
        return 'the weight is made per call: packing it would cost more than it saves'
    if x.numel() == x.shape[-1]:
        return 'a single row: a matrix-vector product, which oneDNN does slower than F.linear'
    if not prepacked_linear.available():
        return "oneDNN's linear ops are missing or failed their first check"
    return None


def linear(plan: Plan, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           relu: bool = False, dropout: Optional[nn.Module] = None) -> torch.Tensor:
    r"""$x W^\top + b$, and with `relu` $\max(0, \cdot)$ of it, then `dropout` (a `fast.dropout.Dropout`) on that: by our
    kernel for a few rows, by oneDNN with `weight` prepacked for more, where they serve, else `F.linear`. The ReLU is
    applied by the product itself, or, where the dropout draws a mask, together with it in place (`relu_dropout_`).

    Shape:
        `x` `[..., in_features]`, `weight` `[out_features, in_features]`, `bias` `[out_features]` or None."""
    if relu and _dropout_active(dropout):
        return seeded_dropout.relu_dropout_(linear(plan, x, weight, bias), dropout)
    few_rows = _few_rows_refusal(plan, x, weight, bias)
    candidates = [('few rows', few_rows)]
    if few_rows is not None:
        # (oneDNN's reasons matter only where the kernel is refused)
        candidates.append(('prepacked', _prepacked_refusal(plan, x, weight)))
    chosen = _decide('linear', candidates + [('F.linear', None)])
    if chosen == 'few rows':
        y = native_few_rows.few_rows_linear(x, weight, bias, relu)
    elif chosen == 'prepacked':
        y = prepacked_linear.prepacked_linear(x, weight, bias, relu)
    else:
        y = F.linear(x, weight, bias)
        y = torch.relu_(y) if relu else y
    return y if dropout is None else dropout(y)


def _has_hooks(modules: Sequence[nn.Module]) -> bool:
    """Whether calling these modules would run a hook: their own or a global one (`nn.Module.__call__`'s test)."""
    return bool(module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks
                or module_hooks._global_backward_hooks or module_hooks._global_backward_pre_hooks
                or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                       for m in modules))


def _layer_structure_refusal(layer: 'LayerParts') -> Optional[str]:
    """Why the decoder-layer kernel cannot compute this layer whatever the call, or None."""
    if not layer.own_forwards:
        return 'a class overrides forward, which the fused call would not run'
    if not layer.joint_projection:
        return ('absolute positions or a scheme of their own (attention types 2 to 6): the kernel computes '
                "Transformer-XL's relative attention, with a table")
    if not layer.replaceable_scores:
        return 'the scores come from an overridden get_scores, which only the reference calls'
    if layer.other_norm is not None:
        return f'a {type(layer.other_norm).__name__}: the kernel computes an affine LayerNorm over the last axis'
    return None


def _layer_refusal(plan: Plan, x: torch.Tensor, klen: int, window: int, layer: 'LayerParts',
                   memory_kept: bool) -> Optional[str]:
    """Why the decoder-layer kernel may not compute this layer in this call, or None."""
    structure = _layer_structure_refusal(layer)
    if structure is not None:
        return structure
    if _has_hooks(layer.modules):
        return 'a module of the layer has hooks, which the fused call would not run'
    attention = _kernel_run_refusal(plan, window, [x])
    if attention is not None:
        return f'the attention kernel does not serve it: {attention}'
    if any(dropout.training and dropout.p > 0 for dropout in layer.dropouts):
        return 'dropout in training'
    if not memory_kept:
        return ("the memory's keys and values are not kept (a memory this model did not return, or changed "
                "parameters): projecting the memory is not a few rows")
    if x.dtype != torch.float32 or not all(w.dtype == torch.float32 and w.is_contiguous() for w in layer.weights):
        return 'the kernel takes float32 inputs and contiguous float32 weights'
    return None


def decoder_layers(plan: Plan, x: torch.Tensor, klen: int, window: int, layers: Sequence['LayerParts'],
                   memory_kept: Sequence[bool], branched: Sequence[bool] = ()) -> str:
    """
    How a Transformer-XL model's layers run on `x`: `'fused'` (all of them in one call of our decoder-layer kernel,
    `xl/fused_step.py`) or `'modules'` (each layer's modules, each operation chosen here as it comes).

    Args:
        plan: the call's plan.
        x: the first layer's input `[qlen, bsz, d_model]`.
        klen: how many keys: the memory's and the segment's.
        window: how many keys up to its own position each query sees.
        layers: what the kernel would read of each layer (`xl/fused_step.LayerParts`), read only where nothing of the
            call refuses the kernel first.
        memory_kept: per layer, whether the keys and values of its memory are at hand (kept from the step before, or
            no memory): the kernel does not project a memory.
        branched: per layer, whether a memory mechanism adds a second attention to it (the kNN memory's
            retrieval), which the kernel does not compute.
    """
    rows = x.shape[0] * x.shape[1]
    fused = _inference_refusal(plan)
    if fused is None and not plan.native:
        fused = 'our kernels are disabled'
    if fused is None and not 1 <= rows <= native_few_rows.MOST_ROWS:
        fused = f'{rows} rows: its products are for 1 to {native_few_rows.MOST_ROWS} (generation\'s steps)'
    if fused is None and any(branched):
        fused = (f'layer {list(branched).index(True)}: a memory mechanism adds a second attention (the kNN memory), '
                 f'which the kernel does not compute')
    if fused is None and not native_decoder_layer.kernel_available():
        fused = 'the decoder-layer kernel could not be built, or failed its first check'
    # (each layer's parts are read only here, where nothing of the call refused the kernel first)
    i = 0
    while fused is None and i < len(layers):
        refusal = _layer_refusal(plan, x, klen, window, layers[i], memory_kept[i])
        fused = None if refusal is None else f'layer {i}: {refusal}'
        i += 1
    return _decide('decoder layers', [('fused', fused), ('modules', None)])


def memory_projection(plan: Plan) -> str:
    """How a Transformer-XL attention projects its memory: `'apart'` (the segment by $[W_q; W_k; W_v]$, the memory by
    $[W_k; W_v]$ only, or not at all where its keys and values are kept) or `'with the segment'` (the original's one
    product of `[memory, segment]`, the memory's queries dropped). The same numbers; apart saves a third of the
    memory's product."""
    refusal = "impl='reference' projects as the original" if plan.impl == 'reference' else None
    return _decide('memory projection', [('apart', refusal), ('with the segment', None)])


def softmax_clusters(plan: Plan) -> str:
    """Which clusters of an adaptive softmax a loss computes: `'target clusters'` (for each row only its target's
    cluster, the rows gathered per cluster: data-dependent shapes) or `'every cluster'` (every row over the whole
    vocabulary, then the target's entry)."""
    refusal = 'inside torch.compile: no data-dependent shapes' if plan.compiling else None
    return _decide('adaptive softmax', [('target clusters', refusal), ('every cluster', None)])


def residual_layer_norm(plan: Plan, residual: torch.Tensor, x: torch.Tensor, layer_norm: nn.LayerNorm) -> torch.Tensor:
    r"""$\mathop{LN}(\mathit{residual} + x)$: by our kernel in one pass where it serves, else
    `layer_norm(residual + x)`."""
    weight, bias = layer_norm.weight, getattr(layer_norm, 'bias', None)
    refusal = None
    if plan.impl == 'reference':
        refusal = "impl='reference'"
    elif not plan.native:
        refusal = 'our kernels are disabled'
    elif not isinstance(layer_norm, nn.LayerNorm):
        refusal = f'a {type(layer_norm).__name__}: the kernel computes LayerNorm'
    elif plan.grad or plan.autocast is not None or plan.compiling:
        refusal = 'gradients are recorded, or under autocast or torch.compile (the kernel is for float32 inference)'
    elif (weight is None or bias is None or len(layer_norm.normalized_shape) != 1 or x.shape != residual.shape
          or not all(t.device.type == 'cpu' and t.dtype == torch.float32 and t.is_contiguous()
                     for t in (x, residual, weight, bias))):
        refusal = 'the kernel takes contiguous float32 CPU tensors of one shape and an affine norm over the last axis'
    elif not native_layer_norm.kernel_available():
        refusal = 'the kernel could not be built, or failed its first check'
    if _decide('residual layer norm', [('kernel', refusal), ('PyTorch', None)]) == 'kernel':
        return native_layer_norm.residual_layer_norm(residual, x, layer_norm)
    return layer_norm(residual + x)


def dropout_path(dropout: nn.Dropout, x: torch.Tensor, threshold: int) -> str:
    r"""How `dropout.Dropout` draws the mask of `x`: `'kernel'` (ours, inside the pass that applies it), `'16-bit'`
    (PyTorch's draws of 16-bit integers) or `'nn.Dropout'`. Not a matter of `impl`: the masks must not depend on
    it. `threshold` is $t = \mathop{round}(p \cdot 2^{16})$."""
    own = None
    if not dropout.training or not 0 < threshold < 2 ** 16:
        own = 'not training, or p within 2^-17 of 0 or 1'
    elif x.device.type != 'cpu' or not x.is_floating_point():
        own = "not a floating-point CPU tensor (CUDA's fused dropout is faster)"
    elif torch.compiler.is_compiling():
        own = 'inside torch.compile, which has its own random numbers'
    kernel = own
    if kernel is None and not (native_kernels_enabled() and x.dtype == torch.float32):
        kernel = 'our kernels are disabled, or not float32'
    if kernel is None and not native_dropout.kernel_available():
        kernel = 'the kernel could not be built, or failed its first check'
    return _decide('dropout', [('kernel', kernel), ('16-bit', own), ('nn.Dropout', None)])

