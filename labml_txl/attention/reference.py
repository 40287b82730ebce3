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

## The other schemes on the same terms

The schemes whose positions live in the attention are read through the same two pieces (`RelativeTerms`): a bias
$b_s$ per table entry, that is per distance, without a table, is ALiBi's $-m_h |i - j|$ and T5's
$b_{h, \mathop{bucket}(i - j)}$ (`positions/alibi.py`, `positions/t5_bias.py`); RoFormer's rotation of the queries and keys by
position (`encoding.rotate`) comes before the content term, which is then all there is.
"""
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch.nn import functional as F

from ..positions.encoding import rotate_queries_and_keys


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


def position_scores(q: torch.Tensor, r: Optional[torch.Tensor], v: Optional[torch.Tensor] = None,
                    entry_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""
    Terms $(b) + (d) = (q_i + v)^\top r_s$ for every query $i$ and every entry $s$ of the relative table,
    before the shift (column $s$ is the $s$-th distance of the table, not a key position). Attention type 1 of
    the original learns its term (d) per entry instead: `entry_bias` $b_s$, added as it is.

    Without a table (`r` None) the terms are $b_s$ alone, the same for every query: ALiBi's and T5's biases by
    distance.

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `r` the projected table $W_{k,R} R$ `[rlen, heads, d_head]` or None,
        `v` `[heads, d_head]` or None, `entry_bias` `[rlen, heads]` or None (not both None); returns
        `[qlen, rlen, batch, heads]`.
    """
    if r is None:
        # $b_s$
        qlen, batch = q.shape[:2]
        return entry_bias[None, :, None].expand(qlen, -1, batch, -1)
    if v is not None:
        # $q_i + v$
        q = q + v
    # $(q_i + v)^\top W_{k,R} R_s$
    scores = torch.einsum('ibnd,jnd->ijbn', q, r)
    if entry_bias is not None:
        # $+ b_s$
        scores = scores + entry_bias[None, :, None]
    return scores


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


def relative_attention_scores(q: torch.Tensor, k: torch.Tensor, r: Optional[torch.Tensor],
                              u: Optional[torch.Tensor], v: Optional[torch.Tensor],
                              entry_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""
    The unscaled scores $A^{rel}_{i,j} = (a) + (b) + (c) + (d)$ for queries that are the last `qlen` of the
    `klen` key positions.

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `k` `[klen, batch, heads, d_head]`, `r` `[rlen, heads, d_head]`
        with distances `klen - 1` down to `0` (`rlen = klen`, decoder: mask $j > i + klen - qlen$) or further
        (`rlen = klen + qlen - 1`, encoder: every entry exact), or None with an `entry_bias`; `u`, `v`
        `[heads, d_head]` or None; `entry_bias` `[rlen, heads]` or None (see `position_scores`). Returns
        `[qlen, klen, batch, heads]`.
    """
    klen = k.shape[0]
    # $(a) + (c) = (q_i + u)^\top k_j$
    ac = content_scores(q, k, u)
    # $(b) + (d) = (q_i + v)^\top r_{i-j}$, shifted from table index to key position
    bd = relative_shift(position_scores(q, r, v, entry_bias))
    if bd.shape[1] != klen:
        # A longer table (an encoder's): the first `klen` columns are the keys
        bd = bd[:, :klen]
    return ac + bd


@dataclass(frozen=True)
class RelativeTerms:
    r"""
    What the faster implementations (`fast/dispatch.py`) take for these scores, in their head-major layout: the position
    terms $(q_i + v)^\top r_s + b_s$ at table entry $s = j + q - 1 - i$, the content bias $u$ of
    $(q_i + u)^\top k_j$, and the number of features of each head that RoFormer's rotation turns first.

    Every scheme of this package is some of these: Transformer-XL's `table`, `content_bias` and `position_bias`
    (attention type 1 learns `entry_bias` too); ALiBi's and T5's `entry_bias` alone; rotary's `rotary_features`.

    Shape:
        `table` `[heads, rlen, d_head]` (entry $s$ the distance `klen - 1 - s`; `rlen >= klen`) or None,
        `content_bias` ($u$) and `position_bias` ($v$) `[heads, d_head]` or None, `entry_bias` ($b$) `[heads, rlen]`
        or None (the same distances), `rotary_features` an even number up to `d_head` (0: no rotation).
    """
    table: Optional[torch.Tensor] = None
    content_bias: Optional[torch.Tensor] = None
    position_bias: Optional[torch.Tensor] = None
    entry_bias: Optional[torch.Tensor] = None
    rotary_features: int = 0

    @property
    def has_position_scores(self) -> bool:
        """Whether there are terms $(q_i + v)^\top r_s + b_s$ (a table or a bias per entry)."""
        return self.table is not None or self.entry_bias is not None

    def tensors(self) -> List[torch.Tensor]:
        return [t for t in (self.table, self.content_bias, self.position_bias, self.entry_bias) if t is not None]


def dot_product_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""
    $A_{i,j} = q_i^\top k_j$, the scores of attention without positions in the attention.

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `k` `[klen, batch, heads, d_head]`; returns `[qlen, klen, batch, heads]`.
    """
    return torch.einsum('ibnd,jbnd->ijbn', q, k)


def scores_of_terms(q: torch.Tensor, k: torch.Tensor, terms: Optional[RelativeTerms]) -> torch.Tensor:
    r"""
    $A_{i,j}$ as `RelativeTerms` describe it: $q_i^\top k_j$ without terms; else the queries and keys rotated by
    position first (`rotary_features`), then `relative_attention_scores` (just $(q_i + u)^\top k_j$ without
    position scores).

    Shape:
        `q` `[qlen, batch, heads, d_head]`, `k` `[klen, batch, heads, d_head]`; returns `[qlen, klen, batch, heads]`.
    """
    if terms is None:
        return dot_product_scores(q, k)
    if terms.rotary_features:
        # $\mathop{RoPE}(q_i, m + i)$ and $\mathop{RoPE}(k_j, j)$
        q, k = rotate_queries_and_keys(q, k, terms.rotary_features)
    if not terms.has_position_scores:
        return content_scores(q, k, terms.content_bias)
    table = None if terms.table is None else terms.table.transpose(0, 1)
    entry_bias = None if terms.entry_bias is None else terms.entry_bias.transpose(0, 1)
    return relative_attention_scores(q, k, table, terms.content_bias, terms.position_bias, entry_bias)


def masked_softmax(scores: torch.Tensor, masked: Optional[torch.Tensor], dim: int = 1, inplace: bool = False,
                   rows_may_be_empty: bool = True) -> torch.Tensor:
    r"""
    Softmax over keys (axis `dim`) with the `masked` entries (True) left out, safe in fp16 and bf16.

    Masked scores are filled with the most negative number of the scores' own dtype rather than $-\infty$
    (no `inf - inf`), fp16 and bf16 scores are normalised in float32 and cast back (nothing overflows), and
    the weights of masked keys are set to zero afterwards: a row whose keys are all masked gets all-zero
    weights (it attends to nothing) instead of NaN. Where every row keeps a key, that second fill changes nothing
    (the minimum's $\exp$ is exactly 0): `rows_may_be_empty=False` leaves it out, for masks known to be such (a
    decoder's), which is the original's fill and softmax. `inplace=True` fills `scores` itself, for a fresh product
    that nothing else reads.

    Shape:
        `scores` any; `masked` boolean, broadcasting to `scores`. Returns weights of the shape and dtype of
        `scores`.
    """
    if masked is not None:
        fill = scores.masked_fill_ if inplace else scores.masked_fill
        scores = fill(masked, torch.finfo(scores.dtype).min)
    if scores.dtype in (torch.float16, torch.bfloat16):
        probs = F.softmax(scores, dim=dim, dtype=torch.float32).to(scores.dtype)
    else:
        probs = F.softmax(scores, dim=dim)
    if masked is not None and rows_may_be_empty:
        probs = probs.masked_fill(masked, 0.0)
    return probs


def attention(scores: torch.Tensor, values: torch.Tensor, masked: Optional[torch.Tensor], scale: float,
              dropout: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
              round_scores_to_float32: bool = False,
              rows_may_be_empty: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""
    $\mathop{Attn}_i = \sum_j \mathop{softmax}_j(\mathit{scale} \cdot A_{i,j})\, v_j$, the masked keys left out and
    `dropout` (if given) applied to the weights. `round_scores_to_float32` rounds the scaled scores to float32
    before the softmax, as the original's `attn_score.float()` does (a change only in float64); `rows_may_be_empty`
    as `masked_softmax` takes it.

    Shape:
        `scores` `[qlen, klen, batch, heads]`, `values` `[klen, batch, heads, d_head]`, `masked` True where a key
        is masked, `[qlen, klen]` or `[qlen or 1, klen, batch or 1]`. Returns `[qlen, batch, heads, d_head]` and the
        weights `[qlen, klen, batch, heads]`.
    """
    # $\mathit{scale} \cdot A_{i,j}$
    scores = scores * scale
    if round_scores_to_float32:
        scores = scores.float().to(scores.dtype)
    if masked is not None:
        masked = masked[:, :, None, None] if masked.dim() == 2 else masked[..., None]
    # $\mathop{softmax}_j$ over the keys that are not masked
    weights = masked_softmax(scores, masked, dim=1, rows_may_be_empty=rows_may_be_empty)
    if dropout is not None:
        weights = dropout(weights)
    # $\sum_j p_{i,j} v_j$
    return torch.einsum('ijbn,jbnd->ibnd', weights, values), weights
