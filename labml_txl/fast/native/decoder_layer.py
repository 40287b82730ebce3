r"""
# Transformer-XL's decoder layers for a few rows, in one call

A one-token step of a layer is five products of one row each, one attention over the memory and two layer norms:
each some microseconds of work. Called from Python one after another, each also costs a call, its checks and the
views between them, and while Python runs between two calls the threads that share the products fall asleep, to be
woken by the next. `decoder_layer.cpp` calls the other kernels (`few_rows_linear.cpp`,
`causal_relative_attention.cpp`, `residual_layer_norm.cpp`, compiled into it) one after another in C++, for every
layer of a model in turn:

$$[q; k; v] = [W_q; W_k; W_v]\,x, \quad h = \mathop{LN}_1\bigl(x + W_o \mathop{Attn}(q, [k_m; k], [v_m; v])\bigr),
  \quad \mathit{out} = \mathop{LN}_2\bigl(h + W_2 \max(0, W_1 h + b_1) + b_2\bigr)$$

(post-LN; with pre-LN the projections read $\mathop{LN}_1(x)$, the feed-forward $\mathop{LN}_2(h)$, and $h$ and
$\mathit{out}$ are plain sums). `xl/fused_step.py` gives it the layers' weights and position terms where
`dispatch.decoder_layers` chooses it.
"""
from typing import List, NamedTuple, Optional, Tuple

import torch

from . import attention, few_rows_linear, layer_norm
from .attention import QUERY_BLOCK
from .build import load_kernel


class LayerArguments(NamedTuple):
    """One layer's weights and attention inputs, as the kernel takes them."""
    heads: int
    # Normalise before the attention and the feed-forward instead of after the residual
    pre_lnorm: bool
    # $[W_q; W_k; W_v]$, $W_o$ and the feed-forward's, as `nn.Linear` holds them (contiguous)
    qkv_weight: torch.Tensor
    o_weight: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    # `(weight, bias, eps)` of the attention's and the feed-forward's `LayerNorm`
    norm1: Tuple[torch.Tensor, torch.Tensor, float]
    norm2: Tuple[torch.Tensor, torch.Tensor, float]
    # The attention's, as `native.attention.causal_relative_attention` takes them (any strides): the memory's keys
    # and values `[bsz, heads, mlen, d_head]` or None, the table `[heads, rlen, d_head]`, $u$, $v$ `[heads, d_head]`
    # and the per-entry bias `[heads, rlen]` or None, the scale and the keys each query sees up to its own position
    k_memory: Optional[torch.Tensor]
    v_memory: Optional[torch.Tensor]
    table: torch.Tensor
    content_bias: Optional[torch.Tensor]
    position_bias: Optional[torch.Tensor]
    entry_bias: Optional[torch.Tensor]
    scale: float
    window: int

    def flat(self) -> Tuple[list, list]:
        """The tensors and the numbers, in the order `decoder_layers` of the C++ file takes them."""
        return ([self.qkv_weight, self.o_weight, self.w1, self.b1, self.w2, self.b2, *self.norm1[:2], *self.norm2[:2],
                 self.k_memory, self.v_memory, self.table, self.content_bias, self.position_bias, self.entry_bias],
                [self.heads, float(self.pre_lnorm), self.norm1[2], self.norm2[2], self.scale, self.window])


def kernel_available() -> bool:
    """Whether the kernel is built (compiling it on the first call) and the kernels it is made of passed their first
    checks. It has no check of its own: it compiles the same sources with the same flags, and what it adds, their
    order, is what `tests/fast/test_native_decoder_layer.py` and `tests/xl/test_fused_step.py` hold to the modules (a
    layer is written in the modules and in this kernel only)."""
    return (few_rows_linear.kernel_available() and attention.kernel_available() and layer_norm.kernel_available()
            and load_kernel('decoder_layer') is not None)


def _run(module, x: torch.Tensor, qlen: int, layers: List[LayerArguments]):
    tensors, numbers = zip(*(layer.flat() for layer in layers)) if layers else ((), ())
    results = module.decoder_layers(x, qlen, list(tensors), list(numbers), QUERY_BLOCK)
    return results[:len(layers)], results[len(layers):]


def decoder_layers(x: torch.Tensor, qlen: int, layers: List[LayerArguments]
                   ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    r"""
    The layers one after another, each on the last one's output, by the kernel (where `dispatch.decoder_layers`
    chooses it: no gradients, float32 CPU tensors, contiguous weights, at most `few_rows_linear.MOST_ROWS` rows):
    every layer's output and every layer's projections $[W_q; W_k; W_v]\,x$ (whose keys and values the caller
    keeps).

    Shape:
        `x` `[qlen * bsz, d_model]`, its rows in the order of `[qlen, bsz]`, contiguous; returns outputs
        `[qlen * bsz, d_model]` and projections `[qlen * bsz, 3 * heads * d_head]`.
    """
    return _run(load_kernel('decoder_layer'), x, qlen, layers)
