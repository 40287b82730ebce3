"""Embeddings, positional encodings and layers against their formulas."""
import math

import pytest
import torch

from labml_txl.attention.masks import subsequent_mask
from labml_txl.configs import TransformerConfigs
from labml_txl.transformer.models import EmbeddingsWithLearnedPositionalEncoding, EmbeddingsWithPositionalEncoding
from labml_txl.positions.encoding import get_positional_encoding
from tolerance import assert_close_rounding, assert_same_function


def test_sinusoidal_table_matches_the_papers_formula():
    table = get_positional_encoding(6, max_len=9)
    assert table.shape == (9, 1, 6) and table.dtype == torch.float32
    expected = torch.zeros(9, 6, dtype=torch.float64)
    for p in range(9):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            expected[p, 2 * i], expected[p, 2 * i + 1] = math.sin(angle), math.cos(angle)
    # The table is float32 (tolerance.py's rule 2): four roundings on the way to each value (the frequency's exponent,
    # its exp, position times frequency, the sine), which the sine carries as the error of its angle: of size up
    # to 8 (position 8 at frequency 1)
    assert_close_rounding(table[:, 0], expected, depth=4, magnitude=8)


@pytest.mark.parametrize('d_model', [7, 0, -2])
def test_sinusoidal_table_rejects_odd_or_non_positive_d_model(d_model):
    with pytest.raises(ValueError, match=rf"d_model={d_model} is not accepted.*positive even integer"):
        get_positional_encoding(d_model)


def test_fixed_embeddings_scale_tokens_and_add_positions():
    embed = EmbeddingsWithPositionalEncoding(8, 13, max_len=20).double()
    tokens = torch.randint(13, (5, 2))
    expected = embed.linear.weight[tokens] * math.sqrt(8) + get_positional_encoding(8, 20)[:5].double()
    assert_same_function(embed(tokens), expected)


def test_learned_positions_are_parameters_that_train():
    embed = EmbeddingsWithLearnedPositionalEncoding(8, 13, max_len=20)
    embed(torch.randint(13, (5, 2))).sum().backward()
    # Only the five positions used get a gradient
    assert embed.positional_encodings.grad[:5].abs().sum() > 0
    assert embed.positional_encodings.grad[5:].abs().sum() == 0


def test_sequence_longer_than_max_len_names_the_limit():
    embed = EmbeddingsWithPositionalEncoding(8, 13, max_len=4)
    with pytest.raises(ValueError, match=r"length 5 is not accepted.*max_len=4"):
        embed(torch.zeros(5, 1, dtype=torch.long))


def test_pre_norm_decoder_layer_is_the_residual_formula(labml_experiment):
    conf = TransformerConfigs()
    labml_experiment.configs(conf, {'d_model': 8, 'n_heads': 2, 'dropout': 0.0, 'ffn.d_ff': 16})
    layer = conf.decoder_layer.eval().double()
    x, memory = torch.randn(4, 3, 8).double(), torch.randn(6, 3, 8).double()
    mask = subsequent_mask(4)
    # $x + f(LN(x))$ for self-attention, attention to the memory, and feed-forward in turn
    z = layer.norm_self_attn(x)
    h = x + layer.self_attn(query=z, key=z, value=z, mask=mask)
    z = layer.norm_src_attn(h)
    h = h + layer.src_attn(query=z, key=memory, value=memory, mask=None)
    expected = h + layer.feed_forward(layer.norm_ff(h))
    assert_same_function(layer(x=x, mask=mask, src=memory), expected)
    # Future tokens do not change earlier outputs
    changed = x.clone()
    changed[-1] += 1.0
    assert_same_function(layer(x=changed, mask=mask, src=memory)[:-1], expected[:-1])
