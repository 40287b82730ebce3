"""
# The faithful Transformer-XL

Dai et al., *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context* (2019), as the authors'
PyTorch code computes it: same constructor keywords, calling convention and parameter names, so their
checkpoints load as they are. See `docs/transformer_xl.md`.
"""
from .adaptive_embedding import AdaptiveEmbedding
from .adaptive_softmax import ProjectedAdaptiveLogSoftmax
from .init import init_weights
from .layers import DecoderLayer, RelLearnableDecoderLayer, RelPartialLearnableDecoderLayer
from .log_uniform_sampler import LogUniformSampler, sample_logits
from .mem_transformer import MemTransformerLM
from .multi_head_attn import MultiHeadAttn
from .positional_embedding import PositionalEmbedding
from .positionwise_ff import PositionwiseFF
from .rel_learnable_attn import RelLearnableMultiHeadAttn
from .rel_partial_learnable_attn import RelPartialLearnableMultiHeadAttn

__all__ = [
    'AdaptiveEmbedding', 'DecoderLayer', 'LogUniformSampler', 'MemTransformerLM', 'MultiHeadAttn',
    'PositionalEmbedding', 'PositionwiseFF', 'ProjectedAdaptiveLogSoftmax', 'RelLearnableDecoderLayer',
    'RelLearnableMultiHeadAttn', 'RelPartialLearnableDecoderLayer', 'RelPartialLearnableMultiHeadAttn',
    'init_weights', 'sample_logits',
]
