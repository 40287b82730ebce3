r"""
# Multi-head attention

From *Attention Is All You Need*:

$$\mathop{Attention}(Q, K, V) = \underset{seq}{\mathop{softmax}}\Bigl(\frac{Q K^\top}{\sqrt{d_k}}\Bigr) V$$

computed in $h$ heads of $d_k = d_{model} / h$ features, each with its own projections of the query, key and
value, then concatenated and projected back to $d_{model}$.

The scores $A_{i,j}$ come from one hook, `get_scores` (labml_nn's), which reads the position terms of the attention's
positional scheme (`positions=`, a `PositionScheme` of `labml_txl/positions/`: relative, rotary, ALiBi, T5 bias, by
name in `positions/registry.py`; `docs/attention.md` adds one); a subclass may also override `get_scores` with any
score. How the attention is computed is `dispatch.attend`'s
choice: `scaled_dot_product_attention` where it serves, else the head-major composite, or the readable reference
(`impl='reference'`, or a `get_scores` of a subclass's own, which only the reference calls).

labml_nn's `MultiHeadAttention` wraps each of the query, key and value projections in a
`PrepareForMultiHeadAttention`, so its state_dict names them `query.linear.weight` where ours has `query.weight`;
`load_state_dict` here accepts both names (`_load_from_state_dict`), so a labml_nn checkpoint loads as it is.
"""
import math
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..attention.composite import split_heads
from ..attention.masks import check_mask, masked_keys
from ..attention.reference import RelativeTerms, scores_of_terms
from ..errors import require_bool, require_positive_int, require_probability
from ..fast import dispatch
from ..fast.dispatch import Plan, check_impl
from ..fast.dropout import Dropout
from ..positions.scheme import PositionScheme, require_scheme


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
        positions: the positional scheme whose terms the scores add (`labml_txl/positions/`, one scheme object per
            attention, which registers its parameters on this module), or None (positions, if any, are the
            inputs').
        impl: `'auto'` (the dispatcher picks the fastest implementation that serves each call) or `'reference'`
            (the readable specification, `attention/reference.py`).

    Shape:
        `query` `[seq_q, batch, d_model]`, `key` and `value` `[seq_k, batch, d_model]`,
        `mask` boolean `[seq_q or 1, seq_k, batch or 1]` (True where attention is allowed);
        output `[seq_q, batch, d_model]`, and with `need_weights=True` also the attention weights
        `[seq_q, seq_k, batch, heads]`. A query with every key masked attends to nothing (zero weights).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True, *,
                 positions: Optional[PositionScheme] = None, impl: str = 'auto'):
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
        self.impl = check_impl(impl)
        if positions is not None and require_scheme(positions).needs_model_positions:
            raise ValueError(f"positions={type(positions).__name__}() is not accepted: its positions are given by a "
                             f"model that owns them (MemTransformerLM), which MultiHeadAttention has not")
        self.positions = positions
        if positions is not None:
            positions.attach(self, d_model, heads, self.d_k)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Renames labml_nn's entries of the projections (`query.linear.weight`, see the module's docstring) to
        ours before loading; the projections, loaded after this module, read the renamed entries."""
        for projection in ('query', 'key', 'value'):
            for tensor in ('weight', 'bias'):
                theirs, ours = f'{prefix}{projection}.linear.{tensor}', f'{prefix}{projection}.{tensor}'
                if theirs not in state_dict:
                    continue
                if ours in state_dict:
                    error_msgs.append(f"both {theirs!r} (labml_nn's name) and {ours!r} are in the state_dict: "
                                      f"they name the same tensor; keep one")
                else:
                    state_dict[ours] = state_dict.pop(theirs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

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

    @dispatch.replaceable_scores
    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        r"""
        The hook for the scores: $A_{i,j} = q_i^\top k_j$ with the position terms of the scheme (`position_terms`),
        before the scale $1/\sqrt{d_k}$ and the softmax.

        A positional scheme says what it adds as `RelativeTerms` (a relative table, a bias per distance, a rotation),
        which the faster implementations compute without calling this hook. An override (labml_nn's `get_scores`)
        may compute any score; only the reference path calls it.

        Shape:
            `query` `[seq_q, batch, heads, d_k]`, `key` `[seq_k, batch, heads, d_k]`; returns
            `[seq_q, seq_k, batch, heads]`.
        """
        plan = Plan.now(query.device, self.impl)
        return scores_of_terms(query, key, self.position_terms(plan, query.shape[0], key.shape[0], query))

    def position_terms(self, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor) -> Optional[RelativeTerms]:
        """The position terms of the scores (see `get_scores`) for `seq_q` queries that are the last of `seq_k` key
        positions, in the dtype and on the device of `like`: the scheme's, of the full table (every pair scored; a
        decoder passes its causal mask), or None without one."""
        if self.positions is None:
            return None
        return self.positions.terms(self, plan, seq_q, seq_k, like, True)

    def forward(self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: Optional[torch.Tensor] = None,
                need_weights: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        seq_q, batch_size = self._check_inputs(query, key, value, mask)
        plan = Plan.now(query.device, self.impl)
        # `[batch, heads, seq, d_k]` views of the projections
        q, k, v = (split_heads(proj(x), self.heads) for proj, x in ((self.query, query), (self.key, key),
                                                                     (self.value, value)))
        # $\mathop{softmax}_j(A_{i,j} / \sqrt{d_k})\, v_j$ over the keys that may be attended to, heads
        # concatenated; a query with none attends to nothing (zero weights)
        x, weights = dispatch.attend(plan, q, k, v, scale=self.scale, masked=masked_keys(mask),
                                     terms=self.position_terms(plan, seq_q, key.shape[0], q),
                                     get_scores=dispatch.score_hook(self), dropout=self.dropout,
                                     need_weights=need_weights)
        output = self.output(x)
        return (output, weights) if need_weights else output
