"""
The compressive memory's compression functions and attention-reconstruction loss (`memories/compression.py`), against
labml_nn 0.5.1's `transformers.compressive` with the same weights (`Conv1dCompression`, `AttentionReconstructionLoss`)
and against naive loops over the positions, in float64.
"""
import pytest
import torch
from labml_nn.transformers.compressive import (AttentionReconstructionLoss, CompressiveTransformerLayer,
                                               Conv1dCompression)
from labml_nn.transformers.feed_forward import FeedForward
from labml_nn.transformers.xl.relative_mha import RelativeMultiHeadAttention

from labml_txl.positions.relative import Relative
from labml_txl.xl.attention import XLAttention
from labml_txl.memories.compression import (ConvCompression, PoolCompression, attention_reconstruction_loss,
                                      content_attention, make_compression)

from tolerance import assert_same_function

D_MODEL, HEADS, RATE = 8, 2, 3


def _memory(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n * RATE, 2, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_conv_compression_is_labml_nns_with_the_same_weights():
    ours = ConvCompression(D_MODEL, RATE).double()
    theirs = Conv1dCompression(RATE, D_MODEL).double()
    theirs.load_state_dict(ours.state_dict())
    memory = _memory(4)
    assert ours(memory).shape == (4, 2, D_MODEL)
    assert_same_function(ours(memory), theirs(memory))


@pytest.mark.parametrize('kind', ['max', 'mean'])
def test_pooling_takes_each_group_of_rate_positions(kind):
    memory = _memory(4)
    pooled = PoolCompression(RATE, kind)(memory)
    for k in range(4):
        group = memory[k * RATE:(k + 1) * RATE]
        expected = group.max(dim=0).values if kind == 'max' else group.sum(dim=0) / RATE
        assert_same_function(pooled[k], expected)


def test_bad_names_rates_and_lengths_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="compression='avg' is not accepted: one of 'conv', 'max_pool', 'mean_pool'"):
        make_compression('avg', D_MODEL, RATE)
    with pytest.raises(ValueError, match='compression_rate'):
        make_compression('conv', D_MODEL, 0)
    with pytest.raises(ValueError, match=r'expected \[n \* compression_rate, batch, d_model\] with compression_rate=3'):
        make_compression('mean_pool', D_MODEL, RATE)(torch.randn(4, 2, D_MODEL))


def _both_layers():
    """labml_nn's pre-LN compressive layer and our pre-LN `XLAttention` holding its $W_q$, $W_k$, $W_v$ and layer norm
    (random, float64), with one convolution's weights in both compressions."""
    torch.manual_seed(0)
    theirs = CompressiveTransformerLayer(
        d_model=D_MODEL, self_attn=RelativeMultiHeadAttention(HEADS, D_MODEL, 0.0),
        feed_forward=FeedForward(D_MODEL, 16, 0.0), dropout_prob=0.0,
        compress=Conv1dCompression(RATE, D_MODEL)).double()
    with torch.no_grad():
        for p in theirs.norm_self_attn.parameters():
            p.copy_(torch.randn_like(p))
    attn = XLAttention(HEADS, D_MODEL, D_MODEL // HEADS, 0.0, pre_lnorm=True, positions=Relative()).double()
    heads = theirs.self_attn
    with torch.no_grad():
        attn.qkv_net.weight.copy_(torch.cat([heads.query.linear.weight, heads.key.linear.weight,
                                             heads.value.linear.weight]))
        attn.layer_norm.load_state_dict(theirs.norm_self_attn.state_dict())
    compress = ConvCompression(D_MODEL, RATE).double()
    compress.load_state_dict(theirs.compress.state_dict())
    return theirs, attn, compress


def test_reconstruction_loss_is_labml_nns_and_trains_the_compression_only():
    theirs, attn, compress = _both_layers()
    queries = torch.randn(5, 2, D_MODEL, dtype=torch.float64, requires_grad=True)
    old = _memory(4).requires_grad_()
    ours = attention_reconstruction_loss(attn, compress, queries, old)
    expected = AttentionReconstructionLoss(torch.nn.ModuleList([theirs])).calc_loss(theirs, queries, old)
    assert_same_function(ours, expected)
    ours.backward()
    expected.backward()
    for mine, their in zip(compress.parameters(), theirs.compress.parameters()):
        assert mine.grad is not None and mine.grad.abs().sum() > 0
        assert_same_function(mine.grad, their.grad)
    # The gradient is stopped into the attention, its layer norm, the queries and the old memories
    assert all(p.grad is None for p in attn.parameters()) and queries.grad is None and old.grad is None


def test_content_attention_is_a_softmax_over_the_memory_alone():
    """Against a loop over queries and heads, post-LN (no layer norm on the way in)."""
    attn = XLAttention(HEADS, D_MODEL, 4, 0.0, positions=Relative()).double()
    queries, memory = torch.randn(3, 2, D_MODEL, dtype=torch.float64), _memory(2)
    out, = content_attention(attn, queries, memory)
    w_q, w_k, w_v = attn.qkv_net.weight.split(HEADS * 4)
    for i in range(3):
        for b in range(2):
            for h in range(HEADS):
                heads = slice(4 * h, 4 * (h + 1))
                q = w_q[heads] @ queries[i, b]
                keys, values = memory[:, b] @ w_k[heads].T, memory[:, b] @ w_v[heads].T
                weights = torch.softmax(keys @ q / 2.0, dim=0)
                assert_same_function(out[i, b, h], weights @ values)
