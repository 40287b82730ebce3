r"""
# Causal relative attention in one kernel (float32 on the CPU, forward and backward)

A decoder's relative attention (`attention/reference.py`) for queries that are the last `qlen` of `klen` keys,
query $i$ (at position $m + i$) seeing the `window` keys up to its own position, $J_i = \{j : m + i - w < j \le
m + i\}$ ($w \ge k$: every key up to it, the decoder's causal mask; $w$ = `mem_len`: `same_length`'s mask):

$$\mathit{out}_i = \sum_{j \in J_i} \mathop{softmax}_j\bigl(\mathit{scale} \cdot A_{i,j}\bigr)\, v_j, \qquad
  A_{i,j} = (q_i + a)^\top k_j + (q_i + b)^\top r_{s} + c_{s}, \quad s = j + q - 1 - i$$

with the content bias $a$ ($u$), the position bias $b$ ($v$) and attention type 1's per-entry bias $c$ each
optional. PyTorch's fastest path for it (SDPA with the position terms as its bias, `dispatch.py`) computes the
position terms of every query against every table entry into a buffer, `[batch, heads, qlen,
klen]` of them written to memory, and SDPA then reads them back as a bias and multiplies the full $q \times k$
products, masked keys included. The kernel (`causal_relative_attention.cpp`) works per block of 32 queries of
one head:

* it multiplies only the keys that some query of the block can see, and for the table only the entries those
  keys need: with a memory as long as the segment, a quarter of the products of the causal mask is the masked
  future, now skipped (and with `same_length`, the masked past too);
* the block's position terms are used where they are made (in cache), read with the relative shift as an
  offset per row: row $r$ of the block reads its entries from $31 - r$ on;
* the scale, the mask, the softmax and the normalisation are one pass over each row's visible keys; the output
  goes straight into `[qlen, batch, heads, d_head]`, the heads concatenated with no copy.

In training the forward pass also keeps the weights, and the backward pass walks the same blocks: the weights'
gradient $dO\, V^\top$, the scores' $G = \mathit{scale} \cdot w \odot (dw - \sum_j w\, dw)$ in one pass per row,
then $G K$, $G^\top (Q + a)$, $w^\top dO$ and, with $G$ shifted back to table entries by the same per-row offset,
the table's and the biases' gradients; the masked future is skipped there too, and nothing of the shape
`[batch, heads, qlen, klen + 1]` is zero-filled or copied.

Its products are PyTorch's `brgemm` (or BLAS's `sgemm` where PyTorch lacks it), its `exp` a polynomial the
compiler vectorises (within 1.4 ulp). Its first check compares it, forward and backward, with the reference
(`attention/reference.py`); `dispatch.py` decides where it runs (float32 CPU tensors, outside autocast and
`torch.compile`, exactly a `decoder_window_mask`, no attention dropout). `docs/performance.md` has its timings.
"""
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from ...attention.masks import decoder_window_mask
from ...attention.reference import attention, relative_attention_scores
from .build import checked_kernel, first_result_matches

# Queries per block: 32 and 64 ran alike on the benchmark's layer, 16 and 128 slower
QUERY_BLOCK = 32


def _reference(q, k, values, table, content_bias, position_bias, entry_bias, scale, window):
    """`attention/reference.py`'s computation of what the kernel computes, `[qlen, batch, heads, d_head]`."""
    qlen, klen = q.shape[-2], k.shape[-2]
    q, k, values = (t.permute(2, 0, 1, 3) for t in (q, k, values))
    scores = relative_attention_scores(q, k, table.transpose(0, 1), content_bias, position_bias,
                                       None if entry_bias is None else entry_bias.transpose(0, 1))
    return attention(scores, values, decoder_window_mask(qlen, klen, window), scale)[0]


def _check(module) -> bool:
    """Run the kernel once on a small input with every bias and compare with `_reference`: the inference pass, and
    the training passes' output and the gradients of every input."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    # 2 batches, 3 heads, 37 queries (a partial block) behind 11 keys of memory, each seeing at most 20, heads of 8
    inputs = (randn(2, 3, 37, 8), randn(2, 3, 48, 8), randn(2, 3, 48, 8), randn(3, 49, 8), randn(3, 8), randn(3, 8),
              randn(3, 49))
    q, k, values, table, content_bias, position_bias, entry_bias = inputs
    grad_out = randn(37, 2, 3, 8)

    def trained_by_kernel():
        out, weights = module.causal_relative_attention_forward(*inputs, 0.3, 20, QUERY_BLOCK)
        grads = module.causal_relative_attention_backward(grad_out, q, k, values, table, content_bias, position_bias,
                                                          True, weights, 0.3, 20, QUERY_BLOCK)
        grad_q, grad_k, grad_values, *per_batch = grads
        return torch.cat([t.flatten() for t in [out, grad_q.permute(1, 2, 0, 3), grad_k, grad_values]
                          + [g.sum(0) for g in per_batch]])

    def trained_by_reference():
        # (the first check may run inside a caller's `no_grad`)
        with torch.enable_grad():
            leaves = [t.clone().requires_grad_() for t in inputs]
            out = _reference(*leaves, 0.3, window=20)
            grads = torch.autograd.grad(out, leaves, grad_out)
        return torch.cat([t.flatten() for t in [out.detach()] + list(grads)])

    # (the keys and values in two parts, as the model passes them in inference: 17 of memory and 31 more; and the
    # last query alone, a one-token step, which has a path of its own)
    last = (q[:, :, -1:], k, values, table[:, -k.shape[2]:], content_bias, position_bias, entry_bias[:, -k.shape[2]:])
    return (first_result_matches(
        'causal relative attention',
        lambda: module.causal_relative_attention(q, k[:, :, :17], values[:, :, :17], k[:, :, 17:], values[:, :, 17:],
                                                 table, content_bias, position_bias, entry_bias, 0.3, 20, QUERY_BLOCK),
        lambda: _reference(*inputs, 0.3, window=20))
        and first_result_matches(
            'causal relative attention (one query)',
            lambda: module.causal_relative_attention(last[0], k[:, :, :47], values[:, :, :47], k[:, :, 47:],
                                                     values[:, :, 47:], *last[3:], 0.3, 20, QUERY_BLOCK),
            lambda: _reference(*last, 0.3, window=20))
        and first_result_matches('causal relative attention (training)', trained_by_kernel, trained_by_reference))


def kernel_available() -> bool:
    """Whether the kernel is built (compiling it on the first call) and passed its first check."""
    return checked_kernel('causal_relative_attention', _check) is not None


class _CausalRelativeAttention(torch.autograd.Function):
    r"""The kernel's forward pass, keeping the softmax weights $w$ `[batch, heads, qlen, klen]`, and its backward pass
    (`causal_relative_attention.cpp`: from the output's gradient $dO$, $G = \mathit{scale} \cdot w \odot (dO V^\top -
    \sum_j w\, dO V^\top)$, then $G K$, $G^\top (Q + a)$, $w^\top dO$ and, with $G$ shifted back to table entries,
    $G' R$, $G'^\top (Q + b)$, $\sum_i G'$), over the same blocks of keys as the forward pass. Keys and values in
    one part; the table's and biases' gradients come per batch and are summed here."""

    @staticmethod
    def forward(ctx, q, k, values, table, content_bias, position_bias, entry_bias, scale: float, window: int):
        module = checked_kernel('causal_relative_attention', _check)
        out, weights = module.causal_relative_attention_forward(q, k, values, table, content_bias, position_bias,
                                                                entry_bias, scale, window, QUERY_BLOCK)
        ctx.save_for_backward(q, k, values, table, content_bias, position_bias, weights)
        ctx.scale, ctx.window, ctx.has_entry_bias = scale, window, entry_bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        # (the kernel's gradients carry no graph: a second derivative raises rather than comes out wrong)
        q, k, values, table, content_bias, position_bias, weights = ctx.saved_tensors
        module = checked_kernel('causal_relative_attention', _check)
        grad_q, grad_k, grad_values, *per_batch = module.causal_relative_attention_backward(
            grad_out.contiguous(), q, k, values, table, content_bias, position_bias, ctx.has_entry_bias, weights,
            ctx.scale, ctx.window, QUERY_BLOCK)
        grad_table, grad_content, grad_position, grad_entry = (None if g is None else g.sum(0) for g in per_batch)
        # `[qlen, batch, heads, d_head]` seen as `q`'s `[batch, heads, qlen, d_head]`
        return (grad_q.permute(1, 2, 0, 3), grad_k, grad_values, grad_table, grad_content, grad_position, grad_entry,
                None, None)


def causal_relative_attention(q: torch.Tensor, k: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
                              content_bias: Optional[torch.Tensor], position_bias: Optional[torch.Tensor],
                              scale: float, entry_bias: Optional[torch.Tensor] = None, window: Optional[int] = None,
                              k_memory: Optional[torch.Tensor] = None, values_memory: Optional[torch.Tensor] = None,
                              needs_grad: bool = False) -> torch.Tensor:
    r"""
    $\sum_j \mathop{softmax}_j(\mathit{scale} \cdot A_{i,j}) v_j$ over the `window` keys up to each query's own
    position (None: all of them, the decoder's causal mask), by the kernel (where `dispatch.attend` chooses it). The
    keys and values are `k_memory` followed by `k` and `values_memory` followed by `values` (both memory parts None:
    `k` and `values` are all of them): without gradients the kernel reads the two parts where they are, so they
    need not be concatenated. With `needs_grad` (an input requires a gradient and autograd records), the forward
    pass keeps the attention weights (`[batch, heads, qlen, klen]`, float32) for the kernel's backward pass.

    Shape:
        `q` `[batch, heads, qlen, d_head]`, `k`, `values` `[batch, heads, len, d_head]`, `k_memory`,
        `values_memory` `[batch, heads, mlen, d_head]` (`klen = mlen + len`; any strides but the last, as `q`),
        `table` `[heads, rlen, d_head]` (entry $s$ the distance `klen - 1 - s`, `rlen >= klen`), `content_bias`
        ($a$), `position_bias` ($b$) `[heads, d_head]` or None, `entry_bias` ($c$) `[heads, rlen]` or None.
        Returns `[qlen, batch, heads * d_head]`, the heads concatenated.
    """
    batch, heads, qlen, d_head = q.shape
    klen = k.shape[-2] + (0 if k_memory is None else k_memory.shape[-2])
    window = klen if window is None else window

    def rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        # The kernel reads any strides but the last, which must be 1 (or the axis of length 1)
        return t if t is None or t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()

    def contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.contiguous()

    if needs_grad:
        if k_memory is not None:
            k, values = torch.cat([k_memory, k], -2), torch.cat([values_memory, values], -2)
        out = _CausalRelativeAttention.apply(rows(q), rows(k), rows(values), rows(table), contiguous(content_bias),
                                             contiguous(position_bias), rows(entry_bias), scale, window)
    else:
        module = checked_kernel('causal_relative_attention', _check)
        out = module.causal_relative_attention(rows(q), rows(k_memory), rows(values_memory), rows(k), rows(values),
                                               rows(table), contiguous(content_bias), contiguous(position_bias),
                                               rows(entry_bias), scale, window, QUERY_BLOCK)
    return out.view(qlen, batch, heads * d_head)
