"""`'t5_bias'`: T5's relative position bias (`t5_bias_mha.py`): its buckets against the definition evaluated
directly, distance by distance, and the attention against a naive loop."""
import math

import pytest
import torch
from labml.configs import BaseConfigs

from labml_txl.configs import TransformerConfigs
from labml_txl.positions.t5_bias import T5Bias, relative_position_bucket
from labml_txl.transformer.mha import MultiHeadAttention

from tolerance import assert_same_function


def _bucket(n: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """The definition for one distance $n = i - j$, in plain Python."""
    offset = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            offset = num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return offset + n
    width = math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    return offset + min(max_exact + int(width), num_buckets - 1)


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('num_buckets, max_distance', [(32, 128), (8, 20)])
def test_buckets_follow_the_definition_for_every_distance(bidirectional, num_buckets, max_distance):
    distances = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    got = relative_position_bucket(distances, bidirectional, num_buckets, max_distance)
    expected = [_bucket(int(n), bidirectional, num_buckets, max_distance) for n in distances]
    assert got.tolist() == expected
    # Every bucket is used (bidirectionally but the upper half's first: distance 0 is in the lower half), and the
    # farthest distances share the last one of their direction
    every = set(range(num_buckets)) - ({num_buckets // 2} if bidirectional else set())
    assert set(expected) == every
    assert got[-1] == (num_buckets // 2 - 1 if bidirectional else num_buckets - 1)


def test_t5_bias_attention_equals_a_naive_loop():
    torch.manual_seed(0)
    attn = MultiHeadAttention(2, 8, dropout_prob=0.0, positions=T5Bias(bidirectional=False, num_buckets=6,
                                                                       max_distance=8)).double().eval()
    with torch.no_grad():
        attn.relative_attention_bias.weight.normal_()
    seq_q, seq_k, batch = 4, 11, 2
    query, key, value = (torch.randn(n, batch, 8, dtype=torch.float64) for n in (seq_q, seq_k, seq_k))
    mask = torch.ones(seq_q, seq_k, 1, dtype=torch.bool).tril(seq_k - seq_q)
    with torch.no_grad():
        out = attn(query=query, key=key, value=value, mask=mask)
        q, k, v = (p(x).view(x.shape[0], batch, 2, 4) for p, x in ((attn.query, query), (attn.key, key),
                                                                   (attn.value, value)))
        expected = torch.zeros(seq_q, batch, 2, 4, dtype=torch.float64)
        for b in range(batch):
            for h in range(2):
                for i in range(seq_q):
                    allowed = [j for j in range(seq_k) if mask[i, j, 0]]
                    position = seq_k - seq_q + i
                    bias = attn.relative_attention_bias.weight
                    scores = torch.tensor([float(q[i, b, h] @ k[j, b, h]) / 2.0
                                           + float(bias[_bucket(position - j, False, 6, 8), h])
                                           for j in allowed], dtype=torch.float64)
                    weights = torch.softmax(scores, 0)
                    expected[i, b, h] = sum(w * v[j, b, h] for w, j in zip(weights, allowed))
        expected = attn.output(expected.reshape(seq_q, batch, 8))
    # Rule 1: float64 both
    assert_same_function(out, expected)


def test_bucket_settings_are_checked():
    with pytest.raises(ValueError, match="num_buckets=2, max_distance=128 are not accepted"):
        MultiHeadAttention(2, 8, positions=T5Bias(num_buckets=2))
    with pytest.raises(ValueError, match="num_buckets=32, max_distance=4 are not accepted"):
        MultiHeadAttention(2, 8, positions=T5Bias(num_buckets=32, max_distance=4))


class _Configs(BaseConfigs):
    transformer: TransformerConfigs


def test_the_t5_bias_option_is_bidirectional_for_the_encoder_and_causal_for_the_decoder(labml_experiment):
    conf = _Configs()
    labml_experiment.configs(conf, {'transformer.encoder_attn': 't5_bias', 'transformer.decoder_attn': 't5_bias',
                                    'transformer.src_embed': 'no_pos', 'transformer.tgt_embed': 'no_pos',
                                    'transformer.t5_num_buckets': 16, 'transformer.t5_max_distance': 64,
                                    'transformer.d_model': 16, 'transformer.n_heads': 2})
    encoder_attn, decoder_attn = conf.transformer.encoder_attn, conf.transformer.decoder_attn
    assert encoder_attn.positions.bidirectional and not decoder_attn.positions.bidirectional
    assert encoder_attn.positions.num_buckets == 16 and decoder_attn.positions.max_distance == 64
