r"""
# Transformer-XL with the positional schemes of the attention (`attn_type` 4, 5, 6)

Beside the original's four types, the schemes whose positions live in the attention, on Transformer-XL's absolute
attention (`MultiHeadAttn`: `q_net`, `kv_net`, no position added to the inputs) through its score hook:

* `4`, `'rotary'`: queries and keys rotated by position (RoFormer, `labml_txl/rotary_mha.py`), all features;
* `5`, `'alibi'`: $-m_h |i - j|$ after the scale, the paper's slopes (`labml_txl/alibi_mha.py`);
* `6`, `'t5_bias'`: a learned $b_{h, \mathop{bucket}(i - j)}$ after the scale, causal buckets (32, up to 128,
  `labml_txl/t5_bias_mha.py`), one table per layer.

The memory's positions are those before the segment: the `mlen` keys of the memory come first, the queries are the
last `qlen` of the `klen` positions. Each score depends on positions only through $i - j$, so a memory holding the
previous segment gives the same states as running both segments at once, and the keys and values kept from the
segment before (`kv_memo.py`) stay valid as the window moves (they are kept unrotated, and rotated at each use).
"""
from typing import Optional

import torch
from torch import nn

from ..alibi_mha import alibi_bias, alibi_slopes
from ..relative_attention import RelativeTerms, scores_of_terms
from ..rotary_mha import rotate_queries_and_keys
from ..t5_bias_mha import t5_bias
from .multi_head_attn import MultiHeadAttn


class RotaryMultiHeadAttn(MultiHeadAttn):
    """`MultiHeadAttn` with rotary embeddings of queries and keys (`attn_type` 4)."""

    def get_scores(self, query: torch.Tensor, key: torch.Tensor, terms: Optional[RelativeTerms]) -> torch.Tensor:
        return scores_of_terms(*rotate_queries_and_keys(query, key, self.d_head // 2 * 2), None)


class AlibiMultiHeadAttn(MultiHeadAttn):
    """`MultiHeadAttn` with ALiBi's linear biases (`attn_type` 5)."""

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm'):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm=norm)
        self.register_buffer('slopes', torch.tensor(alibi_slopes(n_head)), persistent=False)

    def get_scores(self, query: torch.Tensor, key: torch.Tensor, terms: Optional[RelativeTerms]) -> torch.Tensor:
        bias = alibi_bias(query.shape[0], key.shape[0], self.slopes, query)
        return scores_of_terms(query, key, None) + bias / self.scale


class T5BiasMultiHeadAttn(MultiHeadAttn):
    """`MultiHeadAttn` with T5's learned bias per head and causal distance bucket (`attn_type` 6)."""
    num_buckets, max_distance = 32, 128

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, norm: str = 'layer_norm'):
        super().__init__(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, norm=norm)
        # $b_{h, \mathop{bucket}}$
        self.relative_attention_bias = nn.Embedding(self.num_buckets, n_head)

    def get_scores(self, query: torch.Tensor, key: torch.Tensor, terms: Optional[RelativeTerms]) -> torch.Tensor:
        bias = t5_bias(query.shape[0], key.shape[0], self.relative_attention_bias, False, self.num_buckets,
                       self.max_distance, query)
        return scores_of_terms(query, key, None) + bias / self.scale


SCHEME_ATTENTIONS = {4: RotaryMultiHeadAttn, 5: AlibiMultiHeadAttn, 6: T5BiasMultiHeadAttn}
