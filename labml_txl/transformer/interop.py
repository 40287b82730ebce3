r"""
# Interoperability with `torch.nn.Transformer`

`from_torch(t)` copies every weight of a `torch.nn.Transformer` into this package's modules and returns a
`TorchLayoutTransformer`, which is called like `t` (same argument order, `batch_first` respected) but takes
masks in this package's convention: boolean `[seq_q, seq_k, batch or 1]`, True where attention is allowed, so
that a key-padding mask is a mask with a batch axis. `to_torch(m)` goes back.

`torch.nn.MultiheadAttention` packs the query, key and value projections into one `in_proj_weight`
$[W_Q; W_K; W_V]$ of shape `[3 d_model, d_model]`; ours keeps three `nn.Linear`s, so the copy splits it in thirds.
"""
from typing import Optional

import torch
from torch import nn

from .feed_forward import FeedForward
from .mha import MultiHeadAttention
from .models import Decoder, Encoder, TransformerLayer

_ACTIVATIONS = {'relu': nn.ReLU, 'gelu': nn.GELU}


class TorchLayoutTransformer(nn.Module):
    """
    An encoder-decoder with `torch.nn.Transformer`'s call and tensor layout, built of this package's modules.

    Args:
        encoder, decoder: this package's stacks.
        batch_first: whether tensors are `[batch, seq, d_model]` (else `[seq, batch, d_model]`).

    Shape:
        `src` `[src_len, batch, d_model]` (`[batch, src_len, d_model]` when `batch_first`), `tgt` likewise;
        `src_mask` `[src_len or 1, src_len, batch or 1]`, `tgt_mask` `[tgt_len or 1, tgt_len, batch or 1]`,
        `memory_mask` `[tgt_len or 1, src_len, batch or 1]`, all boolean, True where attention is allowed.
        Output as `tgt`.
    """

    def __init__(self, encoder: Encoder, decoder: Decoder, batch_first: bool = False):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.batch_first = batch_first

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: Optional[torch.Tensor] = None,
                tgt_mask: Optional[torch.Tensor] = None, memory_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for name, x in (('src', src), ('tgt', tgt)):
            if x.dim() != 3:
                layout = '[batch, seq, d_model]' if self.batch_first else '[seq, batch, d_model]'
                raise ValueError(f"{name} of shape {list(x.shape)} is not accepted: expected {layout}")
        if self.batch_first:
            src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)
        memory = self.encoder(src, src_mask)
        out = self.decoder(tgt, memory, memory_mask, tgt_mask)
        return out.transpose(0, 1) if self.batch_first else out


def _copy_(target: torch.Tensor, source: Optional[torch.Tensor]):
    """Copy `source` into `target`; a missing source (a torch module built with `bias=False`) copies zeros."""
    with torch.no_grad():
        if source is None:
            target.zero_()
        else:
            target.copy_(source)


def _copy_norm(ours: nn.LayerNorm, theirs: nn.LayerNorm):
    _copy_(ours.weight, theirs.weight)
    _copy_(ours.bias, theirs.bias)


def _attention_from_torch(t: nn.MultiheadAttention) -> MultiHeadAttention:
    if not t._qkv_same_embed_dim or t.bias_k is not None or t.add_zero_attn:
        raise ValueError("from_torch accepts nn.MultiheadAttention with kdim = vdim = embed_dim, no bias_k/bias_v "
                         "and add_zero_attn=False, as nn.Transformer builds it")
    m = MultiHeadAttention(t.num_heads, t.embed_dim, dropout_prob=t.dropout, bias=True)
    d = t.embed_dim
    projections = (m.query, m.key, m.value)
    for i, linear in enumerate(projections):
        # $W_Q, W_K, W_V$ are the thirds of `in_proj_weight`
        _copy_(linear.weight, t.in_proj_weight[i * d:(i + 1) * d])
        _copy_(linear.bias, None if t.in_proj_bias is None else t.in_proj_bias[i * d:(i + 1) * d])
    _copy_(m.output.weight, t.out_proj.weight)
    _copy_(m.output.bias, t.out_proj.bias)
    return m


def _attention_to_torch(m: MultiHeadAttention, t: nn.MultiheadAttention):
    d = m.d_model
    projections = (m.query, m.key, m.value)
    for i, linear in enumerate(projections):
        _copy_(t.in_proj_weight[i * d:(i + 1) * d], linear.weight)
        _copy_(t.in_proj_bias[i * d:(i + 1) * d], linear.bias)
    _copy_(t.out_proj.weight, m.output.weight)
    _copy_(t.out_proj.bias, m.output.bias)


def _activation_name(layer) -> str:
    # nn.TransformerEncoderLayer/DecoderLayer keep the activation as a function or a module
    activation = layer.activation
    for name, module_class in _ACTIVATIONS.items():
        if activation is getattr(torch.nn.functional, name) or isinstance(activation, module_class):
            return name
    raise ValueError(f"activation={activation!r} is not accepted: from_torch converts 'relu' and 'gelu'")


def _layer_from_torch(t, is_decoder: bool) -> TransformerLayer:
    ffn = FeedForward(t.linear1.in_features, t.linear1.out_features, dropout=t.dropout.p,
                      activation=_ACTIVATIONS[_activation_name(t)]())
    _copy_(ffn.layer1.weight, t.linear1.weight)
    _copy_(ffn.layer1.bias, t.linear1.bias)
    _copy_(ffn.layer2.weight, t.linear2.weight)
    _copy_(ffn.layer2.bias, t.linear2.bias)
    layer = TransformerLayer(d_model=t.linear1.in_features,
                             self_attn=_attention_from_torch(t.self_attn),
                             src_attn=_attention_from_torch(t.multihead_attn) if is_decoder else None,
                             feed_forward=ffn, dropout_prob=t.dropout1.p, norm_first=t.norm_first,
                             layer_norm_eps=t.norm1.eps)
    # torch names the norms by order: self-attention, (cross-attention,) feed-forward
    norms = [layer.norm_self_attn, layer.norm_src_attn, layer.norm_ff] if is_decoder \
        else [layer.norm_self_attn, layer.norm_ff]
    for i, ours in enumerate(norms):
        _copy_norm(ours, getattr(t, f'norm{i + 1}'))
    return layer


def _stack_from_torch(t_stack, stack_class, is_decoder: bool):
    layers = [_layer_from_torch(t_layer, is_decoder) for t_layer in t_stack.layers]
    final_norm = t_stack.norm is not None
    eps = t_stack.norm.eps if final_norm else 1e-5
    stack = stack_class(layers[0], len(layers), final_norm=final_norm, layer_norm_eps=eps)
    # `stack_class` made copies of the first layer; put each converted layer in its place
    stack.layers = nn.ModuleList(layers)
    if final_norm:
        _copy_norm(stack.norm, t_stack.norm)
    return stack


def from_torch(t: nn.Transformer) -> TorchLayoutTransformer:
    """
    This package's encoder-decoder with every weight of `t` copied (layer norms and their $\\epsilon$ included).

    Its output equals `t`'s for the same inputs, with masks given in this package's convention.
    """
    if not isinstance(t, nn.Transformer):
        raise TypeError(f"from_torch accepts a torch.nn.Transformer, got {type(t).__name__}")
    encoder = _stack_from_torch(t.encoder, Encoder, is_decoder=False)
    decoder = _stack_from_torch(t.decoder, Decoder, is_decoder=True)
    return TorchLayoutTransformer(encoder, decoder, batch_first=t.batch_first).to(t.encoder.layers[0].linear1.weight)


def _check_convertible(m: TorchLayoutTransformer):
    for name, module in m.named_modules():
        if isinstance(module, nn.RMSNorm):
            raise ValueError(f"{name} is an RMSNorm: nn.Transformer has LayerNorms only, so a model built with "
                             f"norm='rms_norm' cannot be converted (build it with norm='layer_norm')")
    for stack_name, stack in (('encoder', m.encoder), ('decoder', m.decoder)):
        if not isinstance(stack.norm, nn.LayerNorm):
            raise ValueError(f"to_torch needs a final norm on the {stack_name}: nn.Transformer always has one")
        for i, layer in enumerate(stack.layers):
            attentions = [layer.self_attn] + ([layer.src_attn] if layer.src_attn is not None else [])
            if not all(type(a) is MultiHeadAttention for a in attentions):
                raise ValueError(f"{stack_name}.layers[{i}] has attention of type "
                                 f"{[type(a).__name__ for a in attentions]}; to_torch converts MultiHeadAttention")
            ffn = layer.feed_forward
            if not isinstance(ffn, FeedForward) or ffn.is_gated or ffn.layer1.bias is None or ffn.layer2.bias is None:
                raise ValueError(f"{stack_name}.layers[{i}].feed_forward is not convertible: nn.Transformer has an "
                                 f"ungated feed-forward with both biases")
            if not isinstance(ffn.activation, tuple(_ACTIVATIONS.values())):
                raise ValueError(f"{stack_name}.layers[{i}] has activation {ffn.activation!r}; "
                                 f"to_torch converts nn.ReLU and nn.GELU")


def to_torch(m: TorchLayoutTransformer) -> nn.Transformer:
    """A `torch.nn.Transformer` with every weight of `m` copied; the inverse of `from_torch`."""
    if not isinstance(m, TorchLayoutTransformer):
        raise TypeError(f"to_torch accepts a TorchLayoutTransformer (what from_torch returns), got {type(m).__name__}")
    _check_convertible(m)
    first = m.encoder.layers[0]
    attention, ffn = first.self_attn, first.feed_forward
    activation = next(name for name, cls in _ACTIVATIONS.items() if isinstance(ffn.activation, cls))
    t = nn.Transformer(d_model=first.size, nhead=attention.heads, num_encoder_layers=len(m.encoder.layers),
                       num_decoder_layers=len(m.decoder.layers), dim_feedforward=ffn.layer1.out_features,
                       dropout=first.dropout.p, activation=activation, layer_norm_eps=first.norm_ff.eps,
                       batch_first=m.batch_first, norm_first=first.norm_first)
    t = t.to(ffn.layer1.weight)
    for t_stack, stack, is_decoder in ((t.encoder, m.encoder, False), (t.decoder, m.decoder, True)):
        for t_layer, layer in zip(t_stack.layers, stack.layers):
            _attention_to_torch(layer.self_attn, t_layer.self_attn)
            if is_decoder:
                _attention_to_torch(layer.src_attn, t_layer.multihead_attn)
            for ours, theirs in ((layer.feed_forward.layer1, t_layer.linear1), (layer.feed_forward.layer2, t_layer.linear2)):
                _copy_(theirs.weight, ours.weight)
                _copy_(theirs.bias, ours.bias)
            norms = [layer.norm_self_attn, layer.norm_src_attn, layer.norm_ff] if is_decoder \
                else [layer.norm_self_attn, layer.norm_ff]
            for i, ours in enumerate(norms):
                _copy_norm(getattr(t_layer, f'norm{i + 1}'), ours)
        _copy_norm(t_stack.norm, stack.norm)
    return t
