r"""
# Relative attention: the four score terms and the relative shift

From *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context* (Dai et al., 2019), section 3.3.
With absolute positions the score of query $i$ and key $j$ expands into four terms of the word embeddings
$E$ and absolute position embeddings $U$. Transformer-XL replaces the absolute positions of the keys by the
*relative* distance $i - j$, encoded by a sinusoid $R_{i-j}$ (not learned), and the query's position by two
learned vectors $u$ and $v$ (the same for every query position):

$$A^{rel}_{i,j} =
  \underbrace{E_{x_i}^\top W_q^\top W_{k,E} E_{x_j}}_{(a)\ \text{content}}
+ \underbrace{E_{x_i}^\top W_q^\top W_{k,R} R_{i-j}}_{(b)\ \text{content-dependent position}}
+ \underbrace{u^\top W_{k,E} E_{x_j}}_{(c)\ \text{global content bias}}
+ \underbrace{v^\top W_{k,R} R_{i-j}}_{(d)\ \text{global position bias}}$$

With $q_i = W_q E_{x_i}$, $k_j = W_{k,E} E_{x_j}$ and $r_{i-j} = W_{k,R} R_{i-j}$ the four terms pair up as

$$(a) + (c) = (q_i + u)^\top k_j, \qquad (b) + (d) = (q_i + v)^\top r_{i-j}$$

which is how they are computed here: two matrix products instead of four.

## The relative shift

$(b) + (d)$ is cheap to compute for every query against every entry $s$ of a table $r_0, r_1, \dots$ whose entry
$s$ holds the distance $k - 1 - s$ (distances in descending order, starting at the largest, $k - 1$); but
attention needs it indexed by *key position* $j$. With $q$ queries that are the last $q$ of $k$ key
positions (the first $m = k - q$ keys are the memory), query $i$ sits at position $m + i$, the distance to
key $j$ is $m + i - j$, and in the table that distance is at entry

$$s = (k - 1) - (m + i - j) = j + (q - 1 - i)$$

whether the table stops at distance $0$ (length $L = k$) or runs on to $-(q - 1)$ (length $L = k + q - 1$).
So row $i$ must be shifted left by $q - 1 - i$: the last query row not at all, the first by $q - 1$.
`relative_shift` does it without indexing: pad a zero column in front, read the `[q, L + 1]` block as
`[L + 1, q]`, drop its first row and read the rest back as `[q, L]`. Each row then starts $q - 1 - i$
entries further along.

* **Decoder** (`L = k`, distances $k - 1, \dots, 0$): the shifted score is exact for every $j \le m + i$;
  entries with $j > m + i$ (the future) are not meaningful and must be masked, which a decoder does anyway.
* **Encoder** (`L = k + q - 1`, distances $k - 1, \dots, -(q - 1)$): every key of every query is exact, so
  nothing has to be masked; keep the first $k$ columns.
"""
import functools
from typing import Optional

import torch
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary


def sinusoid_inverse_frequencies(d_model: int, dtype: torch.dtype = torch.float32,
                                 device: Optional[torch.device] = None) -> torch.Tensor:
    r"""
    The frequencies $1 / 10000^{2i / d_{model}}$ of the sinusoidal embeddings, `[d_model / 2]`.

    `d_model` must be a positive even integer (a sine and a cosine per frequency).
    """
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 2 or d_model % 2 != 0:
        raise ValueError(f"d_model={d_model!r} is not accepted for sinusoidal position embeddings: "
                         f"they pair a sine and a cosine per frequency, so d_model must be a positive even integer")
    # $\frac{1}{10000^{2i/d}}$ for $i = 0 .. d/2 - 1$, computed as the original does
    return 1 / (10000 ** (torch.arange(0.0, d_model, 2.0, dtype=dtype, device=device) / d_model))


def sinusoidal_embeddings(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    r"""
    Sinusoidal embeddings $R_p = [\sin(p \omega_0), \dots, \sin(p \omega_{d/2-1}),
    \cos(p \omega_0), \dots, \cos(p \omega_{d/2-1})]$ of the (possibly negative) `positions`.

    Sines and cosines are concatenated (Transformer-XL's layout), not interleaved.

    Shape:
        `positions` `[L]`, `inv_freq` `[d / 2]`; returns `[L, d]` in the dtype of `positions`.
    """
    # $p \omega_i$, `[L, d / 2]`
    angles = torch.outer(positions, inv_freq.to(positions.dtype))
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_distances(qlen: int, klen: int, *, bidirectional: bool, clamp_len: int = -1,
                       dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> torch.Tensor:
    r"""
    The distances of the relative table, in descending order.

    * `bidirectional=False` (decoder): $k - 1, k - 2, \dots, 0$ (`[klen]`): queries never look ahead.
    * `bidirectional=True` (encoder): $k - 1, \dots, 0, \dots, -(q - 1)$ (`[klen + qlen - 1]`): every query
      against every key, when the queries are the last `qlen` of the `klen` positions.

    `clamp_len > 0` clips the magnitude of every distance at `clamp_len` (the original's `clamp_len`).
    """
    end = -qlen if bidirectional else -1
    distances = torch.arange(klen - 1, end, -1.0, dtype=dtype, device=device)
    if clamp_len > 0:
        distances = distances.clamp(min=-clamp_len, max=clamp_len)
    return distances


def content_scores(q: torch.Tensor, k: torch.Tensor, u: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""
    Terms $(a) + (c) = (q_i + u)^\top k_j$ for every query $i$ and key $j$.

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `k` `[klen, batch, heads, d_head]`, `u` `[heads, d_head]` or None
        (then only term (a)); returns `[qlen, klen, batch, heads]`.
    """
    if u is not None:
        # $q_i + u$
        q = q + u
    # $(q_i + u)^\top k_j$
    return torch.einsum('ibnd,jbnd->ijbn', q, k)


def position_scores(q: torch.Tensor, r: torch.Tensor, v: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""
    Terms $(b) + (d) = (q_i + v)^\top r_s$ for every query $i$ and every entry $s$ of the relative table,
    before the shift (column $s$ is the $s$-th distance of the table, not a key position).

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `r` the projected table $W_{k,R} R$ `[rlen, heads, d_head]`,
        `v` `[heads, d_head]` or None (then only term (b)); returns `[qlen, rlen, batch, heads]`.
    """
    if v is not None:
        # $q_i + v$
        q = q + v
    # $(q_i + v)^\top W_{k,R} R_s$
    return torch.einsum('ibnd,jnd->ijbn', q, r)


def relative_shift(x: torch.Tensor) -> torch.Tensor:
    r"""
    Turn scores indexed by relative-table entry into scores indexed by key position.

    `out[i, j] = x[i, j + qlen - 1 - i]` wherever `j + qlen - 1 - i < rlen`; the remaining entries (only
    $j > i + rlen - qlen$, the future of a decoder) hold zero or another row's score and must be masked.
    See the module docstring for why this is the shift Transformer-XL needs.

    Shape:
        `x` `[qlen, rlen, ...]`; returns `[qlen, rlen, ...]`.
    """
    qlen, rlen = x.shape[0], x.shape[1]
    # A zero column in front: `[qlen, rlen + 1, ...]`
    zero_pad = x.new_zeros((qlen, 1) + tuple(x.shape[2:]))
    x_padded = torch.cat([zero_pad, x], dim=1)
    # Read as `[rlen + 1, qlen, ...]` and drop the first `qlen` elements; read back as `[qlen, rlen, ...]`.
    # Element `(i, j)` of the result is element `qlen + i * rlen + j = i * (rlen + 1) + (qlen + j - i)` of the
    # padded rows: row `i`, column `qlen + j - i`, which is `x[i, j + qlen - 1 - i]`.
    x_padded = x_padded.view((rlen + 1, qlen) + tuple(x.shape[2:]))
    return x_padded[1:].view_as(x)


def relative_attention_scores(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor,
                              u: Optional[torch.Tensor], v: Optional[torch.Tensor]) -> torch.Tensor:
    r"""
    The unscaled scores $A^{rel}_{i,j} = (a) + (b) + (c) + (d)$ for queries that are the last `qlen` of the
    `klen` key positions.

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `k` `[klen, batch, heads, d_head]`, `r` `[rlen, heads, d_head]`
        with distances `klen - 1` down to `0` (`rlen = klen`, decoder: mask $j > i + klen - qlen$) or down to
        `-(qlen - 1)` (`rlen = klen + qlen - 1`, encoder: every entry exact); `u`, `v` `[heads, d_head]`.
        Returns `[qlen, klen, batch, heads]`.
    """
    klen = k.shape[0]
    # $(a) + (c) = (q_i + u)^\top k_j$
    ac = content_scores(q, k, u)
    # $(b) + (d) = (q_i + v)^\top r_{i-j}$, shifted from table index to key position
    bd = relative_shift(position_scores(q, r, v))
    if bd.shape[1] != klen:
        # Encoder table: the first `klen` columns are the keys
        bd = bd[:, :klen]
    return ac + bd


def masked_softmax(scores: torch.Tensor, masked: Optional[torch.Tensor], dim: int = 1,
                   zero_masked_rows: bool = True) -> torch.Tensor:
    r"""
    Softmax over keys with the `masked` entries (True) left out, safe in fp16 and bf16.

    Masked scores are filled with the most negative number of the scores' own dtype rather than $-\infty$
    (no `inf - inf`), fp16 and bf16 scores are normalised in float32 and cast back (nothing overflows), and
    the weights of masked keys are set to zero afterwards: a row whose keys are all masked gets all-zero
    weights (it attends to nothing) instead of NaN. `zero_masked_rows=False` leaves that second fill out, for
    masks that leave every row a key (see `masked_softmax_heads`): the original's fill and softmax, no more.

    Shape:
        `scores` `[qlen, klen, batch, heads]`; `masked` `[qlen, klen, batch or 1]` (or `[qlen, klen]`), True
        where a key is masked. Returns weights of the shape and dtype of `scores`.
    """
    if masked is not None:
        if masked.dim() == 2:
            masked = masked[:, :, None]
        masked = masked[..., None]
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
    if scores.dtype in (torch.float16, torch.bfloat16):
        probs = F.softmax(scores, dim=dim, dtype=torch.float32).to(scores.dtype)
    else:
        probs = F.softmax(scores, dim=dim)
    if masked is not None and zero_masked_rows:
        # Exact zeros already, except in a row with every key masked: that row attends to nothing
        probs = probs.masked_fill(masked, 0.0)
    return probs


# ---------------------------------------------------------------------------------------------------------------
# Fast paths: head-major layout `[batch, heads, seq, d_head]`, a shift that is a view, a softmax over the last axis
# ---------------------------------------------------------------------------------------------------------------

def to_heads(x: torch.Tensor, n_head: int, d_head: int) -> torch.Tensor:
    r"""
    `[seq, batch, n_head * d_head]` to the head-major `[batch, n_head, seq, d_head]`, contiguous: every score and
    value product is then one plain batched `@` over `batch * n_head` matrices, with no per-batch copies.
    """
    return x.reshape(x.shape[0], x.shape[1], n_head, d_head).permute(1, 2, 0, 3).contiguous()


def from_heads(x: torch.Tensor) -> torch.Tensor:
    """`[batch, n_head, seq, d_head]` back to `[seq, batch, n_head * d_head]` (heads concatenated)."""
    batch, n_head, seq, d_head = x.shape
    return x.permute(2, 0, 1, 3).reshape(seq, batch, n_head * d_head)


def pad_table(table: torch.Tensor, klen: int) -> torch.Tensor:
    r"""
    Zero entries appended at the end of the relative table (axis -2) until it has at least `klen + 1` of them, so
    that `relative_shift_view` can read it with a row stride of at least `klen` (rows that never overlap).

    The appended entries play the part of the original's zero pad: they land only where a decoder masks (the
    future, $j > m + i$). The table is `[.., L, d_head]`, not batch-sized, so the copy is small.
    """
    missing = klen + 1 - table.shape[-2]
    if missing <= 0:
        return table
    zeros = table.new_zeros(table.shape[:-2] + (missing, table.shape[-1]))
    return torch.cat([table, zeros], dim=-2)


def _pad_entry_bias(r_bias: torch.Tensor, klen: int) -> torch.Tensor:
    """A per-entry bias `[heads, rlen]` padded with zeros as `pad_table` pads the table it goes with."""
    return pad_table(r_bias[..., None], klen)[..., 0]


def relative_shift_view(x: torch.Tensor, klen: int) -> torch.Tensor:
    r"""
    `relative_shift` as a strided view, without the pad-and-copy: `out[.., i, j] = x[.., i, j + qlen - 1 - i]`.

    With the last two axes of `x` contiguous (`[.., qlen, L]`, `L >= klen + 1`), that element sits at flat offset
    $i L + j + q - 1 - i = (q - 1) + i (L - 1) + j$: a view starting at $q - 1$ with row stride $L - 1$. Rows
    do not overlap because $L - 1 \ge k$, so the backward pass is a plain strided copy too.
    Entries with $j + q - 1 - i \ge L$ run into the next row; for a decoder they are the future and masked.

    Shape:
        `x` `[.., qlen, L]`; returns `[.., qlen, klen]` (a view of `x`).
    """
    qlen, rlen = x.shape[-2], x.shape[-1]
    if rlen < klen + 1:
        raise ValueError(f"relative_shift_view needs a table of at least klen + 1 = {klen + 1} entries, got {rlen}: "
                         f"pad it with pad_table first")
    flat = x.flatten(-2)
    shifted = flat.narrow(-1, qlen - 1, qlen * (rlen - 1)).unflatten(-1, (qlen, rlen - 1))
    # A decoder's padded table has exactly `klen + 1` entries: nothing to cut (and no slice to undo in backward)
    return shifted if rlen - 1 == klen else shifted[..., :klen]


def relative_attention_scores_heads(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor,
                                    u: Optional[torch.Tensor], v: Optional[torch.Tensor],
                                    r_bias: Optional[torch.Tensor] = None, scale: float = 1.0) -> torch.Tensor:
    r"""
    `relative_attention_scores` in the head-major layout, times `scale`: the same numbers up to float rounding.

    $$\mathit{scale} \cdot A^{rel} = \mathit{scale} \cdot \bigl(\underbrace{(Q + u) K^\top}_{(a) + (c)}
      + \mathop{shift}(\underbrace{(Q + v) R^\top}_{(b) + (d)})\bigr)$$

    The shift is a view and the sum and the scale are folded into one `baddbmm`
    ($\beta \cdot \mathit{shifted} + \alpha \cdot (Q + u) K^\top$), so no separate add or multiply pass.

    Shape:
        `q` `[batch, heads, qlen, d_head]`, `k` `[batch, heads, klen, d_head]`, `r` the projected table
        `[heads, rlen, d_head]` (distances from `klen - 1` down; `rlen >= klen`), `u`, `v` `[heads, d_head]` or
        None, `r_bias` `[heads, rlen]` (attention type 1's $b_s$, added per table entry) or None.
        Returns `[batch, heads, qlen, klen]`.
    """
    batch, heads, qlen, d_head = q.shape
    klen = k.shape[-2]
    # $(b) + (d) = (q_i + v)^\top r_s$ per table entry $s$; the table padded so the shift is a view
    q_v = q if v is None else q + v[:, None]
    bd = torch.matmul(q_v, pad_table(r, klen).transpose(-1, -2))
    if r_bias is not None:
        bd = bd + _pad_entry_bias(r_bias, klen)[:, None]
    # Shifted to key positions, `[batch * heads, qlen, klen]` (still a view)
    bd = relative_shift_view(bd, klen).reshape(batch * heads, qlen, klen)
    # $(a) + (c) = (q_i + u)^\top k_j$
    q_u = q if u is None else q + u[:, None]
    # $\mathit{scale} \cdot ((b) + (d)) + \mathit{scale} \cdot ((a) + (c))$ in one product
    score = torch.baddbmm(bd, q_u.reshape(batch * heads, qlen, d_head),
                          k.reshape(batch * heads, klen, d_head).transpose(1, 2), beta=scale, alpha=scale)
    return score.view(batch, heads, qlen, klen)


class _DecoderRelativeWeights(torch.autograd.Function):
    r"""
    The softmax weights of relative attention with a decoder's table, forward and backward by hand:

    $$P = (Q + v) R^\top\ (+\, b), \qquad S = \mathit{scale} \cdot \bigl((Q + u) K^\top + \mathop{shift}(P)\bigr),
      \qquad W = \mathop{softmax}_j(S \text{ with masked entries at the dtype's minimum})$$

    Autograd through the composite (`relative_attention_scores_heads`, then `masked_softmax_heads`) pays for
    every view and in-place step: the shift's backward fills a zero table and copies into it, the in-place mask
    needs a clone and a second fill in backward, and `baddbmm`'s backward scales its gradient in a separate pass.
    Here:

    * forward: $P$ is one product into a `[q, k + 1]` block per head; the shifted scores are the contiguous run of
      $q k$ entries of that block starting at $q - 1$ (`relative_shift_view`), one `baddbmm` with
      $\alpha = \beta = \mathit{scale}$ adds $(Q + u) K^\top$ to them into a fresh tensor, which the mask fills
      in place;
    * backward: $dS = W \odot (dW - \sum_j W\, dW)$ (zero wherever $W$ is zero, so masked entries need no second
      fill) is written into that same run of a `[q, k + 1]` block whose other $q$ entries are zeroed, which is
      $dP$ unshifted; then $d(Q + u) = \mathit{scale}\, dS\, K$, $dK = \mathit{scale}\, dS^\top (Q + u)$,
      $d(Q + v) = \mathit{scale}\, dP\, R$, $dR = \mathit{scale} \sum_b dP^\top (Q + v)$, $db = \mathit{scale}
      \sum_{b, i} dP$.

    The same numbers as the composite: the same products in the same order (tested equal, and by `gradcheck`).
    Scores in bf16 or fp16 (autocast) get their softmax and its backward in float32, as the composite's.
    Inputs: `q_u`, `q_v` `[batch, heads, qlen, d]`, `k` `[batch, heads, klen, d]`, `r` `[heads, klen + 1, d]`
    (padded, `pad_table`), `r_bias` `[heads, klen + 1]` or None, `masked` True where masked (broadcasting to
    `[batch * heads, qlen, klen]`) or None.
    """

    @staticmethod
    def forward(ctx, q_u, k, q_v, r, r_bias, masked, scale: float, zero_masked_rows: bool):
        batch, heads, qlen, d = q_u.shape
        klen, rlen = k.shape[-2], r.shape[-2]
        # $P = (Q + v) R^\top$ `[batch, heads, qlen, klen + 1]`, contiguous
        position = torch.matmul(q_v, r.transpose(-1, -2))
        if r_bias is not None:
            position.add_(r_bias[:, None])
        # $\mathop{shift}(P)$: the entries $q - 1 .. q - 1 + q k$ of each head's block, read as `[qlen, klen]`
        shifted = position.view(batch * heads, qlen * rlen).narrow(1, qlen - 1, qlen * klen).view(-1, qlen, klen)
        # $S = \mathit{scale} \cdot \mathop{shift}(P) + \mathit{scale} \cdot (Q + u) K^\top$, contiguous
        score = torch.baddbmm(shifted, q_u.reshape(-1, qlen, d), k.reshape(-1, klen, d).transpose(1, 2),
                              beta=scale, alpha=scale)
        if masked is not None:
            score.masked_fill_(masked, torch.finfo(score.dtype).min)
        # In float32 for bf16 and fp16 scores, as `masked_softmax_heads`
        weights = torch.softmax(score.float() if score.dtype in (torch.float16, torch.bfloat16) else score, dim=-1)
        if masked is not None and zero_masked_rows:
            weights.masked_fill_(masked, 0.0)
        ctx.save_for_backward(q_u, k, q_v, r, weights)
        ctx.scale, ctx.has_r_bias = scale, r_bias is not None
        return weights.to(score.dtype).view(batch, heads, qlen, klen)

    @staticmethod
    def backward(ctx, grad_weights):
        q_u, k, q_v, r, weights = ctx.saved_tensors
        batch, heads, qlen, d = q_u.shape
        klen, rlen = k.shape[-2], r.shape[-2]
        scale = ctx.scale
        # $dP$, `[batch * heads, qlen * (klen + 1)]`: the $q$ entries outside the shifted run get no gradient
        grad_position = torch.empty(batch * heads, qlen * rlen, dtype=q_u.dtype, device=q_u.device)
        grad_position[:, :qlen - 1].zero_()
        grad_position[:, qlen - 1 + qlen * klen:].zero_()
        # $dS = W \odot (dW - \sum_j W\, dW)$ in the softmax's precision, also written into the shifted run of $dP$
        grad_score = torch._softmax_backward_data(grad_weights.reshape(-1, qlen, klen).to(weights.dtype), weights, -1,
                                                  weights.dtype).to(q_u.dtype)
        grad_position.narrow(1, qlen - 1, qlen * klen).view(-1, qlen, klen).copy_(grad_score)
        # $d(Q + u) = \mathit{scale}\, dS\, K$ and $dK = \mathit{scale}\, dS^\top (Q + u)$
        grad_q_u = torch.bmm(grad_score, k.reshape(-1, klen, d)).mul_(scale).view(q_u.shape)
        grad_k = torch.bmm(grad_score.transpose(1, 2), q_u.reshape(-1, qlen, d)).mul_(scale).view(k.shape)
        grad_position = grad_position.view(batch, heads, qlen, rlen)
        # $d(Q + v) = \mathit{scale}\, dP\, R$ and $dR = \mathit{scale} \sum_b dP^\top (Q + v)$
        grad_q_v = torch.matmul(grad_position, r).mul_(scale)
        grad_r = torch.matmul(grad_position.transpose(-1, -2), q_v).sum(0).mul_(scale)
        grad_r_bias = grad_position.sum((0, 2)).mul_(scale) if ctx.has_r_bias else None
        return grad_q_u, grad_k, grad_q_v, grad_r, grad_r_bias, None, None, None


def relative_attention_weights_heads(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor,
                                     u: Optional[torch.Tensor], v: Optional[torch.Tensor],
                                     masked: Optional[torch.Tensor], scale: float,
                                     r_bias: Optional[torch.Tensor] = None,
                                     zero_masked_rows: bool = True) -> torch.Tensor:
    r"""
    The attention weights $\mathop{softmax}_j(\mathit{scale} \cdot A^{rel}_{i,j})$ with `masked` keys left out,
    head-major: `masked_softmax_heads` of `relative_attention_scores_heads`.

    A decoder's table (distances down to 0, `rlen <= klen + 1` counting `pad_table`'s entry) takes
    `_DecoderRelativeWeights`, the same computation with a hand-written backward (about 30% less time for scores
    and softmax, forward and backward, on the benchmark's sizes); under autocast its products run in autocast's
    dtype and its softmax in float32, as the composite's. An encoder's table takes the composite.

    Shape:
        `q`, `k`, `r`, `u`, `v`, `r_bias` as `relative_attention_scores_heads`; `masked` True where masked, as
        `masked_softmax_heads` takes it (`heads_mask`). Returns `[batch, heads, qlen, klen]`.
    """
    klen = k.shape[-2]
    if r.shape[-2] > klen + 1:
        score = relative_attention_scores_heads(q, k, r, u, v, r_bias=r_bias, scale=scale)
        return masked_softmax_heads(score, masked, zero_masked_rows, inplace=True)
    q_u = q if u is None else q + u[:, None]
    q_v = q if v is None else q + v[:, None]
    padded_bias = None if r_bias is None else _pad_entry_bias(r_bias, klen)
    inputs = [q_u, k, q_v, pad_table(r, klen), padded_bias]
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        # The products in autocast's dtype, as autocast runs them in the composite; the softmax in float32
        dtype = torch.get_autocast_dtype(device_type)
        inputs = [None if t is None else t.to(dtype) for t in inputs]
    if masked is not None and masked.dim() == 4:
        # `[batch or 1, 1, qlen, klen]` to the `[batch * heads, qlen, klen]` of the scores
        masked = masked.expand(q.shape[0], q.shape[1], -1, -1).reshape(-1, *masked.shape[2:])
    with torch.autocast(device_type, enabled=False):
        return _DecoderRelativeWeights.apply(*inputs, masked, scale, zero_masked_rows)


def relative_attention_sdpa(q: torch.Tensor, k: torch.Tensor, v_heads: torch.Tensor, r: torch.Tensor,
                            u: Optional[torch.Tensor], v: Optional[torch.Tensor], scale: float,
                            masked: Optional[torch.Tensor], r_bias: Optional[torch.Tensor] = None,
                            causal_bias: Optional['CausalPositionBias'] = None) -> torch.Tensor:
    r"""
    Relative attention by `scaled_dot_product_attention`, with the position terms as an additive bias:

    $$\mathop{softmax}_j\bigl(\mathit{scale} \cdot (q_i + u)^\top k_j + B_{i,j}\bigr) v_j, \qquad
      B_{i,j} = \mathit{scale} \cdot \mathop{shift}((Q + v) R^\top)_{i,j}\ (-\infty \text{ where masked})$$

    Only without gradients: SDPA on the CPU has no fused backward for a bias that needs one (it falls back to
    the explicit computation, slower than ours). No row may be fully masked (SDPA would give NaN there).
    With `causal_bias` and a decoder's causal mask, $B$ comes from it with no masking pass
    (`CausalPositionBias`); otherwise it is one `torch.where` over the shifted product.

    Shape:
        `q`, `k`, `v_heads` `[batch, heads, len, d_head]` (`q` in any layout: the output comes back in its
        layout); `r`, `u`, `v`, `r_bias` as `relative_attention_scores_heads`; `masked` True where masked,
        broadcasting to `[batch, heads, qlen, klen]`. Returns `[batch, heads, qlen, d_head]`.
    """
    klen = k.shape[-2]
    if causal_bias is not None and r_bias is None and causal_bias.applies(q, r, v, masked, klen):
        bias = causal_bias(q, r, v, scale, klen)
    else:
        # $\mathit{scale} \cdot ((b) + (d))$ per table entry: the scale on $Q + v$, four times smaller than the
        # scores
        q_v = (q if v is None else q + v[:, None]) * scale
        bd = torch.matmul(q_v, pad_table(r, klen).transpose(-1, -2))
        if r_bias is not None:
            bd = bd + _pad_entry_bias(r_bias, klen)[:, None] * scale
        # $B$: shifted to key positions by a view, then one pass to a contiguous tensor, $-\infty$ where masked
        # (`where` reads the view and the mask once; `masked_fill` would copy the view first)
        bias = relative_shift_view(bd, klen)
        bias = bias.contiguous() if masked is None else torch.where(masked, float('-inf'), bias)
    q_u = q if u is None else q + u[:, None]
    return F.scaled_dot_product_attention(q_u, k, v_heads, attn_mask=bias.to(q_u.dtype), scale=scale)


def decoder_causal_mask(qlen: int, klen: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """`[qlen, klen]`, True for key $j$ of query $i$ where $j > (k - q) + i$: the keys after the query's own
    position, when the queries are the last `qlen` of the `klen` positions."""
    return torch.ones(qlen, klen, dtype=torch.bool, device=device).triu_(1 + klen - qlen)


def decoder_window_mask(qlen: int, klen: int, window: int, device: Optional[torch.device] = None) -> torch.Tensor:
    r"""`[qlen, klen]`, True where key $j$ is not among the `window` keys up to query $i$'s own position $m + i$:
    $j > m + i$ or $j \le m + i - \mathit{window}$. `window >= klen` is `decoder_causal_mask`; `window = mem_len`
    is `MemTransformerLM`'s mask with `same_length` (every query sees `mem_len` keys)."""
    mask = decoder_causal_mask(qlen, klen, device)
    if window < klen:
        # $j - i \le m - \mathit{window}$
        mask |= torch.ones(qlen, klen, dtype=torch.bool, device=device).tril_(klen - qlen - window)
    return mask


# The masks `decoder_key_window` compares with, made once per shape
_cached_decoder_window_mask = functools.lru_cache(maxsize=16)(decoder_window_mask)


# What `decoder_key_window` found for a mask, kept per tensor (the one a view was taken of) while it is unchanged
_key_windows = WeakIdKeyDictionary()


def decoder_key_window(masked: Optional[torch.Tensor], qlen: int, klen: int) -> Optional[int]:
    """The `window` for which `masked` (`[qlen, klen]`) is exactly `decoder_window_mask(qlen, klen, window)` (`klen`
    for the causal mask), or None when it is no such mask. The answer is kept for the mask's tensor while its
    version counter is unchanged (a model's masks are cached per shape, and each layer asks again)."""
    if masked is None or masked.shape != (qlen, klen) or masked.dtype != torch.bool or qlen == 0:
        return None
    base = masked if masked._base is None else masked._base
    key = (base._version, masked.storage_offset(), tuple(masked.shape), masked.stride())
    kept = _key_windows.get(base)
    if kept is not None and kept[0] == key:
        return kept[1]
    # The last query's keys are the `window` last ones
    window = klen - int(masked[-1].sum())
    if window == 0 or not torch.equal(masked, _cached_decoder_window_mask(qlen, klen, window, masked.device)):
        window = None
    _key_windows[base] = (key, window)
    return window


class CausalPositionBias:
    r"""
    The position terms of a decoder's relative attention as the additive bias of `scaled_dot_product_attention`,
    with the causal mask built in and no pass over the scores to apply it.

    A buffer $P$ `[heads, batch * qlen, klen + qlen]` is kept between calls. Its last `qlen` columns hold
    $-\infty$ and are never written; each call writes its first `klen` columns, head by head in one
    product over the whole batch:

    $$P_{(b, i), s} = \mathit{scale} \cdot (q_{b,i} + v)^\top r_s \quad (s < k), \qquad
      P_{(b, i), s} = -\infty \quad (s \ge k)$$

    The bias is the shifted view $B_{i,j} = P_{i,\,j + q - 1 - i}$ (`relative_shift_view`'s reading, row stride
    $k + q - 1$). For a key $j \le m + i$ the entry $s = j + q - 1 - i \le k - 1$ is the distance $m + i - j$;
    for a key in the future, $j > m + i$, it is $s \ge k$: $-\infty$. That is exactly the decoder's causal mask,
    so there is no `where` and no copy of the shifted scores (SDPA reads the strided view as it is); and the
    table, shared by the batch, is not copied per batch as a broadcast `matmul` does.

    One buffer per shape, kept (a model shares one among its layers): it costs
    `heads * batch * qlen * (klen + qlen)` elements while kept. On the CPU only (CUDA's SDPA kernels want an
    aligned bias), outside autocast and `torch.compile`.
    """

    def __init__(self):
        self._buffers = {}

    def clear(self) -> None:
        self._buffers = {}

    def applies(self, q: torch.Tensor, r: torch.Tensor, v: Optional[torch.Tensor], masked: Optional[torch.Tensor],
                klen: int) -> bool:
        """Whether the call is one this bias serves: a decoder's table (distances down to 0, `klen` entries, or
        `klen + 1` with `pad_table`'s zero) and exactly the causal mask `[qlen, klen]`, in one dtype, on the CPU."""
        qlen = q.shape[-2]
        return (q.device.type == 'cpu' and r.shape[-2] in (klen, klen + 1) and q.dtype == r.dtype
                and (v is None or v.dtype == q.dtype) and not torch.is_autocast_enabled('cpu')
                and not torch.compiler.is_compiling() and decoder_key_window(masked, qlen, klen) == klen)

    def _buffer(self, heads: int, batch: int, qlen: int, klen: int, like: torch.Tensor) -> torch.Tensor:
        key = (heads, batch, qlen, klen, like.dtype, like.device)
        buffer = self._buffers.get(key)
        if buffer is None:
            if len(self._buffers) >= 4:
                self._buffers = {}
            buffer = like.new_empty(heads, batch * qlen, klen + qlen)
            # The columns past the table: what a key in the future reads
            buffer[..., klen:] = float('-inf')
            self._buffers[key] = buffer
        return buffer

    def __call__(self, q: torch.Tensor, r: torch.Tensor, v: Optional[torch.Tensor], scale: float,
                 klen: int) -> torch.Tensor:
        """$B$ `[batch, heads, qlen, klen]`, a view of the buffer (valid until the next call)."""
        batch, heads, qlen, d_head = q.shape
        rows, width = batch * qlen, klen + qlen
        buffer = self._buffer(heads, batch, qlen, klen, q)
        # $Q + v$ head-first, `[heads, batch * qlen, d_head]`: one product per head covers the batch
        q_v = q.new_empty(heads, batch, qlen, d_head)
        if v is None:
            q_v.copy_(q.transpose(0, 1))
        else:
            torch.add(q.transpose(0, 1), v[:, None, None], out=q_v)
        # $P_{:, s} = \mathit{scale} \cdot (Q + v) r_s$ for the `klen` entries of the table
        buffer[..., :klen].baddbmm_(q_v.view(heads, rows, d_head), r[:, :klen].transpose(-1, -2), beta=0,
                                    alpha=scale)
        # $B_{i,j} = P_{i, j + q - 1 - i}$ for each batch row block
        shifted = relative_shift_view(buffer.view(heads, batch, qlen, width), klen)
        return shifted.transpose(0, 1)


def heads_mask(masked: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A mask `[qlen, klen]` or `[qlen, klen, batch or 1]` in the layout of head-major scores,
    `[qlen, klen]` or `[batch or 1, 1, qlen, klen]`."""
    if masked is None or masked.dim() == 2:
        return masked
    if masked.shape[2] == 1:
        return masked[:, :, 0]
    return masked.permute(2, 0, 1)[:, None]


def masked_softmax_heads(scores: torch.Tensor, masked: Optional[torch.Tensor], zero_masked_rows: bool = True,
                         inplace: bool = False) -> torch.Tensor:
    r"""
    `masked_softmax` over the last, contiguous axis of head-major scores `[batch, heads, qlen, klen]`;
    `masked` is True where a key is masked, in a shape that broadcasts (see `heads_mask`).

    `zero_masked_rows=False` leaves out the second fill that gives a row with every key masked all-zero
    weights: only for masks where no row is fully masked (a decoder's causal mask always leaves key $m + i$),
    where the two agree exactly (masked scores are the dtype's minimum, whose $\exp$ is exactly 0).
    `inplace=True` fills `scores` itself: for a fresh product whose backward does not need it (one pass saved).
    """
    if masked is not None:
        fill = scores.masked_fill_ if inplace else scores.masked_fill
        scores = fill(masked, torch.finfo(scores.dtype).min)
    if scores.dtype in (torch.float16, torch.bfloat16):
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    else:
        probs = F.softmax(scores, dim=-1)
    if masked is not None and zero_masked_rows:
        probs = probs.masked_fill(masked, 0.0)
    return probs
