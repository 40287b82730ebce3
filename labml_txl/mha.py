r"""
# Multi-head attention

From *Attention Is All You Need*:

$$\mathop{Attention}(Q, K, V) = \underset{seq}{\mathop{softmax}}\Bigl(\frac{Q K^\top}{\sqrt{d_k}}\Bigr) V$$

computed in $h$ heads of $d_k = d_{model} / h$ features, each with its own projections of the query, key and
value, then concatenated and projected back to $d_{model}$.

Two paths compute the same thing: the default runs `torch.nn.functional.scaled_dot_product_attention`
(fused kernels where PyTorch has them); the explicit path below it spells out the formula and can return the
attention weights.
"""
import math
from typing import Optional, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F

from .attention_mask import check_mask, to_batch_head_mask
from .dropout import Dropout
from .errors import require_bool, require_positive_int, require_probability
from .relative_attention import from_heads, masked_softmax_heads


def check_heads(heads: int, d_model: int) -> int:
    """The per-head size $d_k = d_{model} / h$, or a `ValueError` when $h$ does not divide $d_{model}$."""
    require_positive_int('heads', heads)
    require_positive_int('d_model', d_model)
    if d_model % heads != 0:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}: each head gets d_model / heads "
                         f"features; accepted numbers of heads for d_model={d_model}: {divisors}")
    return d_model // heads


class MultiHeadAttention(nn.Module):
    """
    Multi-head attention with separate query, key and value projections.

    Args:
        heads: number of heads $h$.
        d_model: number of features of queries, keys and values; divisible by `heads`.
        dropout_prob: dropout on the attention weights.
        bias: whether the projections have biases.

    Shape:
        `query` `[seq_q, batch, d_model]`, `key` and `value` `[seq_k, batch, d_model]`,
        `mask` boolean `[seq_q or 1, seq_k, batch or 1]` (True where attention is allowed);
        output `[seq_q, batch, d_model]`, and with `need_weights=True` also the attention weights
        `[seq_q, seq_k, batch, heads]`.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True):
        super().__init__()
        self.d_k = check_heads(heads, d_model)
        require_probability('dropout_prob', dropout_prob)
        require_bool('bias', bias)
        self.heads = heads
        self.d_model = d_model
        self.query = nn.Linear(d_model, d_model, bias=bias)
        self.key = nn.Linear(d_model, d_model, bias=bias)
        self.value = nn.Linear(d_model, d_model, bias=bias)
        self.output = nn.Linear(d_model, d_model, bias=bias)
        self.dropout_prob = dropout_prob
        self.dropout = Dropout(dropout_prob)
        # $\frac{1}{\sqrt{d_k}}$
        self.scale = 1 / math.sqrt(self.d_k)

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: Optional[torch.Tensor]) -> Tuple[int, int]:
        """`(seq_q, batch)`, or a `ValueError` naming the shapes when the inputs or the mask do not fit."""
        if query.dim() != 3 or query.shape[2] != self.d_model:
            raise ValueError(f"query of shape {list(query.shape)} is not accepted: expected "
                             f"[seq_q, batch, {self.d_model}]")
        seq_q, batch_size, _ = query.shape
        if key.dim() != 3 or key.shape[1:] != (batch_size, self.d_model) or value.shape != key.shape:
            raise ValueError(f"query {list(query.shape)}, key {list(key.shape)} and value {list(value.shape)} "
                             f"are not accepted: expected [seq_q, batch, {self.d_model}] for the query and "
                             f"[seq_k, batch, {self.d_model}] for both key and value")
        check_mask(mask, seq_q, key.shape[0], batch_size)
        return seq_q, batch_size

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """`[seq, batch, d_model]` to the head-major `[batch, heads, seq, d_k]`."""
        seq_len, batch_size, _ = x.shape
        return x.view(seq_len, batch_size, self.heads, self.d_k).permute(1, 2, 0, 3)

    def forward(self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: Optional[torch.Tensor] = None,
                need_weights: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        seq_q, batch_size = self._check_inputs(query, key, value, mask)

        q = self._split_heads(self.query(query))
        k = self._split_heads(self.key(key))
        v = self._split_heads(self.value(value))
        attn_mask = to_batch_head_mask(mask)

        if need_weights:
            # $\frac{Q K^\top}{\sqrt{d_k}}$, `[batch, heads, seq_q, seq_k]`
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            # $\mathop{softmax}$ over the keys that may be attended to (a row with none gets zero weights)
            weights = self.dropout(masked_softmax_heads(scores, None if attn_mask is None else ~attn_mask))
            # $\cdot V$
            x = torch.matmul(weights, v)
        else:
            dropout_p = self.dropout_prob if self.training else 0.0
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
            weights = None

        # Concatenate the heads: `[batch, heads, seq_q, d_k]` to `[seq_q, batch, d_model]`
        output = self.output(from_heads(x))
        if need_weights:
            return output, weights.permute(2, 3, 0, 1)
        return output
