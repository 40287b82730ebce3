r"""
# Relative multi-head attention (`'relative'`)

Transformer-XL's relative attention (Dai et al., 2019) as a drop-in for `MultiHeadAttention`: same
constructor, same `forward(*, query, key, value, mask=None)`, same shapes and masks. The score of query $i$
and key $j$ is

$$A^{rel}_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{(q_i + v)^\top W_{k,R} R_{i-j}}_{(b) + (d)}$$

with $q = W_q x^{query}$, $k = W_k x^{key}$ and $v$-values $W_v x^{value}$ as in `MultiHeadAttention`,
$R_{i-j}$ the fixed sinusoid of the distance (Transformer-XL's `PositionalEmbedding`), $W_{k,R}$ = `r_net`,
and learned $u$ = `r_w_bias`, $v$ = `r_r_bias` `[heads, d_k]` owned by this module. The terms and the shift
are `labml_txl.attention.reference`'s, shared with `labml_txl.xl`.

Positions: the queries are the last `seq_q` of the `seq_k` key positions (equal lengths for self-attention;
with a memory in front of the keys, the memory comes first). Distances run from `seq_k - 1` down to
`-(seq_q - 1)`, so every pair is scored exactly, keys after the query included: an unmasked encoder works, and a
decoder passes a causal mask as it would to `MultiHeadAttention`.

Everything but the scores is `MultiHeadAttention`'s: this class says what the position terms are
(`position_terms`), which its score hook `get_scores` reads as the formula (`relative_attention_scores`), and from
which the dispatcher runs our kernel (under a decoder's causal mask), SDPA or the head-major composite for the same
numbers.
"""

import torch
from torch import nn

from ..fast.dispatch import Plan
from ..transformer.mha import MultiHeadAttention
from .encoding import relative_distances, sinusoid_inverse_frequencies, sinusoidal_embeddings
from ..attention.reference import RelativeTerms


class RelativeMultiHeadAttention(MultiHeadAttention):
    """
    Multi-head attention with Transformer-XL's relative positions.

    Args:
        heads: number of heads $h$.
        d_model: number of features of queries, keys and values; divisible by `heads` and even (sinusoids).
        dropout_prob: dropout on the attention weights.
        bias: whether the query, key, value and output projections have biases ($W_{k,R}$ has none).
        impl: as `MultiHeadAttention`.

    Shape:
        `query` `[seq_q, batch, d_model]`, `key` and `value` `[seq_k, batch, d_model]`,
        `mask` boolean `[seq_q or 1, seq_k, batch or 1]` (True where attention is allowed);
        output `[seq_q, batch, d_model]`, and with `need_weights=True` also the attention weights
        `[seq_q, seq_k, batch, heads]`. A query with every key masked attends to nothing (zero weights).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True, *,
                 impl: str = 'auto'):
        # $W_q$, $W_k$, $W_v$, the output projection, dropout and $1/\sqrt{d_k}$ as `MultiHeadAttention`
        super().__init__(heads, d_model, dropout_prob=dropout_prob, bias=bias, impl=impl)
        if d_model % 2 != 0:
            raise ValueError(f"d_model={d_model} is not accepted for relative attention: its sinusoidal "
                             f"distance embeddings pair a sine and a cosine per frequency, so d_model must be even")
        # $W_{k,R}$
        self.r_net = nn.Linear(d_model, d_model, bias=False)
        # $u$ and $v$
        self.r_w_bias = nn.Parameter(torch.zeros(heads, self.d_k))
        self.r_r_bias = nn.Parameter(torch.zeros(heads, self.d_k))
        # The sinusoids $R_d$ of the last shape seen: `(seq_q, seq_k, dtype, device)` and the table
        self._sinusoids = (None, None)

    def _sinusoids_of(self, seq_q: int, seq_k: int, dtype: torch.dtype, device) -> torch.Tensor:
        """$R_d$ for the distances $d$ = `seq_k - 1 .. -(seq_q - 1)`, `[seq_k + seq_q - 1, d_model]`."""
        # Distances are exact integers only in float32 or float64
        pos_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        distances = relative_distances(seq_q, seq_k, bidirectional=True, dtype=pos_dtype, device=device)
        # $\omega_i = 1 / 10000^{2i/d}$, computed in the precision of the distances (no buffer to lose it)
        inv_freq = sinusoid_inverse_frequencies(self.d_model, dtype=pos_dtype, device=device)
        # $R_d$
        return sinusoidal_embeddings(distances, inv_freq).to(dtype)

    def position_terms(self, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor) -> RelativeTerms:
        r"""$W_{k,R} R_d$ for the distances $d$ = `seq_k - 1 .. -(seq_q - 1)` as the table `[heads, rlen, d_k]`,
        with $u$ and $v$. The sinusoids depend only on the shape: kept for the last one where the plan allows."""
        key = (seq_q, seq_k, like.dtype, like.device)
        if not plan.keeps_shapes:
            r = self._sinusoids_of(*key)
        else:
            if self._sinusoids[0] != key:
                self._sinusoids = (key, self._sinusoids_of(*key))
            r = self._sinusoids[1]
        # $W_{k,R} R_d$
        table = self.r_net(r).unflatten(-1, (self.heads, self.d_k)).transpose(0, 1)
        return RelativeTerms(table, content_bias=self.r_w_bias, position_bias=self.r_r_bias)
