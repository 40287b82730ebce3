r"""
# T5's relative position bias (`'t5_bias'`)

From *Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer* (Raffel et al., 2020):
no position embeddings; each head adds a learned scalar $b_{h, \mathop{bucket}(i - j)}$ to the score of query $i$
and key $j$,

$$\mathop{softmax}_j\Bigl(\frac{q_i^\top k_j}{\sqrt{d_k}} + b_{h,\,\mathop{bucket}(i - j)}\Bigr)$$

where the distance $n = i - j$ falls into one of `num_buckets` buckets: exact buckets for $|n| <$ `max_exact`
(half of the buckets of a direction), then buckets whose width grows logarithmically up to `max_distance`, every
longer distance in the last bucket. A causal decoder (`bidirectional=False`) has buckets for $n \ge 0$ only (keys
after the query are masked anyway, and fall in bucket 0); an encoder (`bidirectional=True`) gives half of the buckets
to each direction. The bias is added after the scale here, so a model's learned $b$ means what it means in T5 with
its unscaled scores.

Positions: the queries are the last `seq_q` of the `seq_k` key positions, as for `'relative'`.
"""
import math
from typing import Tuple

import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..errors import require_bool, require_positive_int
from ..fast.dispatch import Plan
from .encoding import relative_distances
from .scheme import PositionScheme, SchemeSettings


def relative_position_bucket(distance: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """The bucket of each distance $n = i - j$ (query position less key position), as the module docstring says."""
    bucket = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        # Keys after the query ($n < 0$) take the upper half
        bucket = bucket + (distance < 0).long() * num_buckets
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)
    max_exact = num_buckets // 2
    # $\mathit{max\_exact} + \lfloor \log(n / \mathit{max\_exact}) / \log(\mathit{max\_distance} / \mathit{max\_exact})
    # \cdot (\mathit{buckets} - \mathit{max\_exact}) \rfloor$, at most the last bucket
    logarithmic = max_exact + (torch.log(distance.float().clamp(min=1) / max_exact)
                               / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    logarithmic = logarithmic.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, logarithmic)


def t5_entry_bias(distances: torch.Tensor, bias: nn.Embedding, bidirectional: bool, num_buckets: int,
                  max_distance: int, scale: float) -> torch.Tensor:
    r"""$b_{h, \mathop{bucket}(d)} / \mathit{scale}$ for each distance $d$ of a relative table `[rlen]` (integers), from
    the table `bias` `[num_buckets, heads]`, as the bias per entry of `RelativeTerms` `[heads, rlen]`: it is added
    before the attention's scale, which leaves $b_{h, \mathop{bucket}(i - j)}$."""
    buckets = relative_position_bucket(distances, bidirectional, num_buckets, max_distance)
    return bias(buckets).transpose(0, 1) / scale


def check_t5_buckets(num_buckets: int, max_distance: int, bidirectional: bool,
                     names: Tuple[str, str] = ('num_buckets', 'max_distance')) -> None:
    """A `ValueError` naming what is accepted (the arguments by their `names`), unless the settings leave at least
    one exact bucket and room for the logarithmic ones before `max_distance`."""
    require_positive_int(names[0], num_buckets)
    require_positive_int(names[1], max_distance)
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(f"{names[0]}={num_buckets}, {names[1]}={max_distance} are not accepted "
                         f"(bidirectional={bidirectional}): the exact buckets (half of a direction's, here "
                         f"{max_exact}) must be at least 1 and fewer than {names[1]}")


class T5Bias(PositionScheme):
    """
    T5's learned bias per head and distance bucket.

    On the attention: `relative_attention_bias` `[num_buckets, heads]`.

    Args:
        bidirectional: buckets for both directions (an encoder) or for keys up to the query only (a decoder).
        num_buckets: number of buckets (per direction half of them when bidirectional); at least 2 (4
            bidirectional).
        max_distance: the distance from which every key shares the last bucket; more than `num_buckets / 2`
            (a quarter of them bidirectional).
    """

    def __init__(self, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128):
        require_bool('bidirectional', bidirectional)
        check_t5_buckets(num_buckets, max_distance, bidirectional)
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance

    @classmethod
    def from_settings(cls, settings: SchemeSettings) -> 'T5Bias':
        return cls(settings.bidirectional, settings.t5_num_buckets, settings.t5_max_distance)

    def add_parameters(self, attn: nn.Module, d_model: int, heads: int, d_head: int) -> None:
        # $b_{h, \mathop{bucket}}$
        attn.relative_attention_bias = nn.Embedding(self.num_buckets, heads)

    def terms(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor,
              full_table: bool) -> RelativeTerms:
        r"""$q_i^\top k_j + b_{h, \mathop{bucket}(i - j)} \sqrt{d_k}$ before the scale $1/\sqrt{d_k}$, which leaves
        $\frac{q_i^\top k_j}{\sqrt{d_k}} + b_{h, \mathop{bucket}(i - j)}$: a bias per distance of the table (a
        causal one puts the keys after the query in bucket 0)."""
        distances = relative_distances(seq_q, seq_k, bidirectional=full_table, dtype=torch.long, device=like.device)
        entry_bias = t5_entry_bias(distances, attn.relative_attention_bias, self.bidirectional, self.num_buckets,
                                   self.max_distance, attn.scale)
        return RelativeTerms(entry_bias=entry_bias.to(like.dtype))
