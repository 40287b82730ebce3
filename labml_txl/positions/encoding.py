r"""
# Fixed sinusoidal positional encodings

From *Attention Is All You Need*: position $p$ is encoded in $d_{model}$ features as

$$PE_{p, 2i} = \sin\Bigl(\frac{p}{10000^{2i/d_{model}}}\Bigr), \qquad
  PE_{p, 2i + 1} = \cos\Bigl(\frac{p}{10000^{2i/d_{model}}}\Bigr)$$

so sine and cosine of each frequency sit side by side, which needs an even $d_{model}$.

Transformer-XL encodes *distances* with the same frequencies, sines and cosines concatenated rather than
interleaved (`sinusoidal_embeddings`), for the distances of its relative table (`relative_distances`).

RoFormer (Su et al., 2021) turns the same frequencies into rotations of queries and keys by position (`rotate`;
the formula is in `rotary.py`, the scheme's page).
"""
import math
from typing import Optional

import torch

from ..errors import require_positive_int


def get_positional_encoding(d_model: int, max_len: int = 5000) -> torch.Tensor:
    """
    The sinusoidal table for positions `0 .. max_len - 1`.

    Args:
        d_model: number of features; must be even (sine and cosine of each frequency).
        max_len: number of positions.

    Shape:
        returns `[max_len, 1, d_model]`, ready to add to `[seq_len, batch, d_model]` embeddings.
    """
    require_positive_int('max_len', max_len)
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 2 or d_model % 2 != 0:
        raise ValueError(f"d_model={d_model!r} is not accepted for sinusoidal positional encodings: "
                         f"they pair a sine and a cosine per frequency, so d_model must be a positive even integer")
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    # $\frac{1}{10000^{2i/d_{model}}}$
    inverse_frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    encodings = torch.zeros(max_len, d_model)
    # $PE_{p,2i} = \sin(p / 10000^{2i/d_{model}})$
    encodings[:, 0::2] = torch.sin(position * inverse_frequency)
    # $PE_{p,2i+1} = \cos(p / 10000^{2i/d_{model}})$
    encodings[:, 1::2] = torch.cos(position * inverse_frequency)
    return encodings.unsqueeze(1)


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


def rotate(x: torch.Tensor, positions: torch.Tensor, d_rotary: int, seq_dim: int = 0) -> torch.Tensor:
    r"""
    RoFormer's rotation (`rotary.py`) of the first `d_rotary` features of `x` by the angles $m \theta_i$ of its
    `positions` $m$, along the axis `seq_dim`; the other features pass as they are.

    Shape:
        `x` `[..., d_k]` with `len(positions)` entries on axis `seq_dim` (`[seq, batch, heads, d_k]` by default),
        `positions` `[seq]`; returns the shape of `x`.
    """
    if len(positions) != x.shape[seq_dim]:
        raise ValueError(f"rotate: {len(positions)} positions for {x.shape[seq_dim]} entries on axis {seq_dim} of x "
                         f"{tuple(x.shape)}; each entry is turned by its own position, so give one per entry")
    half = d_rotary // 2
    # $\theta_i = 10000^{-2i/d}$, in float64 for exact angles, then in the dtype of `x`
    theta = 1.0 / 10000 ** (torch.arange(0, d_rotary, 2, dtype=torch.float64, device=x.device) / d_rotary)
    # $m \theta_i$, on the axes of `x`: `len(positions)` on `seq_dim`, `d / 2` last
    shape = [1] * x.dim()
    shape[seq_dim], shape[-1] = len(positions), half
    angles = (positions.to(torch.float64)[:, None] * theta).view(shape)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:d_rotary], x[..., d_rotary:]
    # $(x^{(i)} \cos m\theta_i - x^{(i+d/2)} \sin m\theta_i,\ x^{(i+d/2)} \cos m\theta_i + x^{(i)} \sin m\theta_i)$
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def query_positions(seq_q: int, seq_k: int, device: Optional[torch.device] = None) -> torch.Tensor:
    r"""
    The positions of `seq_q` queries against keys at $0 .. \mathit{seq_k} - 1$: the last `seq_q` of the key
    positions, $m_i = \mathit{seq_k} - \mathit{seq_q} + i$, as for every scheme of this package (the query $i$ is
    $i - j + \mathit{seq_k} - \mathit{seq_q}$ from the key $j$, `relative_distances`).

    Built for the queries' own length, not sliced from the keys' positions: with more queries than keys (the
    cross-attention of a decoder whose target is longer than its source) the first $\mathit{seq_q} - \mathit{seq_k}$
    are before the first key, at negative positions (a rotation by a negative angle), and the rotated score
    still depends on $m_i - j$ only, as ALiBi's and T5's biases do.

    Shape:
        returns `[seq_q]`, integers.
    """
    # $m_i = \mathit{seq_k} - \mathit{seq_q} + i$
    return torch.arange(seq_k - seq_q, seq_k, device=device)


def rotate_queries_and_keys(query: torch.Tensor, key: torch.Tensor, d_rotary: int, seq_dim: int = 0):
    """`query` and `key` rotated by their positions (`rotate`): the keys at `0 .. seq_k - 1`, the queries the last
    `seq_q` of them (a memory, if any, first; before the first key where there are more queries than keys,
    `query_positions`)."""
    seq_q, seq_k = query.shape[seq_dim], key.shape[seq_dim]
    return (rotate(query, query_positions(seq_q, seq_k, query.device), d_rotary, seq_dim),
            rotate(key, torch.arange(seq_k, device=key.device), d_rotary, seq_dim))
