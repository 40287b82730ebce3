r"""
# Fixed sinusoidal positional encodings

From *Attention Is All You Need*: position $p$ is encoded in $d_{model}$ features as

$$PE_{p, 2i} = \sin\Bigl(\frac{p}{10000^{2i/d_{model}}}\Bigr), \qquad
  PE_{p, 2i + 1} = \cos\Bigl(\frac{p}{10000^{2i/d_{model}}}\Bigr)$$

so sine and cosine of each frequency sit side by side, which needs an even $d_{model}$.
"""
import math

import torch

from .errors import require_positive_int


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
