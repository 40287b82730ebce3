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

import torch
from torch import nn

from .errors import require_bool, require_positive_int
from .mha import MultiHeadAttention
from .positional_encoding import query_key_distances


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


def t5_bias(seq_q: int, seq_k: int, bias: nn.Embedding, bidirectional: bool, num_buckets: int, max_distance: int,
            like: torch.Tensor) -> torch.Tensor:
    """$b_{h, \\mathop{bucket}(i - j)}$ `[seq_q, seq_k, 1, heads]` from the table `bias` `[num_buckets, heads]`, in the
    dtype of `like`."""
    buckets = relative_position_bucket(query_key_distances(seq_q, seq_k, like.device), bidirectional, num_buckets,
                                       max_distance)
    return bias(buckets)[:, :, None, :].to(like.dtype)


class T5BiasMultiHeadAttention(MultiHeadAttention):
    """
    Multi-head attention with T5's learned relative position bias per head and distance bucket.

    Args:
        heads, d_model, dropout_prob, bias, impl: as `MultiHeadAttention`.
        bidirectional: buckets for both directions (an encoder) or for keys up to the query only (a decoder).
        num_buckets: number of buckets (per direction half of them when bidirectional); at least 2 (4
            bidirectional).
        max_distance: the distance from which every key shares the last bucket; more than `num_buckets / 2`
            (a quarter of them bidirectional).

    Shape:
        as `MultiHeadAttention`.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True, *,
                 bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128, impl: str = 'auto'):
        super().__init__(heads, d_model, dropout_prob=dropout_prob, bias=bias, impl=impl)
        require_bool('bidirectional', bidirectional)
        require_positive_int('num_buckets', num_buckets)
        require_positive_int('max_distance', max_distance)
        max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if max_exact < 1 or max_distance <= max_exact:
            raise ValueError(f"num_buckets={num_buckets}, max_distance={max_distance} are not accepted "
                             f"(bidirectional={bidirectional}): the exact buckets (half of a direction's, here "
                             f"{max_exact}) must be at least 1 and fewer than max_distance")
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance
        # $b_{h, \mathop{bucket}}$
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)

    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        r"""$q_i^\top k_j + b_{h, \mathop{bucket}(i - j)} \sqrt{d_k}$: the scale that follows leaves
        $\frac{q_i^\top k_j}{\sqrt{d_k}} + b_{h, \mathop{bucket}(i - j)}$."""
        bias = t5_bias(query.shape[0], key.shape[0], self.relative_attention_bias, self.bidirectional,
                       self.num_buckets, self.max_distance, query)
        return super().get_scores(query, key) + bias / self.scale
