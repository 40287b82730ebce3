r"""
# A Transformer-XL decoder layer for a few rows in one call

A one-token step of a layer is five products of one row each, one attention over the memory and two layer norms:
each a few microseconds of work. Called from Python, one after another, each also costs a call, its checks and the
views between them, and between two calls the threads that share the next product wait idle. `decoder_layer.cpp`
is the other kernels (`few_rows_linear.cpp`, `causal_relative_attention.cpp`, `residual_layer_norm.cpp`, compiled
into it) called one after another in C++:

$$[q; k; v] = [W_q; W_k; W_v]\,x, \quad h = \mathop{LN}_1\bigl(x + W_o \mathop{Attn}(q, [k_m; k], [v_m; v])\bigr),
  \quad \mathit{out} = \mathop{LN}_2\bigl(h + W_2 \max(0, W_1 h + b_1) + b_2\bigr)$$

(post-LN; with pre-LN the projections read $\mathop{LN}_1(x)$, the feed-forward $\mathop{LN}_2(h)$, and $h$ and
$\mathit{out}$ are plain sums). `xl/fused_step.py` gives it a layer's weights and position terms where
`dispatch.decoder_layer` chooses it; its first check compares it with the same layer in PyTorch.
"""
from typing import List, Optional

import torch
from torch.nn import functional as F

from .attention import QUERY_BLOCK, _reference as _reference_attention
from .build import checked_kernel, first_result_matches


def _reference(x, qlen, heads, pre_lnorm, qkv_weight, o_weight, w1, b1, w2, b2, norm1, norm2, k_memory, v_memory,
               table, content_bias, position_bias, entry_bias, scale, window) -> torch.Tensor:
    """The layer in PyTorch (`F.linear`, `F.layer_norm` and the attention kernel's reference), for the first check."""
    rows, d = x.shape
    bsz, inner = rows // qlen, o_weight.shape[1]

    def norm(t, parameters):
        return F.layer_norm(t, (d,), *parameters)

    q, k, v = F.linear(norm(x, norm1) if pre_lnorm else x, qkv_weight).view(
        qlen, bsz, 3, heads, inner // heads).permute(2, 1, 3, 0, 4)
    if k_memory is not None:
        k, v = torch.cat([k_memory, k], 2), torch.cat([v_memory, v], 2)
    attention = _reference_attention(q, k, v, table, content_bias, position_bias, entry_bias, scale,
                                     window).reshape(rows, inner)
    h = x + F.linear(attention, o_weight)
    h = h if pre_lnorm else norm(h, norm1)
    out = h + F.linear(torch.relu(F.linear(norm(h, norm2) if pre_lnorm else h, w1, b1)), w2, b2)
    return out if pre_lnorm else norm(out, norm2)


def _check(module) -> bool:
    """Run the kernel on a small layer (two queries of a batch of two, a memory, every position term), post-LN and
    pre-LN, and compare with `_reference`."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    qlen, bsz, heads, d_head, d, d_inner, mlen = 2, 2, 2, 4, 6, 10, 5
    inner, klen = heads * d_head, mlen + qlen
    norm = (1 + randn(d) / 4, randn(d), 1e-5)
    arguments = [randn(qlen * bsz, d), qlen, heads, False, randn(3 * inner, d), randn(d, inner), randn(d_inner, d),
                 randn(d_inner), randn(d, d_inner), randn(d), norm, norm, randn(bsz, heads, mlen, d_head),
                 randn(bsz, heads, mlen, d_head), randn(heads, klen, d_head), randn(heads, d_head),
                 randn(heads, d_head), randn(heads, klen), 0.4, klen - 1]
    matches = True
    for pre_lnorm in (False, True):
        arguments[3] = pre_lnorm
        matches = matches and first_result_matches(
            f"decoder layer ({'pre' if pre_lnorm else 'post'}-LN)",
            lambda: _run(module, *arguments)[0], lambda: _reference(*arguments))
    return matches


def kernel_available() -> bool:
    """Whether the kernel is built (compiling it on the first call) and passed its first check."""
    return checked_kernel('decoder_layer', _check) is not None


def _run(module, x, qlen, heads, pre_lnorm, qkv_weight, o_weight, w1, b1, w2, b2, norm1, norm2, k_memory, v_memory,
         table, content_bias, position_bias, entry_bias, scale, window) -> List[torch.Tensor]:
    return module.decoder_layer(x, qlen, heads, pre_lnorm, qkv_weight, o_weight, w1, b1, w2, b2, *norm1, *norm2,
                                k_memory, v_memory, table, content_bias, position_bias, entry_bias, scale, window,
                                QUERY_BLOCK)


def decoder_layer(x: torch.Tensor, qlen: int, heads: int, pre_lnorm: bool, qkv_weight: torch.Tensor,
                  o_weight: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                  norm1: tuple, norm2: tuple, k_memory: Optional[torch.Tensor], v_memory: Optional[torch.Tensor],
                  table: torch.Tensor, content_bias: Optional[torch.Tensor], position_bias: Optional[torch.Tensor],
                  entry_bias: Optional[torch.Tensor], scale: float, window: int) -> List[torch.Tensor]:
    r"""
    The layer's output and its projections $[W_q; W_k; W_v]\,x$ (whose keys and values the caller keeps), by the
    kernel, where `dispatch.decoder_layer` chooses it: no gradients, float32 CPU tensors, contiguous weights, at most
    `few_rows_linear.MOST_ROWS` rows.

    Args:
        x: the rows, `qlen * bsz` of them in the order of `[qlen, bsz]`, contiguous.
        qlen, heads: the queries of each sequence and the attention's heads.
        pre_lnorm: normalise before the attention and the feed-forward instead of after the residual.
        qkv_weight, o_weight, w1, b1, w2, b2: $[W_q; W_k; W_v]$, $W_o$ and the feed-forward's, as `nn.Linear`
            holds them.
        norm1, norm2: `(weight, bias, eps)` of the attention's and the feed-forward's `LayerNorm`.
        k_memory, v_memory, table, content_bias, position_bias, entry_bias, scale, window: the attention's, as
            `native.attention.causal_relative_attention` takes them (any strides).

    Shape:
        `x` `[qlen * bsz, d_model]`; returns `[qlen * bsz, d_model]` and `[qlen * bsz, 3 * heads * d_head]`.
    """
    module = checked_kernel('decoder_layer', _check)
    return _run(module, x, qlen, heads, pre_lnorm, qkv_weight, o_weight, w1, b1, w2, b2, norm1, norm2, k_memory,
                v_memory, table, content_bias, position_bias, entry_bias, scale, window)
