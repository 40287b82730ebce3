r"""
# Configurable Transformer components (`FeedForwardConfigs`, `TransformerConfigs`)

labml configs: each item is computed lazily by the option chosen for it, so an experiment builds only the
modules it uses. Item names, option names and defaults are those of labml_nn's `transformers/configs.py`, so an
override dictionary written for it (`'transformer.ffn.glu_variant': 'SwiGLU'`, `'transformer.d_model': 256`, ...)
works here unchanged. Overrides are checked when they are given (see `validation.py`).

`docs/options.md` lists every item and option; it is generated from the registrations below by
`python -m labml_txl.configs.options_doc`.
"""
import copy
import warnings
from labml.configs import aggregate, calculate, option
from torch import nn

from ..positions import registry
from ..positions.scheme import SchemeSettings
from ..transformer.feed_forward import FeedForward
from ..transformer.mha import MultiHeadAttention
from ..transformer.models import (Decoder, Encoder, EncoderDecoder, EmbeddingsWithLearnedPositionalEncoding,
                                  EmbeddingsWithPositionalEncoding, Generator, TransformerLayer)
from .validation import ValidatedConfigs, chosen_option


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
    """Multi-head attention with absolute positions (`transformer/mha.py`)"""
    return MultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout)


calculate(TransformerConfigs.encoder_attn, 'mha', _mha)
calculate(TransformerConfigs.decoder_attn, 'mha', _mha)
calculate(TransformerConfigs.decoder_mem_attn, 'mha', _mha)


def _warn_positions_twice(c: TransformerConfigs, attention_key: str, embed_key: str) -> None:
    """A scheme whose positions live in the attention, with an embedding that adds them too: say so (the defaults
    stay labml_nn's, so the combination is not refused)."""
    attention, embed = chosen_option(c, attention_key), chosen_option(c, embed_key)
    if embed in ('fixed_pos', 'learned_pos'):
        warnings.warn(f"{attention_key}={attention!r} with {embed_key}={embed!r} adds positions twice: the attention "
                      f"encodes them already; {embed_key}='no_pos' leaves them to it", UserWarning, stacklevel=2)


def _scheme_option(name: str, attention_key: str, embed_key: str) -> None:
    """Register the scheme `name` of the registry as the option `name` of `attention_key`: `MultiHeadAttention` with
    the scheme, warning when `embed_key` adds positions too. A decoder's self-attention is causal
    (`bidirectional=False`); the other two attentions are not."""
    bidirectional = attention_key != 'decoder_attn'
    scheme_class = registry.SCHEMES[name]

    def scheme(c: TransformerConfigs):
        _warn_positions_twice(c, attention_key, embed_key)
        settings = SchemeSettings(bidirectional=bidirectional, rotary_fraction=c.rotary_fraction,
                                  t5_num_buckets=c.t5_num_buckets, t5_max_distance=c.t5_max_distance)
        return MultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout,
                                  positions=scheme_class.from_settings(settings))
    # The first line of the scheme's docstring, and of its module's (`docs/options.md` lists them)
    summary = (scheme_class.__doc__ or name).strip().splitlines()[0].rstrip('.')
    module = scheme_class.__module__.replace('labml_txl.', '').replace('.', '/') + '.py'
    scheme.__doc__ = f"{summary} ({'bidirectional' if bidirectional else 'causal'}, `{module}`)"
    calculate(getattr(TransformerConfigs, attention_key), name, scheme)


def _scheme_options(name: str) -> None:
    """The scheme `name` of the registry as an option of the three attentions, unless its positions are the model's
    (the encoder's positions come from `src_embed`, the decoder's from `tgt_embed`; the decoder's attention to the
    encoder output reads the encoder's)."""
    if registry.SCHEMES[name].needs_model_positions:
        return
    for attention_key, embed_key in (('encoder_attn', 'src_embed'), ('decoder_attn', 'tgt_embed'),
                                     ('decoder_mem_attn', 'src_embed')):
        _scheme_option(name, attention_key, embed_key)


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


# ## Norms by name (`transformer/norms.py`)

NORMS = {'layer_norm': 'LayerNorm (Ba et al., 2016): re-centred and re-scaled, with a gain and a bias',
         'rms_norm': 'RMSNorm (Zhang & Sennrich, 2019): re-scaled by the root mean square, with a gain only'}


def norm_options(norm_item) -> None:
    """Register every norm of `NORMS` as an option of the configs item `norm_item` (this file's and Transformer-XL's)."""
    def chooses(name: str, doc: str):
        def choose(c):
            return name
        choose.__doc__ = doc
        return choose

    for name, doc in NORMS.items():
        option(norm_item, name)(chooses(name, doc))


norm_options(TransformerConfigs.norm)

# Every scheme of the registry, now and later (`positions/registry.py`), as an option of the three attentions
for _name in registry.SCHEMES:
    _scheme_options(_name)
registry.LISTENERS.append(_scheme_options)
