r"""
# Transformer-XL with the positional schemes of the attention (`attn_type` 4, 5, 6)

Beside the original's four types, the schemes whose positions live in the attention, on Transformer-XL's absolute
attention (`MultiHeadAttn`: `q_net`, `kv_net`, no position added to the inputs), each saying what it adds to the
scores in `position_terms`, as the vanilla files do:

* `4`, `'rotary'`: queries and keys rotated by position (RoFormer, `labml_txl/positions/rotary.py`), the first
  `rotary_fraction` of each head's features;
* `5`, `'alibi'`: $-m_h |i - j|$ after the scale, the paper's slopes (`labml_txl/positions/alibi.py`);
* `6`, `'t5_bias'`: a learned $b_{h, \mathop{bucket}(i - j)}$ after the scale, causal buckets (`t5_num_buckets`
  up to `t5_max_distance`, `labml_txl/positions/t5_bias.py`), one table per layer.

The memory's positions are those before the segment: the `mlen` keys of the memory come first, the queries are the
last `qlen` of the `klen` positions. Each score depends on positions only through $i - j$, so a memory holding the
previous segment gives the same states as running both segments at once, and the keys and values kept from the
segment before (`kv_memo.py`) stay valid as the window moves (they are kept unrotated, and rotated at each use).
The distances are those of a decoder's table, `klen - 1 .. 0`: the keys after a query are masked.
"""
from typing import Optional

import torch
from torch import nn

from ..positions.alibi import alibi_entry_bias, alibi_slopes
from ..fast.dispatch import Plan
from ..positions.encoding import relative_distances
from ..attention.reference import RelativeTerms
from ..positions.rotary import rotary_features
from ..positions.t5_bias import check_t5_buckets, t5_entry_bias
from .multi_head_attn import MultiHeadAttn


class RotaryMultiHeadAttn(MultiHeadAttn):
    """
    `MultiHeadAttn` with rotary embeddings of queries and keys (`attn_type` 4).

    Args:
        as `MultiHeadAttn`; rotary_fraction: the fraction of each head's features that are rotated, in (0, 1]
            (rounded down to an even number, at least 2).
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm', *, rotary_fraction: float = 1.0):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm=norm)
        self.d_rotary = rotary_features(d_head, rotary_fraction)

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor) -> Optional[RelativeTerms]:
        return RelativeTerms(rotary_features=self.d_rotary)


class AlibiMultiHeadAttn(MultiHeadAttn):
    """`MultiHeadAttn` with ALiBi's linear biases (`attn_type` 5)."""

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm'):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm=norm)
        self.register_buffer('slopes', torch.tensor(alibi_slopes(n_head)), persistent=False)

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor) -> Optional[RelativeTerms]:
        distances = relative_distances(qlen, klen, bidirectional=False, dtype=like.dtype, device=like.device)
        return RelativeTerms(entry_bias=alibi_entry_bias(distances, self.slopes, self.scale))


class T5BiasMultiHeadAttn(MultiHeadAttn):
    """
    `MultiHeadAttn` with T5's learned bias per head and causal distance bucket (`attn_type` 6).

    Args:
        as `MultiHeadAttn`; num_buckets, max_distance: the buckets of the distances (see `t5_bias_mha.py`).
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm', *, num_buckets: int = 32,
                 max_distance: int = 128):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm=norm)
        check_t5_buckets(num_buckets, max_distance, bidirectional=False)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        # $b_{h, \mathop{bucket}}$
        self.relative_attention_bias = nn.Embedding(num_buckets, n_head)

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor) -> Optional[RelativeTerms]:
        distances = relative_distances(qlen, klen, bidirectional=False, dtype=torch.long, device=like.device)
        entry_bias = t5_entry_bias(distances, self.relative_attention_bias, False, self.num_buckets,
                                   self.max_distance, self.scale)
        return RelativeTerms(entry_bias=entry_bias.to(like.dtype))

