r"""
# Configurable Transformer components

labml configs: each item is computed lazily by the option chosen for it, so an experiment builds only the
modules it uses. Item names, option names and defaults are those of labml_nn's `transformers/configs.py`, so an
override dictionary written for it (`'transformer.ffn.glu_variant': 'SwiGLU'`, `'transformer.d_model': 256`, ...)
works here unchanged. Overrides are checked when they are given (see `config_validation.py`).

`docs/options.md` lists every item and option; it is generated from the registrations below by
`python -m labml_txl.configs.options_doc`.
"""
import copy
import warnings
from typing import List, Optional

from labml.configs import aggregate, calculate, option
from torch import nn

from ..positions.alibi import AlibiMultiHeadAttention
from .validation import ValidatedConfigs, chosen_option
from ..transformer.feed_forward import FeedForward
from ..transformer.mha import MultiHeadAttention
from .presets import PRESETS, TRAINING_COLUMNS
from ..positions.relative import RelativeMultiHeadAttention
from ..positions.rotary import RotaryMultiHeadAttention
from ..positions.t5_bias import T5BiasMultiHeadAttention
from ..xl import MemTransformerLM
from ..transformer.models import (Decoder, Encoder, EncoderDecoder, EmbeddingsWithLearnedPositionalEncoding,
                     EmbeddingsWithPositionalEncoding, Generator, TransformerLayer)


class FeedForwardConfigs(ValidatedConfigs):
    """
    Configurations of the position-wise feed-forward layer (`feed_forward.py`).
    """
    # The position-wise feed-forward layer
    ffn: FeedForward
    # Number of features of the embedding
    d_model: int
    # Number of features of the hidden layer
    d_ff: int = 2048
    # Dropout probability on the hidden layer
    dropout: float = 0.1
    # Activation of the hidden layer
    activation: nn.Module = 'ReLU'
    # Whether the hidden layer is gated
    is_gated: bool = False
    # Whether the first fully connected layer has a bias
    bias1: bool = True
    # Whether the second fully connected layer has a bias
    bias2: bool = True
    # Whether the gate's fully connected layer has a bias
    bias_gate: bool = False
    # A predefined GLU variant: sets `is_gated`, the biases and the activation together
    glu_variant: str = 'none'


@option(FeedForwardConfigs.activation, 'ReLU')
def _ffn_activation_relu():
    r"""$\max(0, x)$"""
    return nn.ReLU()


@option(FeedForwardConfigs.activation, 'GELU')
def _ffn_activation_gelu():
    r"""$x \Phi(x)$, where $\Phi(x) = P(X \le x), X \sim \mathcal{N}(0,1)$ (*Gaussian Error Linear Units*)"""
    return nn.GELU()


@option(FeedForwardConfigs.activation, 'SiLU')
def _ffn_activation_silu():
    r"""$x \sigma(x)$ (Swish with $\beta = 1$)"""
    return nn.SiLU()


@option(FeedForwardConfigs.ffn, 'default')
def _feed_forward(c: FeedForwardConfigs):
    """The feed-forward layer from the items above"""
    return FeedForward(c.d_model, c.d_ff, dropout=c.dropout, activation=c.activation, is_gated=c.is_gated,
                       bias1=c.bias1, bias2=c.bias2, bias_gate=c.bias_gate)


# ## GLU variants
#
# From *GLU Variants Improve Transformer*: the hidden layer is gated, without biases, as the paper has it.

def _glu_variant(name: str, activation: nn.Module):
    aggregate(FeedForwardConfigs.glu_variant, name,
              (FeedForwardConfigs.is_gated, True),
              (FeedForwardConfigs.bias1, False),
              (FeedForwardConfigs.bias2, False),
              (FeedForwardConfigs.bias_gate, False),
              (FeedForwardConfigs.activation, activation))


# $FFN_{GLU}(x) = (\sigma(x W_1) \otimes x V) W_2$
_glu_variant('GLU', nn.Sigmoid())
# $FFN_{Bilinear}(x) = (x W_1 \otimes x V) W_2$
_glu_variant('Bilinear', nn.Identity())
# $FFN_{ReGLU}(x) = (\max(0, x W_1) \otimes x V) W_2$
_glu_variant('ReGLU', nn.ReLU())
# $FFN_{GEGLU}(x) = (\mathop{GELU}(x W_1) \otimes x V) W_2$
_glu_variant('GEGLU', nn.GELU())
# $FFN_{SwiGLU}(x) = (\mathop{Swish}_1(x W_1) \otimes x V) W_2$, $\mathop{Swish}_\beta(x) = x \sigma(\beta x)$
_glu_variant('SwiGLU', nn.SiLU())


class TransformerConfigs(ValidatedConfigs):
    """
    Configurations of an encoder-decoder Transformer (`models.py`). Every module is computed on first use only.
    """
    # Number of attention heads
    n_heads: int = 8
    # Transformer embedding size
    d_model: int = 512
    # Number of layers
    n_layers: int = 6
    # Dropout probability
    dropout: float = 0.1
    # Number of tokens in the source vocabulary (for token embeddings)
    n_src_vocab: int
    # Number of tokens in the target vocabulary (for the logits)
    n_tgt_vocab: int
    # Pre-norm $x + f(LN(x))$ when True (labml_nn's placement), post-norm $LN(x + f(x))$ when False
    norm_first: bool = True
    # The normalisation of every residual connection and of the stacks' outputs (`norms.py`)
    norm: str = 'layer_norm'

    # Encoder self-attention
    encoder_attn: MultiHeadAttention = 'mha'
    # Decoder self-attention
    decoder_attn: MultiHeadAttention = 'mha'
    # Decoder attention to the encoder output
    decoder_mem_attn: MultiHeadAttention = 'mha'
    # The fraction of each head's features that `'rotary'` attention rotates
    rotary_fraction: float = 1.0
    # `'t5_bias'`: the number of distance buckets, and the distance from which all keys share the last one
    t5_num_buckets: int = 32
    t5_max_distance: int = 128

    # Configurable feed-forward layer
    ffn: FeedForwardConfigs

    # Encoder layer
    encoder_layer: TransformerLayer = 'default'
    # Decoder layer
    decoder_layer: TransformerLayer = 'default'

    # Encoder: a stack of encoder layers
    encoder: Encoder = 'default'
    # Decoder: a stack of decoder layers
    decoder: Decoder = 'default'

    # Embedding layer of the source
    src_embed: nn.Module = 'fixed_pos'
    # Embedding layer of the target (for the decoder)
    tgt_embed: nn.Module = 'fixed_pos'

    # Logit generator for the prediction
    generator: Generator = 'default'

    # Encoder-decoder
    encoder_decoder: EncoderDecoder


def _mha(c: TransformerConfigs):
    """Multi-head attention with absolute positions (`mha.py`)"""
    return MultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout)


calculate(TransformerConfigs.encoder_attn, 'mha', _mha)
calculate(TransformerConfigs.decoder_attn, 'mha', _mha)
calculate(TransformerConfigs.decoder_mem_attn, 'mha', _mha)


def _relative_mha(c: TransformerConfigs):
    """Transformer-XL's relative attention (`relative_mha.py`), the same score terms and shift as `xl/`"""
    return RelativeMultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout)


calculate(TransformerConfigs.encoder_attn, 'relative', _relative_mha)
calculate(TransformerConfigs.decoder_attn, 'relative', _relative_mha)
calculate(TransformerConfigs.decoder_mem_attn, 'relative', _relative_mha)


def _warn_positions_twice(c: TransformerConfigs, attention_key: str, embed_key: str) -> None:
    """A scheme whose positions live in the attention, with an embedding that adds them too: say so (the defaults
    stay labml_nn's, so the combination is not refused)."""
    attention, embed = chosen_option(c, attention_key), chosen_option(c, embed_key)
    if embed in ('fixed_pos', 'learned_pos'):
        warnings.warn(f"{attention_key}={attention!r} with {embed_key}={embed!r} adds positions twice: the attention "
                      f"encodes them already; {embed_key}='no_pos' leaves them to it", UserWarning, stacklevel=2)


def _scheme_option(name: str, doc: str, build, attention_key: str, embed_key: str) -> None:
    """Register `build(c, bidirectional)` as the option `name` of `attention_key`, warning when `embed_key` adds
    positions too. A decoder's self-attention is causal (`bidirectional=False`); the other two attentions are not."""
    bidirectional = attention_key != 'decoder_attn'

    def scheme(c: TransformerConfigs):
        _warn_positions_twice(c, attention_key, embed_key)
        return build(c, bidirectional)
    scheme.__doc__ = doc.format(direction='bidirectional' if bidirectional else 'causal')
    calculate(getattr(TransformerConfigs, attention_key), name, scheme)


_SCHEMES = [
    ('rotary', "Rotary position embeddings of queries and keys (RoFormer, `rotary_mha.py`), `rotary_fraction` of "
               "the features",
     lambda c, bidirectional: RotaryMultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout,
                                                       rotary_fraction=c.rotary_fraction)),
    ('alibi', "Linear distance biases per head, the paper's slopes (ALiBi, `alibi_mha.py`)",
     lambda c, bidirectional: AlibiMultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout)),
    ('t5_bias', "T5's learned bias per head and distance bucket ({direction}, `t5_bias_mha.py`)",
     lambda c, bidirectional: T5BiasMultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout,
                                                       bidirectional=bidirectional, num_buckets=c.t5_num_buckets,
                                                       max_distance=c.t5_max_distance)),
]


# (the encoder's positions come from `src_embed`, the decoder's from `tgt_embed`; the decoder's attention to the
# encoder output reads the encoder's positions)
for _attention_key, _embed_key in (('encoder_attn', 'src_embed'), ('decoder_attn', 'tgt_embed'),
                                   ('decoder_mem_attn', 'src_embed')):
    for _name, _doc, _build in _SCHEMES:
        _scheme_option(_name, _doc, _build, _attention_key, _embed_key)


@option(TransformerConfigs.ffn, 'default')
def _feed_forward_configs(c: TransformerConfigs):
    """Feed-forward configs that take `d_model` and `dropout` from the Transformer's"""
    conf = FeedForwardConfigs()
    conf.set_default(FeedForwardConfigs.d_model, func=lambda: c.d_model)
    conf.set_default(FeedForwardConfigs.dropout, func=lambda: c.dropout)
    return conf


@option(TransformerConfigs.encoder_layer, 'default')
def _encoder_layer(c: TransformerConfigs):
    """Encoder layer: self-attention and a copy of the feed-forward layer"""
    return TransformerLayer(d_model=c.d_model, self_attn=c.encoder_attn, src_attn=None,
                            feed_forward=copy.deepcopy(c.ffn.ffn), dropout_prob=c.dropout, norm_first=c.norm_first,
                            norm=c.norm)


@option(TransformerConfigs.decoder_layer, 'default')
def _decoder_layer(c: TransformerConfigs):
    """Decoder layer: self-attention, attention to the encoder output and a copy of the feed-forward layer"""
    return TransformerLayer(d_model=c.d_model, self_attn=c.decoder_attn, src_attn=c.decoder_mem_attn,
                            feed_forward=copy.deepcopy(c.ffn.ffn), dropout_prob=c.dropout, norm_first=c.norm_first,
                            norm=c.norm)


@option(TransformerConfigs.encoder, 'default')
def _encoder(c: TransformerConfigs):
    """`n_layers` encoder layers and a final norm"""
    return Encoder(c.encoder_layer, c.n_layers)


@option(TransformerConfigs.decoder, 'default')
def _decoder(c: TransformerConfigs):
    """`n_layers` decoder layers and a final norm"""
    return Decoder(c.decoder_layer, c.n_layers)


@option(TransformerConfigs.generator, 'default')
def _generator(c: TransformerConfigs):
    """A linear projection to `n_tgt_vocab` logits"""
    return Generator(c.n_tgt_vocab, c.d_model)


@option(TransformerConfigs.src_embed, 'fixed_pos')
def _src_embed_with_positional(c: TransformerConfigs):
    """Source embeddings with fixed sinusoidal positions"""
    return EmbeddingsWithPositionalEncoding(c.d_model, c.n_src_vocab)


@option(TransformerConfigs.tgt_embed, 'fixed_pos')
def _tgt_embed_with_positional(c: TransformerConfigs):
    """Target embeddings with fixed sinusoidal positions"""
    return EmbeddingsWithPositionalEncoding(c.d_model, c.n_tgt_vocab)


@option(TransformerConfigs.src_embed, 'learned_pos')
def _src_embed_with_learned_positional(c: TransformerConfigs):
    """Source embeddings with learned positions"""
    return EmbeddingsWithLearnedPositionalEncoding(c.d_model, c.n_src_vocab)


@option(TransformerConfigs.tgt_embed, 'learned_pos')
def _tgt_embed_with_learned_positional(c: TransformerConfigs):
    """Target embeddings with learned positions"""
    return EmbeddingsWithLearnedPositionalEncoding(c.d_model, c.n_tgt_vocab)


@option(TransformerConfigs.src_embed, 'no_pos')
def _src_embed_without_positional(c: TransformerConfigs):
    """Source token embeddings without positions"""
    return nn.Embedding(c.n_src_vocab, c.d_model)


@option(TransformerConfigs.tgt_embed, 'no_pos')
def _tgt_embed_without_positional(c: TransformerConfigs):
    """Target token embeddings without positions"""
    return nn.Embedding(c.n_tgt_vocab, c.d_model)


@option(TransformerConfigs.encoder_decoder, 'default')
def _encoder_decoder(c: TransformerConfigs):
    """The encoder-decoder of the modules above"""
    return EncoderDecoder(c.encoder, c.decoder, c.src_embed, c.tgt_embed, c.generator)


class TransformerXLConfigs(ValidatedConfigs):
    """
    Configurations of Transformer-XL (`xl.MemTransformerLM`): every constructor keyword is an item, with the
    defaults of the original `train.py`; `model` is built on first use. `attention` names the attention variant
    and `preset` sets the hyperparameters of one of the original run scripts (`tests/reference/xl/presets.md`).
    """
    # Vocabulary size; set by the corpus
    n_token: int
    # Number of layers
    n_layer: int = 12
    # Number of attention heads
    n_head: int = 10
    # Width of the residual stream
    d_model: int = 500
    # Width of each head
    d_head: int = 50
    # Hidden width of the position-wise feed-forward layer
    d_inner: int = 1000
    # Dropout probability of the residual branches and embeddings
    dropout: float = 0.0
    # Dropout probability of the attention weights
    dropatt: float = 0.0
    # Share the embedding's weights with the softmax's
    tie_weight: bool = True
    # Embedding size; `None` for `d_model`
    d_embed: Optional[int] = None
    # Adaptive embedding: each cluster's width is the previous one's divided by this
    div_val: int = 1
    # Which adaptive-softmax projections share the embedding's; `'none'` or `'all_but_first'`, or a list
    tie_projs: List[bool] = 'none'
    # Normalise before each sub-layer (pre-norm) instead of after it
    pre_lnorm: bool = False
    # LayerNorm (the original's) or RMSNorm in every layer (`norms.py`)
    norm: str = 'layer_norm'
    # Segment length: tokens predicted per step
    tgt_len: int = 70
    # Extended context: tokens before the segment given as input, not predicted
    ext_len: int = 0
    # Memory length: hidden states of earlier segments each layer attends to (0: no memory)
    mem_len: int = 0
    # Adaptive softmax and embedding cluster boundaries (empty: one cluster)
    cutoffs: List[int] = []
    # Adaptive input embedding (the original's `adaptive` for the input)
    adapt_inp: bool = False
    # Every query attends to the same number of keys
    same_length: bool = False
    # 0 relative (the paper's), 1 learnable relative, 2 absolute, 3 absolute deeper, 4 rotary, 5 ALiBi, 6 T5 bias;
    # set by `attention`
    attn_type: int = 0
    # Relative distances beyond this use this one's encoding (-1: no clamp)
    clamp_len: int = -1
    # Sampled softmax with this many samples (-1: the full softmax)
    sample_softmax: int = -1
    # Per-layer $u$, $v$ (the authors' TensorFlow code and published WikiText-103 model)
    untie_r: bool = False
    # Every numerical choice of the original where this package differs (`MemTransformerLM`), for its checkpoints
    original_numerics: bool = False
    # The fraction of each head's features that `'rotary'` attention rotates
    rotary_fraction: float = 1.0
    # `'t5_bias'`: the number of causal distance buckets
    t5_num_buckets: int = 32
    # `'t5_bias'`: the distance from which all keys share the last bucket
    t5_max_distance: int = 128
    # Weight initialisation: 'normal' or 'uniform'
    init: str = 'normal'
    # Range of the uniform initialisation
    init_range: float = 0.1
    # Standard deviation of the normal initialisation
    init_std: float = 0.02
    # Standard deviation of the adaptive softmax's projections' initialisation
    proj_init_std: float = 0.01

    # The attention variant by name
    attention: str = 'relative'
    # The hyperparameters of an original run script
    preset: str = 'none'

    # Segment length of validation during training (the original's `eval_tgt_len`); `tgt_len` by default
    eval_tgt_len: int
    # The paper's final evaluation (the original's `eval.py`, longer memories, clamped distances): segment length
    test_tgt_len: int
    # The paper's final evaluation: memory length
    test_mem_len: int = 0
    # The paper's final evaluation: clamp of relative distances
    test_clamp_len: int = -1
    # The paper's final evaluation: every query attends to the same number of keys
    test_same_length: bool = False

    # The model
    model: MemTransformerLM


@option(TransformerXLConfigs.eval_tgt_len, 'tgt_len')
def _eval_tgt_len(c: TransformerXLConfigs):
    """The training segment length `tgt_len`"""
    return c.tgt_len


@option(TransformerXLConfigs.test_tgt_len, 'tgt_len')
def _test_tgt_len(c: TransformerXLConfigs):
    """The training segment length `tgt_len`"""
    return c.tgt_len


@option(TransformerXLConfigs.tie_projs, 'none')
def _tie_projs_none(c: TransformerXLConfigs):
    """No projection shared: `[False] * (len(cutoffs) + 1)`"""
    return [False] * (len(c.cutoffs) + 1)


@option(TransformerXLConfigs.tie_projs, 'all_but_first')
def _tie_projs_all_but_first(c: TransformerXLConfigs):
    """All tail projections shared with the embedding's (the original's `proj_share_all_but_first`)"""
    return [False] + [True] * len(c.cutoffs)


@option(TransformerXLConfigs.model, 'default')
def _mem_transformer(c: TransformerXLConfigs):
    """`MemTransformerLM` from the items, initialised as the original (`xl.init.init_weights`)"""
    return MemTransformerLM(c.n_token, c.n_layer, c.n_head, c.d_model, c.d_head, c.d_inner, c.dropout, c.dropatt,
                            tie_weight=c.tie_weight, d_embed=c.d_embed, div_val=c.div_val,
                            tie_projs=list(c.tie_projs), pre_lnorm=c.pre_lnorm, tgt_len=c.tgt_len,
                            ext_len=c.ext_len, mem_len=c.mem_len, cutoffs=list(c.cutoffs), adapt_inp=c.adapt_inp,
                            same_length=c.same_length, attn_type=c.attn_type, clamp_len=c.clamp_len,
                            sample_softmax=c.sample_softmax, untie_r=c.untie_r, init=c.init,
                            init_range=c.init_range, init_std=c.init_std, proj_init_std=c.proj_init_std, norm=c.norm,
                            original_numerics=c.original_numerics,
                            rotary_fraction=c.rotary_fraction, t5_num_buckets=c.t5_num_buckets,
                            t5_max_distance=c.t5_max_distance)


# ## Norms by name (`norms.py`)

def _norm_option(name: str, doc: str):
    """Register the norm `name` (`norms.py`) as an option of both configs' `norm` item."""
    def choose(c):
        return name
    choose.__doc__ = doc
    option(TransformerConfigs.norm, name)(choose)
    option(TransformerXLConfigs.norm, name)(choose)


_norm_option('layer_norm', 'LayerNorm (Ba et al., 2016): re-centred and re-scaled, with a gain and a bias')
_norm_option('rms_norm', 'RMSNorm (Zhang & Sennrich, 2019): re-scaled by the root mean square, with a gain only')


# ## Attention variants by name

for _name, _attn_type in (('relative', 0), ('learnable', 1), ('absolute', 2), ('absolute_deeper', 3), ('rotary', 4),
                          ('alibi', 5), ('t5_bias', 6)):
    aggregate(TransformerXLConfigs.attention, _name, (TransformerXLConfigs.attn_type, _attn_type))


# ## Presets of the original run scripts: the model and evaluation columns of `presets.py`'s table

for _name, _row in PRESETS.items():
    aggregate(TransformerXLConfigs.preset, _name,
              *((getattr(TransformerXLConfigs, column), copy.copy(value)) for column, value in _row.items()
                if column not in TRAINING_COLUMNS),
              (TransformerXLConfigs.test_same_length, True))
