r"""
# What the Transformer-XL attention variants share

Every variant scores `qlen` queries against `klen = mlen + qlen` keys (the cached memory followed by the
segment), then

$$\mathop{Attn}(Q, K, V) = \mathop{softmax}_j\bigl(\tfrac{1}{\sqrt{d_{head}}}\, A_{i,j}\bigr) V$$

over keys $j$, with masked keys left out (`masked_softmax`: safe in fp16/bf16, no NaN for a fully masked row),
dropout on the attention weights (`dropatt`), the output projection $W_o$ (`o_net`, no bias), dropout, and the
residual connection with layer normalisation after it (post-LN) or before the projections (`pre_lnorm`).
Masks inside `xl/` follow the original: boolean, **True where a key is masked**, `[qlen, klen, 1]` or
`[qlen, klen]`. The variants differ only in the score $A_{i,j}$.

## Two paths, one result

`fast = True` (the default): the relative variants run our attention kernel (`labml_txl.native`: forward, and in
training its backward pass) under the decoder's causal or `same_length` mask, reading the projections where they
are. Elsewhere they compute in the head-major layout `[bsz, n_head, seq, d_head]`: queries, keys and values made
contiguous once, every product a plain batched `@`, the relative shift a view (`relative_shift_view`), the softmax
over the last, contiguous axis, and without gradients SDPA with the position terms as its bias. The absolute
variants call `scaled_dot_product_attention`. `fast = False` is the original's computation (einsums over
`[qlen, klen, bsz, n_head]`, the pad-and-copy shift), kept to compare against: the two agree to float rounding.
"""
from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .. import native
from ..dropout import Dropout
from ..errors import require_positive_int, require_probability
from ..prepacked_linear import inference_linear
from ..relative_attention import (CausalPositionBias, from_heads, heads_mask, masked_softmax, masked_softmax_heads,
                                  relative_attention_sdpa)


def join_kv(kv_memory: Optional[torch.Tensor], kv_segment: torch.Tensor) -> torch.Tensor:
    """The keys and values of memory (or None) and segment, `[2, bsz, n_head, len, d_head]` each, joined into one
    contiguous `[2, bsz, n_head, mlen + qlen, d_head]` (one copy)."""
    return (kv_segment if kv_memory is None else torch.cat([kv_memory, kv_segment], dim=3)).contiguous()


class XLAttentionBase(nn.Module):
    """
    Args:
        n_head: number of heads.
        d_model: number of features of the input and output.
        d_head: number of features of each head (`n_head * d_head` need not equal `d_model`).
        dropout: dropout on the projected output.
        dropatt: dropout on the attention weights.
        pre_lnorm: layer-normalise the input instead of the residual sum.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False):
        super().__init__()
        require_positive_int('n_head', n_head)
        require_positive_int('d_model', d_model)
        require_positive_int('d_head', d_head)
        require_probability('dropout', dropout, allow_one=False)
        require_probability('dropatt', dropatt, allow_one=False)
        self.n_head = n_head
        self.d_model = d_model
        self.d_head = d_head
        self.dropout = dropout
        self.drop = Dropout(dropout)
        self.dropatt = Dropout(dropatt)
        # $W_o$
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        # $\frac{1}{\sqrt{d_{head}}}$
        self.scale = 1 / (d_head ** 0.5)
        self.pre_lnorm = pre_lnorm
        # The original rounds attention type 0's scores to float32 before its softmax; see `MemTransformerLM`
        self.round_scores_to_float32 = False
        # The head-major fast path (False: the original's computation)
        self.fast = True
        # Keys and values `[2, bsz, n_head, mlen, d_head]` of the memory, computed by the segment before: set by
        # `MemTransformerLM` for one call in no-grad evaluation (attention types 0 and 1), else None
        self.mems_kv: Optional[torch.Tensor] = None
        # When True, the fast path leaves the keys and values of memory (or None) and segment in `last_kv`, each
        # `[2, bsz, n_head, len, d_head]`
        self.keep_kv = False
        self.last_kv: Optional[Tuple[Optional[torch.Tensor], torch.Tensor]] = None
        # A row with every key masked gets zero weights; `MemTransformerLM` turns this off (its masks always leave
        # key $m + i$ to query $i$, so the second fill changes nothing there)
        self.zero_masked_rows = True

    def _attend(self, score: torch.Tensor, attn_mask: Optional[torch.Tensor], head_v: torch.Tensor) -> torch.Tensor:
        """Scaled, masked softmax of `score` `[qlen, klen, bsz, n_head]` applied to `head_v`
        `[klen, bsz, n_head, d_head]`; returns the concatenated heads `[qlen, bsz, n_head * d_head]`."""
        score = score * self.scale
        if self.round_scores_to_float32:
            score = score.float().to(score.dtype)
        # $\mathop{softmax}_j(A_{i,j} / \sqrt{d_{head}})$
        attn_prob = masked_softmax(score, attn_mask, dim=1, zero_masked_rows=self.zero_masked_rows)
        attn_prob = self.dropatt(attn_prob)
        # $\sum_j p_{i,j} v_j$
        attn_vec = torch.einsum('ijbn,jbnd->ibnd', attn_prob, head_v)
        return attn_vec.reshape(attn_vec.shape[0], attn_vec.shape[1], self.n_head * self.d_head)

    @property
    def _fold_scale(self) -> float:
        """The scale to fold into the score product (`scale=`), or 1 when the scores must be scaled after their
        sum, in the original's order (`round_scores_to_float32` reproduces the original's bits)."""
        return 1.0 if self.round_scores_to_float32 else self.scale

    def _attend_heads(self, score: torch.Tensor, attn_mask: Optional[torch.Tensor],
                      head_v: torch.Tensor) -> torch.Tensor:
        """`_attend` in the head-major layout: `score` `[bsz, n_head, qlen, klen]` (already times
        `_fold_scale`), `head_v` `[bsz, n_head, klen, d_head]`; returns `[qlen, bsz, n_head * d_head]`."""
        if self.round_scores_to_float32:
            score = score * self.scale
            score = score.float().to(score.dtype)
        # $\mathop{softmax}_j(A_{i,j} / \sqrt{d_{head}})$ over the last axis
        # (in place: `score` is a fresh product here)
        attn_prob = masked_softmax_heads(score, heads_mask(attn_mask), self.zero_masked_rows, inplace=True)
        return self._weigh_values(attn_prob, head_v)

    def _weigh_values(self, attn_prob: torch.Tensor, head_v: torch.Tensor) -> torch.Tensor:
        r"""Attention dropout and $\sum_j p_{i,j} v_j$ as one batched `@`: `attn_prob` `[bsz, n_head, qlen, klen]`,
        `head_v` `[bsz, n_head, klen, d_head]`; returns `[qlen, bsz, n_head * d_head]`."""
        return from_heads(torch.matmul(self.dropatt(attn_prob), head_v))

    def _use_sdpa_bias(self) -> bool:
        """Relative attention through SDPA with the positions as a bias: only where it is faster (no gradient
        to compute, measured in `experiments/benchmark.py`), without attention dropout, and not when the
        original's float32 rounding of the scores is asked for (SDPA never shows the scores)."""
        return (not torch.is_grad_enabled() and not self.round_scores_to_float32
                and (not self.training or self.dropatt.p == 0))

    def _kernel_attention(self, q: torch.Tensor, kv_memory: Optional[torch.Tensor], kv_segment: torch.Tensor,
                          r: torch.Tensor, u: Optional[torch.Tensor], v: Optional[torch.Tensor],
                          attn_mask: Optional[torch.Tensor],
                          r_bias: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """Relative attention by our kernel (`native/attention.py`), `[qlen, bsz, n_head * d_head]`, or None where it
        does not serve: it takes the decoder's causal mask (or `same_length`'s), reads the keys and values of memory
        and segment where they are (`_qkv_parts`) and, where gradients are needed, runs its own backward pass; attention
        dropout in training and the original's float32 rounding of the scores (which the kernel never shows) are left
        to the PyTorch path. `r`, `u`, `v`, `r_bias` as `relative_attention_sdpa` takes them; `attn_mask` as the layer
        takes it."""
        if self.round_scores_to_float32 or (self.training and self.dropatt.p > 0):
            return None
        k_memory, v_memory = (None, None) if kv_memory is None else kv_memory.unbind(0)
        k, values = kv_segment.unbind(0)
        klen = k.shape[-2] + (0 if k_memory is None else k_memory.shape[-2])
        window = native.kernel_window(q, r, heads_mask(attn_mask), klen, k_memory, v_memory, k, values, u, v, r_bias)
        if window is None:
            return None
        return native.causal_relative_attention(q, k, values, r, u, v, self.scale, r_bias, window,
                                                k_memory=k_memory, values_memory=v_memory)

    def _relative_attention_no_grad(self, q: torch.Tensor, kv_memory: Optional[torch.Tensor],
                                    kv_segment: torch.Tensor, r: torch.Tensor, u: Optional[torch.Tensor],
                                    v: Optional[torch.Tensor], attn_mask: Optional[torch.Tensor],
                                    r_bias: Optional[torch.Tensor] = None,
                                    causal_bias: Optional[CausalPositionBias] = None) -> torch.Tensor:
        """Relative attention where `_use_sdpa_bias` holds, `[qlen, bsz, n_head * d_head]`: by our kernel where it
        serves (`_kernel_attention`), else by SDPA with the position terms as its bias (`relative_attention_sdpa`,
        `causal_bias` for its causal case) on the joined keys and values."""
        attn_vec = self._kernel_attention(q, kv_memory, kv_segment, r, u, v, attn_mask, r_bias)
        if attn_vec is not None:
            return attn_vec
        head_k, head_v = join_kv(kv_memory, kv_segment).unbind(0)
        return from_heads(relative_attention_sdpa(q, head_k, head_v, r, u, v, self.scale, heads_mask(attn_mask),
                                                  r_bias=r_bias, causal_bias=causal_bias))

    def _output(self, w: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        """Output projection, dropout and the residual connection with layer normalisation."""
        # (on the fast path without gradients through oneDNN with $W_o$ prepacked: `prepacked_linear.py`)
        attn_out = self.drop(inference_linear(attn_vec, self.o_net.weight) if self.fast else self.o_net(attn_vec))
        if self.pre_lnorm:
            # $w + W_o\,\mathop{Attn}(\mathop{LN}(\cdot))$
            return w + attn_out
        # $\mathop{LN}(w + W_o\,\mathop{Attn}(\cdot))$ (on the fast path without gradients in one pass,
        # `native/layer_norm.py`)
        if self.fast:
            return native.residual_layer_norm(w, attn_out, self.layer_norm)
        return self.layer_norm(w + attn_out)

    @staticmethod
    def _joined_heads(head_q: torch.Tensor, kv_memory: Optional[torch.Tensor], kv_segment: torch.Tensor):
        """What `_qkv_parts` returns as the PyTorch path takes it: the queries contiguous and the keys and values of
        memory and segment joined, `[bsz, n_head, len, d_head]` each (one copy each)."""
        head_k, head_v = join_kv(kv_memory, kv_segment).unbind(0)
        return head_q.contiguous(), head_k, head_v

    def _qkv_parts(self, qkv_net: nn.Linear, w: torch.Tensor, mems: Optional[torch.Tensor],
                   query_bias: Optional[torch.Tensor] = None):
        r"""
        Head-major queries of the segment `w` `[bsz, n_head, qlen, d_head]`, and the keys and values of the memory
        (None without one) and of the segment, each `[2, bsz, n_head, len, d_head]`, all views of their projections
        (the queries `[qlen, bsz, n_head, d_head]` in memory; our kernel and SDPA read them as they are, and
        `_joined_heads` makes them contiguous and joins the keys and values for the PyTorch path) and, with
        `keep_kv`, the keys and values also left in `last_kv` as that pair. `query_bias` `[n_head, d_head]` (or
        None) is added to the queries by the projection, as its bias: $q + u$ with no pass of its own.

        The original projects `[mems, w]` with all three of $W_q, W_k, W_v$ and drops the memory's queries. Here the
        segment gets all three and the memory only $W_k, W_v$ (a third of that product saved), and since the memory
        carries no gradient, the backward pass computes no input gradient for its rows either. With `mems_kv` set
        (no-grad evaluation, `MemTransformerLM`) the memory's keys and values are the ones the segment before
        computed, and the memory is not projected again. Same numbers: each row of a product depends only on its
        own input row (`LayerNorm` too, with `pre_lnorm`).
        """
        hd = self.n_head * self.d_head
        # The bias $[u; 0; 0]$ of the joint projection, or none
        bias = None if query_bias is None else torch.cat([query_bias.reshape(hd), query_bias.new_zeros(2 * hd)])
        # $[W_q; W_k; W_v] h$ of the segment, `[qlen, bsz, 3 * n_head * d_head]` (without gradients through oneDNN
        # with the weight prepacked, `prepacked_linear.py`)
        qkv = inference_linear(self.layer_norm(w) if self.pre_lnorm else w, qkv_net.weight, bias)
        # (`split` and `unbind` rather than slices: their backward pass concatenates, with no zero-filled gradient)
        q, kv = qkv.split([hd, 2 * hd], dim=-1)
        head_q = q.unflatten(-1, (self.n_head, self.d_head)).permute(1, 2, 0, 3)
        # $[W_k; W_v] h$ as `[2, bsz, n_head, qlen, d_head]` (a view)
        kv_segment = self._kv_view(kv)
        kv_memory = self.mems_kv
        if kv_memory is None and mems is not None and mems.shape[0] > 0:
            # $[W_k; W_v] m$ of the memory
            kv_memory = self._kv_view(F.linear(self.layer_norm(mems) if self.pre_lnorm else mems, qkv_net.weight[hd:]))
        if self.keep_kv:
            self.last_kv = (kv_memory, kv_segment)
        return head_q, kv_memory, kv_segment

    def _kv_view(self, kv: torch.Tensor) -> torch.Tensor:
        """`[len, bsz, 2 * n_head * d_head]` as `[2, bsz, n_head, len, d_head]`, a view."""
        return kv.reshape(kv.shape[0], kv.shape[1], 2, self.n_head, self.d_head).permute(2, 1, 3, 0, 4)

    def _plain_heads(self, qkv_net: nn.Linear, w: torch.Tensor, mems: Optional[torch.Tensor]):
        """The original's projection (plain path): $[W_q; W_{k,E}; W_v]$ of `[memory, segment]`, queries kept
        for the segment only; returns `q` `[qlen, bsz, n_head, d_head]` and `k`, `v` `[klen, bsz, n_head, d_head]`."""
        qlen, bsz = w.shape[0], w.shape[1]
        w_head_q, w_head_k, w_head_v = torch.chunk(qkv_net(self._keys_input(w, mems)), 3, dim=-1)
        klen = w_head_k.shape[0]
        # Queries only for the segment: the last `qlen` of the `klen` positions
        return (w_head_q[-qlen:].reshape(qlen, bsz, self.n_head, self.d_head),
                w_head_k.reshape(klen, bsz, self.n_head, self.d_head),
                w_head_v.reshape(klen, bsz, self.n_head, self.d_head))

    def _keys_input(self, w: torch.Tensor, mems: Optional[torch.Tensor]) -> torch.Tensor:
        """The memory followed by the segment, `[mlen + qlen, bsz, d_model]`, layer-normalised with `pre_lnorm`.
        The memory is only read: cached tensors are never changed in place."""
        cat = w if mems is None or mems.shape[0] == 0 else torch.cat([mems, w], 0)
        return self.layer_norm(cat) if self.pre_lnorm else cat
