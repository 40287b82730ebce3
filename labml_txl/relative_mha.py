r"""
# Relative multi-head attention (`'relative'`)

Transformer-XL's relative attention (Dai et al., 2019) as a drop-in for `MultiHeadAttention`: same
constructor, same `forward(*, query, key, value, mask=None)`, same shapes and masks. The score of query $i$
and key $j$ is

$$A^{rel}_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{(q_i + v)^\top W_{k,R} R_{i-j}}_{(b) + (d)}$$

with $q = W_q x^{query}$, $k = W_k x^{key}$ and $v$-values $W_v x^{value}$ as in `MultiHeadAttention`,
$R_{i-j}$ the fixed sinusoid of the distance (Transformer-XL's `PositionalEmbedding`), $W_{k,R}$ = `r_net`,
and learned $u$ = `r_w_bias`, $v$ = `r_r_bias` `[heads, d_k]` owned by this module. The terms and the shift
are `labml_txl.relative_attention`'s, shared with `labml_txl.xl`.

Positions: the queries are the last `seq_q` of the `seq_k` key positions (equal lengths for self-attention;
with a memory in front of the keys, the memory comes first). Distances run from `seq_k - 1` down to
`-(seq_q - 1)`, so every pair is scored exactly, keys after the query included: an unmasked encoder works, and a
decoder passes a causal mask as it would to `MultiHeadAttention`.

`fast = True` (the default) computes in the head-major layout `[batch, heads, seq, d_k]` with the shift as a
view and caches the sinusoids per shape; under a decoder's causal mask (float32 on the CPU, without attention
dropout in training and without `need_weights`) it runs `labml_txl.native`'s causal relative attention kernel,
forward and backward. `fast = False` is the plain computation of
`labml_txl.relative_attention` (einsums over `[seq_q, seq_k, batch, heads]`). They agree to float rounding.
"""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from . import native
from .mha import MultiHeadAttention
from .relative_attention import (from_heads, heads_mask, masked_softmax, relative_attention_scores,
                                 relative_attention_weights_heads, relative_distances, sinusoid_inverse_frequencies,
                                 sinusoidal_embeddings)


class RelativeMultiHeadAttention(MultiHeadAttention):
    """
    Multi-head attention with Transformer-XL's relative positions.

    Args:
        heads: number of heads $h$.
        d_model: number of features of queries, keys and values; divisible by `heads` and even (sinusoids).
        dropout_prob: dropout on the attention weights.
        bias: whether the query, key, value and output projections have biases ($W_{k,R}$ has none).

    Shape:
        `query` `[seq_q, batch, d_model]`, `key` and `value` `[seq_k, batch, d_model]`,
        `mask` boolean `[seq_q or 1, seq_k, batch or 1]` (True where attention is allowed);
        output `[seq_q, batch, d_model]`, and with `need_weights=True` also the attention weights
        `[seq_q, seq_k, batch, heads]`. A query with every key masked attends to nothing (zero weights).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True):
        # $W_q$, $W_k$, $W_v$, the output projection, dropout and $1/\sqrt{d_k}$ as `MultiHeadAttention`
        super().__init__(heads, d_model, dropout_prob=dropout_prob, bias=bias)
        if d_model % 2 != 0:
            raise ValueError(f"d_model={d_model} is not accepted for relative attention: its sinusoidal "
                             f"distance embeddings pair a sine and a cosine per frequency, so d_model must be even")
        # $W_{k,R}$
        self.r_net = nn.Linear(d_model, d_model, bias=False)
        # $u$ and $v$
        self.r_w_bias = nn.Parameter(torch.zeros(heads, self.d_k))
        self.r_r_bias = nn.Parameter(torch.zeros(heads, self.d_k))
        # The head-major fast path (False: the plain computation)
        self.fast = True
        # The sinusoids $R_d$ of the last shape seen: `(seq_q, seq_k, dtype, device)` and the table
        self._sinusoids = (None, None)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """`[seq, batch, d_model]` to `[seq, batch, heads, d_k]`."""
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.d_k)

    def _distance_embeddings(self, seq_q: int, seq_k: int, dtype: torch.dtype, device) -> torch.Tensor:
        """$W_{k,R} R_d$ for the distances $d$ = `seq_k - 1 .. -(seq_q - 1)`, `[seq_k + seq_q - 1, heads, d_k]`."""
        key = (seq_q, seq_k, dtype, device)
        if self.fast and not torch.compiler.is_compiling():
            # The sinusoids depend only on the shape: computed once per shape (the projection is not cached)
            if self._sinusoids[0] != key:
                self._sinusoids = (key, self._sinusoids_of(seq_q, seq_k, dtype, device))
            r = self._sinusoids[1]
        else:
            r = self._sinusoids_of(seq_q, seq_k, dtype, device)
        # $W_{k,R} R_d$
        return self._heads(self.r_net(r)[:, None, :])[:, 0]

    def _sinusoids_of(self, seq_q: int, seq_k: int, dtype: torch.dtype, device) -> torch.Tensor:
        """$R_d$ for the distances $d$ = `seq_k - 1 .. -(seq_q - 1)`, `[seq_k + seq_q - 1, d_model]`."""
        # Distances are exact integers only in float32 or float64
        pos_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        distances = relative_distances(seq_q, seq_k, bidirectional=True, dtype=pos_dtype, device=device)
        # $\omega_i = 1 / 10000^{2i/d}$, computed in the precision of the distances (no buffer to lose it)
        inv_freq = sinusoid_inverse_frequencies(self.d_model, dtype=pos_dtype, device=device)
        # $R_d$
        return sinusoidal_embeddings(distances, inv_freq).to(dtype)

    def forward(self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: Optional[torch.Tensor] = None,
                need_weights: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        seq_q, batch_size = self._check_inputs(query, key, value, mask)
        seq_k = key.shape[0]

        if self.fast:
            return self._forward_heads(query, key, value, mask, need_weights)
        q = self._heads(self.query(query))
        k = self._heads(self.key(key))
        v = self._heads(self.value(value))
        r = self._distance_embeddings(seq_q, seq_k, q.dtype, q.device)

        # $A^{rel}_{i,j} = (q_i + u)^\top k_j + (q_i + v)^\top W_{k,R} R_{i-j}$, `[seq_q, seq_k, batch, heads]`
        scores = relative_attention_scores(q, k, r, self.r_w_bias, self.r_r_bias) * self.scale
        # $\mathop{softmax}_j$ over the allowed keys
        weights = masked_softmax(scores, None if mask is None else ~mask, dim=1)
        weights = self.dropout(weights)
        # $\sum_j a_{i,j} v_j$, heads concatenated
        x = torch.einsum('ijbh,jbhd->ibhd', weights, v).reshape(seq_q, batch_size, self.d_model)
        output = self.output(x)
        if need_weights:
            return output, weights
        return output

    def _forward_heads(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       mask: Optional[torch.Tensor],
                       need_weights: bool) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """The fast path: head-major `[batch, heads, seq, d_k]`, batched `@`, the shift as a view."""
        seq_q, batch_size, _ = query.shape
        seq_k = key.shape[0]
        # `[batch, heads, seq, d_k]` views of the projections
        q, k, v = (x.unflatten(-1, (self.heads, self.d_k)).permute(1, 2, 0, 3)
                   for x in (self.query(query), self.key(key), self.value(value)))
        # $W_{k,R} R_d$ as `[heads, seq_k + seq_q - 1, d_k]`
        r = self._distance_embeddings(seq_q, seq_k, q.dtype, q.device).transpose(0, 1)
        masked = None if mask is None else heads_mask(~mask)
        if not need_weights and not (self.training and self.dropout.p > 0):
            # Under a decoder's causal mask, our kernel (`labml_txl.native`, with its backward pass): it reads the
            # views as they are, and only the entries of the table the visible keys need
            window = native.kernel_window(q, r, masked, seq_k, k, v, self.r_w_bias, self.r_r_bias)
            if window is not None:
                return self.output(native.causal_relative_attention(q, k, v, r, self.r_w_bias, self.r_r_bias,
                                                                    self.scale, window=window))
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        # $\mathop{softmax}_j(A^{rel}_{i,j} / \sqrt{d_k})$ over the allowed keys, `[batch, heads, seq_q, seq_k]`
        weights = relative_attention_weights_heads(q, k, r, self.r_w_bias, self.r_r_bias, masked, self.scale)
        weights = self.dropout(weights)
        # $\sum_j a_{i,j} v_j$, heads concatenated
        output = self.output(from_heads(torch.matmul(weights, v)))
        if need_weights:
            return output, weights.permute(2, 3, 0, 1)
        return output
