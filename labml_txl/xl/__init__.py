"""
# The faithful Transformer-XL

Dai et al., *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context* (2019), as the authors'
PyTorch code computes it: same constructor keywords, calling convention and parameter names, so their
checkpoints load as they are. See `docs/transformer_xl.md`.
"""
from .adaptive_embedding import AdaptiveEmbedding
from .adaptive_softmax import ProjectedAdaptiveLogSoftmax
from .attention import XLAttention
from .init import init_weights
from .layers import DecoderLayer
from .log_uniform_sampler import LogUniformSampler, sample_logits
from .mem_transformer import MemTransformerLM
from .positional_embedding import PositionalEmbedding
from .positionwise_ff import PositionwiseFF

__all__ = [
    'AdaptiveEmbedding', 'DecoderLayer', 'LogUniformSampler', 'MemTransformerLM', 'PositionalEmbedding',
    'PositionwiseFF', 'ProjectedAdaptiveLogSoftmax', 'XLAttention', 'init_weights', 'sample_logits',
]
