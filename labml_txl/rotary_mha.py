r"""
# Rotary position embeddings (`'rotary'`)

From *RoFormer: Enhanced Transformer with Rotary Position Embedding* (Su et al., 2021). Queries and keys are
rotated by their position before the dot product: feature $i$ is paired with feature $i + d/2$ and the pair at
position $m$ is turned by the angle $m \theta_i$, $\theta_i = 10000^{-2i/d}$,

$$\begin{pmatrix} x^{(i)}_m \\ x^{(i + d/2)}_m \end{pmatrix} \mapsto
  \begin{pmatrix} x^{(i)}_m \cos m\theta_i - x^{(i + d/2)}_m \sin m\theta_i \\
                  x^{(i + d/2)}_m \cos m\theta_i + x^{(i)}_m \sin m\theta_i \end{pmatrix}$$

so that the score of query $m$ and key $n$ depends on their positions only through $m - n$. Only the first $d$ of
each head's $d_k$ features are rotated (`rotary_fraction` of them, rounded down to an even number); the others
pass as they are.

Positions: the queries are the last `seq_q` of the `seq_k` key positions, as for `'relative'` (with a memory in
front of the keys, the memory comes first).
"""
import torch

from .mha import MultiHeadAttention


def rotate(x: torch.Tensor, positions: torch.Tensor, d_rotary: int) -> torch.Tensor:
    r"""
    The rotation of the first `d_rotary` features of `x` by the angles $m \theta_i$ of its `positions` $m$.

    Shape:
        `x` `[seq, batch, heads, d_k]`, `positions` `[seq]`; returns the shape of `x`.
    """
    half = d_rotary // 2
    # $\theta_i = 10000^{-2i/d}$, in float64 for exact angles, then in the dtype of `x`
    theta = 1.0 / 10000 ** (torch.arange(0, d_rotary, 2, dtype=torch.float64, device=x.device) / d_rotary)
    # $m \theta_i$, `[seq, 1, 1, d / 2]`
    angles = (positions.to(torch.float64)[:, None] * theta)[:, None, None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:d_rotary], x[..., d_rotary:]
    # $(x^{(i)} \cos m\theta_i - x^{(i+d/2)} \sin m\theta_i,\ x^{(i+d/2)} \cos m\theta_i + x^{(i)} \sin m\theta_i)$
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def rotate_queries_and_keys(query: torch.Tensor, key: torch.Tensor, d_rotary: int):
    """`query` and `key` `[len, batch, heads, d_k]` rotated by their positions, the queries being the last of the keys'
    positions."""
    seq_q, seq_k = query.shape[0], key.shape[0]
    key_positions = torch.arange(seq_k, device=key.device)
    return rotate(query, key_positions[seq_k - seq_q:], d_rotary), rotate(key, key_positions, d_rotary)


class RotaryMultiHeadAttention(MultiHeadAttention):
    """
    Multi-head attention with rotary position embeddings of the queries and keys.

    Args:
        heads, d_model, dropout_prob, bias, impl: as `MultiHeadAttention`.
        rotary_fraction: the fraction of each head's features that are rotated, in (0, 1]; the count is rounded
            down to an even number, at least 2.

    Shape:
        as `MultiHeadAttention`.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True, *,
                 rotary_fraction: float = 1.0, impl: str = 'auto'):
        super().__init__(heads, d_model, dropout_prob=dropout_prob, bias=bias, impl=impl)
        if isinstance(rotary_fraction, bool) or not isinstance(rotary_fraction, (int, float)) \
                or not 0 < rotary_fraction <= 1:
            raise ValueError(f"rotary_fraction={rotary_fraction!r} is not accepted: the fraction of each head's "
                             f"features that are rotated, a number in (0, 1]")
        self.d_rotary = int(self.d_k * rotary_fraction) // 2 * 2
        if self.d_rotary < 2:
            raise ValueError(f"rotary_fraction={rotary_fraction} rotates {self.d_rotary} of the {self.d_k} features "
                             f"of a head: at least one pair (2 features) must be rotated")

    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        r"""$A_{m,n} = \mathop{RoPE}(q_m, m)^\top \mathop{RoPE}(k_n, n)$ (see the module docstring)."""
        return super().get_scores(*rotate_queries_and_keys(query, key, self.d_rotary))
