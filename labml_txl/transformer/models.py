r"""
# Transformer encoder and decoder

The model of *Attention Is All You Need* assembled from this package's attention and feed-forward modules:
token embeddings with positions, a stack of layers, and a generator that maps the output to logits.

Each sub-layer is wrapped in a residual connection with layer normalisation, placed either before the
sub-layer (pre-norm, $x + f(\mathop{LN}(x))$, the default as in labml_nn) or after the residual sum
(post-norm, $\mathop{LN}(x + f(x))$, the paper's placement). `norm_first` chooses, as in `torch.nn.Transformer`.

Parameter names are labml_nn's, and its state_dicts load here with `load_state_dict(strict=True)`: the attention
also accepts labml_nn's names of its projections (`mha.py`), and `EmbeddingsWithPositionalEncoding` accepts the
sinusoidal table labml_nn saves when it equals its own (ours is computed, not loaded: our state_dicts leave it out).
"""
import copy
import math
from typing import Optional

import torch
from torch import nn

from ..errors import require_bool, require_positive_int, require_probability
from ..fast.dropout import Dropout
from ..positions.encoding import get_positional_encoding
from .norms import check_norm, make_norm


class _TokenEmbeddings(nn.Module):
    """Token embeddings scaled by $\\sqrt{d_{model}}$ plus a positional table `positional_encodings`."""
    positional_encodings: torch.Tensor

    def __init__(self, d_model: int, n_vocab: int, max_len: int):
        super().__init__()
        require_positive_int('n_vocab', n_vocab)
        self.linear = nn.Embedding(n_vocab, d_model)
        self.d_model = d_model
        self.n_vocab = n_vocab
        self.max_len = max_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.max_len:
            raise ValueError(f"a sequence of length {x.shape[0]} is not accepted: this embedding has positions "
                             f"for at most max_len={self.max_len}; build it with a larger max_len")
        # $\sqrt{d_{model}} \, E[x] + PE_{pos}$
        return self.linear(x) * math.sqrt(self.d_model) + self.positional_encodings[:x.shape[0]]


class EmbeddingsWithPositionalEncoding(_TokenEmbeddings):
    """
    Token embeddings with the fixed sinusoidal positional encodings.

    Args:
        d_model: embedding size; even, for the sinusoidal table.
        n_vocab: vocabulary size.
        max_len: the longest sequence it accepts.

    Shape:
        input token ids `[seq_len, batch]`, output `[seq_len, batch, d_model]`.
    """

    def __init__(self, d_model: int, n_vocab: int, max_len: int = 5000):
        super().__init__(d_model, n_vocab, max_len)
        self.register_buffer('positional_encodings', get_positional_encoding(d_model, max_len), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Accepts the table labml_nn saves (its buffer is persistent) when it equals ours, and drops it: the
        sinusoids are fixed, so a state_dict cannot change them. A table of another shape or other values is
        refused, naming the key."""
        key = f'{prefix}positional_encodings'
        given = state_dict.pop(key, None)
        if given is not None:
            ours = self.positional_encodings
            if given.shape != ours.shape or not given.is_floating_point():
                error_msgs.append(f"{key} of shape {list(given.shape)} and dtype {given.dtype} is not accepted: this "
                                  f"module's fixed sinusoids are {list(ours.shape)} floats (max_len={self.max_len}, "
                                  f"d_model={self.d_model}); build it with the max_len of the table")
            else:
                # a few units in the last place of the coarser dtype: a table computed by another library or device
                tolerance = 4 * max(torch.finfo(given.dtype).eps, torch.finfo(ours.dtype).eps)
                difference = (given.to(ours.device, torch.float64) - ours.double()).abs().max().item()
                if difference > tolerance:
                    error_msgs.append(f"{key} is not accepted: it differs from this module's fixed sinusoids by up "
                                      f"to {difference:.3g} (accepted: equal within {tolerance:.1g}), and they are "
                                      f"not loaded; a learned table belongs in EmbeddingsWithLearnedPositionalEncoding "
                                      f"('learned_pos')")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class EmbeddingsWithLearnedPositionalEncoding(_TokenEmbeddings):
    """
    Token embeddings with learned positional encodings (initialised to zero).

    Args:
        d_model: embedding size.
        n_vocab: vocabulary size.
        max_len: the longest sequence it accepts.

    Shape:
        input token ids `[seq_len, batch]`, output `[seq_len, batch, d_model]`.
    """

    def __init__(self, d_model: int, n_vocab: int, max_len: int = 5000):
        super().__init__(d_model, n_vocab, max_len)
        require_positive_int('d_model', d_model)
        require_positive_int('max_len', max_len)
        self.positional_encodings = nn.Parameter(torch.zeros(max_len, 1, d_model))


class TransformerLayer(nn.Module):
    """
    An encoder layer (self-attention and feed-forward) or, given `src_attn`, a decoder layer
    (self-attention, attention to the encoder's output, feed-forward).

    Args:
        d_model: number of features.
        self_attn: the self-attention module, called as `self_attn(query=, key=, value=, mask=)`.
        src_attn: the attention to the encoder output, for a decoder layer; `None` for an encoder layer.
        feed_forward: the position-wise feed-forward module.
        dropout_prob: dropout on each sub-layer's output before the residual sum.
        norm_first: pre-norm $x + f(\\mathop{LN}(x))$ when True (default), post-norm $\\mathop{LN}(x + f(x))$ when False.
        layer_norm_eps: the $\\epsilon$ of the layer norms.
        norm: `'layer_norm'` or `'rms_norm'` (`norms.py`).

    Attributes:
        is_save_ff_input: when True, each call keeps the input of the feed-forward network in `ff_input` (after
            `norm_ff` in a pre-norm layer, as labml_nn does; the residual stream itself in a post-norm one).
            Elsewhere the package passes inputs and results as arguments, never as attributes around a call; this
            is labml_nn's public attribute API, kept as small as it allows and only so that code written for it
            runs unchanged (its kNN-LM experiment reads `ff_input` of the last layer).
        ff_input: that input of the last call, `[seq_len, batch, d_model]`; None until a call with
            `is_save_ff_input` on.

    Shape:
        `x` `[seq_len, batch, d_model]`, `mask` `[seq_len or 1, seq_len, batch or 1]`,
        `src` `[src_len, batch, d_model]`, `src_mask` `[seq_len or 1, src_len, batch or 1]`; output as `x`.
    """

    def __init__(self, *, d_model: int, self_attn: nn.Module, src_attn: Optional[nn.Module] = None,
                 feed_forward: nn.Module, dropout_prob: float, norm_first: bool = True,
                 layer_norm_eps: float = 1e-5, norm: str = 'layer_norm'):
        super().__init__()
        require_positive_int('d_model', d_model)
        require_probability('dropout_prob', dropout_prob)
        require_bool('norm_first', norm_first)
        self.size = d_model
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.dropout = Dropout(dropout_prob)
        self.norm_first = norm_first
        self.norm_name = check_norm(norm)
        self.norm_self_attn = make_norm(norm, d_model, eps=layer_norm_eps)
        if src_attn is not None:
            self.norm_src_attn = make_norm(norm, d_model, eps=layer_norm_eps)
        self.norm_ff = make_norm(norm, d_model, eps=layer_norm_eps)
        self._is_save_ff_input = False
        self.ff_input: Optional[torch.Tensor] = None

    @property
    def is_save_ff_input(self) -> bool:
        return self._is_save_ff_input

    @is_save_ff_input.setter
    def is_save_ff_input(self, value: bool):
        require_bool('is_save_ff_input', value)
        self._is_save_ff_input = value

    def _feed_forward(self, z: torch.Tensor) -> torch.Tensor:
        if self._is_save_ff_input:
            self.ff_input = z.clone()
        return self.feed_forward(z)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer) -> torch.Tensor:
        if self.norm_first:
            # $x + \mathop{Dropout}(f(\mathop{LN}(x)))$
            return x + self.dropout(sublayer(norm(x)))
        # $\mathop{LN}(x + \mathop{Dropout}(f(x)))$
        return norm(x + self.dropout(sublayer(x)))

    def forward(self, *, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                src: Optional[torch.Tensor] = None, src_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self._residual(x, self.norm_self_attn, lambda z: self.self_attn(query=z, key=z, value=z, mask=mask))
        if src is not None:
            if self.src_attn is None:
                raise ValueError("src was given to an encoder layer (built with src_attn=None); "
                                 "only a decoder layer attends to an encoder output")
            x = self._residual(x, self.norm_src_attn,
                               lambda z: self.src_attn(query=z, key=src, value=src, mask=src_mask))
        return self._residual(x, self.norm_ff, self._feed_forward)


def _clone_layers(layer: nn.Module, n_layers: int) -> nn.ModuleList:
    require_positive_int('n_layers', n_layers)
    return nn.ModuleList([copy.deepcopy(layer) for _ in range(n_layers)])


def _final_norm(layer: nn.Module, stack: str, eps: float) -> nn.Module:
    """The norm after a stack of `layer`s: of the layer's kind (`norm_name`, as `TransformerLayer` says), else a
    LayerNorm as labml_nn's stacks have, over the layer's width `size`."""
    size = getattr(layer, 'size', None)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise TypeError(f"the layers of a {stack} say their width in `size` (a positive int, as TransformerLayer and "
                        f"labml_nn's layers do); {type(layer).__name__} has size={size!r}")
    return make_norm(getattr(layer, 'norm_name', 'layer_norm'), size, eps=eps)


class Encoder(nn.Module):
    """
    `n_layers` copies of an encoder layer, then a final layer norm.

    Args:
        layer: the layer to copy: a `TransformerLayer`, or any module labml_nn's `Encoder` takes (called as
            `layer(x=x, mask=mask)`, its width in `layer.size`, as labml_nn's `GMLPBlock`).
        n_layers: number of layers.
        final_norm: whether to normalise the output (pre-norm stacks need it; `torch.nn.Transformer` always has it).
        layer_norm_eps: the $\\epsilon$ of the final norm (of the layers' kind, `norm`; LayerNorm for a layer that
            does not say).

    Shape:
        `x` `[seq_len, batch, d_model]`, `mask` `[seq_len or 1, seq_len, batch or 1]`; output as `x`.
    """

    def __init__(self, layer: nn.Module, n_layers: int, final_norm: bool = True, layer_norm_eps: float = 1e-5):
        super().__init__()
        require_bool('final_norm', final_norm)
        self.layers = _clone_layers(layer, n_layers)
        self.norm = _final_norm(layer, 'Encoder', eps=layer_norm_eps) if final_norm else nn.Identity()

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x=x, mask=mask)
        return self.norm(x)


class Decoder(nn.Module):
    """
    `n_layers` copies of a decoder `TransformerLayer`, then a final layer norm.

    Args:
        layer: the layer to copy: a `TransformerLayer` built with `src_attn`, or any module labml_nn's `Decoder` takes
            (called as `layer(x=x, mask=tgt_mask, src=memory, src_mask=src_mask)`, its width in `layer.size`).
        n_layers: number of layers.
        final_norm: whether to normalise the output.
        layer_norm_eps: the $\\epsilon$ of the final norm (of the layers' kind, `norm`; LayerNorm for a layer that
            does not say).

    Shape:
        `x` `[tgt_len, batch, d_model]`, `memory` `[src_len, batch, d_model]`,
        `src_mask` `[tgt_len or 1, src_len, batch or 1]`, `tgt_mask` `[tgt_len or 1, tgt_len, batch or 1]`;
        output as `x`.
    """

    def __init__(self, layer: nn.Module, n_layers: int, final_norm: bool = True, layer_norm_eps: float = 1e-5):
        super().__init__()
        if isinstance(layer, TransformerLayer) and layer.src_attn is None:
            raise ValueError("a Decoder needs decoder layers: the layer given has src_attn=None")
        require_bool('final_norm', final_norm)
        self.layers = _clone_layers(layer, n_layers)
        self.norm = _final_norm(layer, 'Decoder', eps=layer_norm_eps) if final_norm else nn.Identity()

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: Optional[torch.Tensor] = None,
                tgt_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x=x, mask=tgt_mask, src=memory, src_mask=src_mask)
        return self.norm(x)


class Generator(nn.Module):
    """
    The projection from `d_model` features to vocabulary logits (apply `log_softmax` or
    `nn.CrossEntropyLoss` to them).

    Shape:
        input `[..., d_model]`, output `[..., n_vocab]`.
    """

    def __init__(self, n_vocab: int, d_model: int):
        super().__init__()
        require_positive_int('n_vocab', n_vocab)
        self.projection = nn.Linear(d_model, n_vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x)


class EncoderDecoder(nn.Module):
    """
    The encoder-decoder Transformer: `decode(encode(src))`. Matrices are initialised Glorot-uniform.

    Args:
        encoder, decoder: the stacks.
        src_embed, tgt_embed: embeddings of source and target tokens.
        generator: maps decoder output to logits (not applied by `forward`).

    Shape:
        `src` `[src_len, batch]`, `tgt` `[tgt_len, batch]`, masks as in `Encoder` and `Decoder`;
        output `[tgt_len, batch, d_model]`.
    """

    def __init__(self, encoder: Encoder, decoder: Decoder, src_embed: nn.Module, tgt_embed: nn.Module,
                 generator: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: Optional[torch.Tensor] = None,
                tgt_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: torch.Tensor, src_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory: torch.Tensor, src_mask: Optional[torch.Tensor], tgt: torch.Tensor,
               tgt_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)
