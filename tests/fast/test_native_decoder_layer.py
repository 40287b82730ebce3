"""
The decoder-layer kernel (`labml_txl/fast/native/decoder_layer.cpp`) on its own: one Transformer-XL layer for a few rows,
against the same layer in PyTorch (`F.linear`, `F.layer_norm` and the specification's attention), with the
memory's keys and values where a model keeps them (windows of a larger buffer) and every position term.
"""
import pytest
import torch
from torch.nn import functional as F

from labml_txl.fast.native import decoder_layer as native_decoder_layer
from labml_txl.fast.native.attention import _reference as _reference_attention
from labml_txl.fast.native.decoder_layer import LayerArguments

from tolerance import assert_close_rounding


def _reference(x: torch.Tensor, qlen: int, layer: LayerArguments) -> torch.Tensor:
    """The layer in PyTorch (`F.linear`, `F.layer_norm` and the specification's attention), the naive computation the
    kernel is held to."""
    rows, d = x.shape
    bsz, inner = rows // qlen, layer.o_weight.shape[1]

    def norm(t, parameters):
        return F.layer_norm(t, (d,), *parameters)

    q, k, v = F.linear(norm(x, layer.norm1) if layer.pre_lnorm else x, layer.qkv_weight).view(
        qlen, bsz, 3, layer.heads, inner // layer.heads).permute(2, 1, 3, 0, 4)
    if layer.k_memory is not None:
        k, v = torch.cat([layer.k_memory, k], 2), torch.cat([layer.v_memory, v], 2)
    attention = _reference_attention(q, k, v, layer.table, layer.content_bias, layer.position_bias,
                                     layer.entry_bias, layer.scale, layer.window).reshape(rows, inner)
    h = x + F.linear(attention, layer.o_weight)
    h = h if layer.pre_lnorm else norm(h, layer.norm1)
    hidden = torch.relu(F.linear(norm(h, layer.norm2) if layer.pre_lnorm else h, layer.w1, layer.b1))
    out = h + F.linear(hidden, layer.w2, layer.b2)
    return out if layer.pre_lnorm else norm(out, layer.norm2)


def _layer(qlen=2, bsz=3, heads=2, d_head=4, d=8, d_inner=12, mlen=6, pre_lnorm=False, memory=True, entry_bias=True,
           window=None, seed=0):
    """A layer's arguments and an input `[qlen * bsz, d]`."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    klen = mlen + qlen if memory else qlen
    # The memory's keys and values as the model keeps them: a window of an append buffer `[2, bsz, heads, room,
    # d_head]`, so their rows are strided
    buffer = randn(2, bsz, heads, mlen + 5, d_head)
    k_memory, v_memory = buffer[:, :, :, 3:3 + mlen].unbind(0) if memory else (None, None)
    # Attention type 1's per-entry bias is a transposed view, `[heads, klen]` with a stride of `heads`
    entry = randn(klen + 2, heads)[-klen:].t() if entry_bias else None
    norm = lambda: (1 + randn(d) / 4, randn(d), 1e-5)  # noqa: E731
    layer = LayerArguments(heads, pre_lnorm, randn(3 * heads * d_head, d), randn(d, heads * d_head),
                           randn(d_inner, d), randn(d_inner), randn(d, d_inner), randn(d), norm(), norm(), k_memory,
                           v_memory, randn(heads, klen, d_head), randn(heads, d_head), randn(heads, d_head), entry,
                           0.3, klen if window is None else window)
    return randn(qlen * bsz, d), layer


def _double(layer):
    """The layer's arguments in float64, for the exact computation to compare the float32 kernel with."""
    def double(t):
        return None if t is None else t.double()

    return layer._replace(**{name: double(getattr(layer, name)) for name in (
        'qkv_weight', 'o_weight', 'w1', 'b1', 'w2', 'b2', 'k_memory', 'v_memory', 'table', 'content_bias',
        'position_bias', 'entry_bias')}, norm1=(*map(double, layer.norm1[:2]), layer.norm1[2]),
                          norm2=(*map(double, layer.norm2[:2]), layer.norm2[2]))


def _depths(x, layer):
    """Rule 2's depths (`tolerance.py`) of the layer's projections and of its output: the projections read `x` or,
    pre-LN, its layer norm (mean and variance, d_model each, and the affine step's two roundings), a sum over
    d_model; the output adds the attention (a score's d_head products and its terms' two additions, the softmax's
    normaliser and the weighted sum over klen keys), the output projection (heads * d_head), the feed-forward
    network (d_model, d_inner), two residual additions and the other norm."""
    d, d_head = x.shape[1], layer.table.shape[-1]
    klen = layer.table.shape[1]
    norm = 2 * d + 2
    qkv = norm + d
    return qkv, qkv + d_head + 2 + 2 * klen + layer.o_weight.shape[1] + d + layer.w1.shape[0] + 2 + norm


def _assert_the_kernels_layer(x, qlen, layer, out, qkv):
    """The kernel's output and projections (float32) against the same layer in float64."""
    qkv_depth, out_depth = _depths(x, layer)
    exact = _double(layer)
    assert_close_rounding(out, _reference(x.double(), qlen, exact), depth=out_depth)
    projected = torch.nn.functional.layer_norm(x.double(), (x.shape[1],), *exact.norm1) if layer.pre_lnorm \
        else x.double()
    assert_close_rounding(qkv, projected @ exact.qkv_weight.T, depth=qkv_depth)


@pytest.fixture(autouse=True)
def _kernel():
    assert native_decoder_layer.kernel_available(), 'the decoder-layer kernel must build here'


@pytest.mark.parametrize('pre_lnorm', [False, True], ids=['post-LN', 'pre-LN'])
@pytest.mark.parametrize('shape', [dict(qlen=1, bsz=1), dict(qlen=1, bsz=4), dict(qlen=2, bsz=3),
                                   dict(qlen=4, bsz=4), dict(qlen=3, bsz=2, memory=False),
                                   dict(qlen=2, bsz=2, window=4), dict(qlen=1, bsz=2, entry_bias=False)],
                         ids=['1x1', '1x4', '2x3', '4x4-16-rows', 'no-memory', 'same_length-window', 'no-entry-bias'])
def test_the_kernel_computes_the_layer(shape, pre_lnorm):
    x, layer = _layer(pre_lnorm=pre_lnorm, **shape)
    (out,), (qkv,) = native_decoder_layer.decoder_layers(x, shape['qlen'], [layer])
    _assert_the_kernels_layer(x, shape['qlen'], layer, out, qkv)


def test_each_layer_takes_the_last_ones_output():
    """Three layers (post-LN, pre-LN, post-LN) of one call, each with its own memory: outputs and projections."""
    x, first = _layer(seed=1)
    layers = [first, _layer(seed=2, pre_lnorm=True)[1], _layer(seed=3, memory=False, entry_bias=False)[1]]
    outputs, projections = native_decoder_layer.decoder_layers(x, 2, layers)
    for layer, out, qkv in zip(layers, outputs, projections):
        # (each layer from the kernel's output of the last: one layer's rounding)
        _assert_the_kernels_layer(x, 2, layer, out, qkv)
        x = out


def test_inputs_it_cannot_read_are_refused_with_what_it_takes():
    x, layer = _layer()
    with pytest.raises(RuntimeError, match=r'x must be \[qlen \* bsz, d_model\]'):
        native_decoder_layer.decoder_layers(x[:5], 2, [layer])
    with pytest.raises(RuntimeError, match='qkv_weight must be'):
        native_decoder_layer.decoder_layers(x, 2, [layer._replace(qkv_weight=layer.qkv_weight[:-1])])
    with pytest.raises(RuntimeError, match="every layer's table is required"):
        native_decoder_layer.decoder_layers(x, 2, [layer._replace(table=None)])
