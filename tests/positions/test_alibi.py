"""`'alibi'`: ALiBi's linear biases (`alibi_mha.py`), against the paper's slope rule and labml_nn's module."""
import math

import pytest
import torch
from labml.configs import BaseConfigs
from labml_nn.transformers.alibi import AlibiMultiHeadAttention as LabmlNNAlibi
from labml_nn.transformers.alibi import get_slopes

from labml_txl.positions.alibi import Alibi, alibi_slopes
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.attention.masks import subsequent_mask
from labml_txl.configs import TransformerConfigs

from tolerance import assert_close_rounding, assert_same_function


def _paper_slopes(n: int):
    """The rule of the paper's code: a geometric sequence starting at and with ratio $2^{-8/n}$ for a power of two;
    else the largest power of two's, then every other slope of twice as many heads."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _paper_slopes(2 * closest)[0::2][:n - closest]


def _ratio(actual, expected):
    """`actual / expected` elementwise, in float64: slopes compared relatively (they run from 2^-0.5 to 2^-8)."""
    return torch.tensor(actual, dtype=torch.float64) / torch.tensor(expected, dtype=torch.float64)


@pytest.mark.parametrize('heads', [8, 12, 16, 1, 2, 6])
def test_slopes_are_the_papers(heads):
    ones = torch.ones(heads, dtype=torch.float64)
    # Rule 1: Python floats (float64) both, relative
    assert_same_function(_ratio(alibi_slopes(heads), _paper_slopes(heads)), ones)
    # Rule 2 (labml_nn computes them in float32): m_0 rounded to float32, then raised to an exponent of at most
    # `heads` (which multiplies that rounding) and rounded once more: relative depth heads + 1
    assert_close_rounding(_ratio(get_slopes(heads).tolist(), alibi_slopes(heads)), ones, depth=heads + 1,
                          magnitude=1.0, dtype=torch.float32)
    if heads == 8:
        assert_same_function(_ratio(alibi_slopes(8), [2 ** -h for h in range(1, 9)]), ones)


def test_alibi_attention_equals_labml_nns_with_the_same_weights():
    torch.manual_seed(0)
    ours = MultiHeadAttention(4, 16, dropout_prob=0.0, positions=Alibi()).eval()
    theirs = LabmlNNAlibi(4, 16, dropout_prob=0.0).eval()
    with torch.no_grad():
        for name in ('query', 'key', 'value'):
            getattr(theirs, name).linear.weight.copy_(getattr(ours, name).weight)
            getattr(theirs, name).linear.bias.copy_(getattr(ours, name).bias)
        theirs.output.weight.copy_(ours.output.weight)
        theirs.output.bias.copy_(ours.output.bias)
    x = torch.randn(9, 3, 16)
    mask = subsequent_mask(9)
    with torch.no_grad():
        # Rule 2 (labml_nn's slopes are float32): the projections over d_model 16, q.k over d_k 4, the slope's
        # relative rounding (heads + 1, as above) and its product with the distance, the softmax and the weighted
        # sum over 9 keys, the output projection over 16
        assert_close_rounding(ours(query=x, key=x, value=x, mask=mask), theirs(query=x, key=x, value=x, mask=mask),
                              depth=16 + 4 + (4 + 1) + 1 + 9 + 9 + 16)


def test_alibi_scores_are_the_dot_product_less_the_scaled_distance():
    """With the queries the last 2 of 5 positions: $q_i^\\top k_j - m_h |i - j| \\sqrt{d_k}$ before the scale."""
    attn = MultiHeadAttention(2, 8, positions=Alibi()).double()
    q, k = torch.randn(2, 1, 2, 4, dtype=torch.float64), torch.randn(5, 1, 2, 4, dtype=torch.float64)
    scores = attn.get_scores(q, k)
    expected = torch.empty(2, 5, 1, 2, dtype=torch.float64)
    for i in range(2):
        for j in range(5):
            for h in range(2):
                expected[i, j, 0, h] = float(q[i, 0, h] @ k[j, 0, h]) - alibi_slopes(2)[h] * abs(3 + i - j) * 2.0
    # Rule 1: float64 both
    assert_same_function(scores, expected)


class _Configs(BaseConfigs):
    transformer: TransformerConfigs


def test_the_alibi_option_of_the_configs_and_its_warning(labml_experiment):
    conf = _Configs()
    labml_experiment.configs(conf, {'transformer.decoder_attn': 'alibi', 'transformer.d_model': 16,
                                    'transformer.n_heads': 2})
    with pytest.warns(UserWarning, match="decoder_attn='alibi' with tgt_embed='fixed_pos' adds positions twice"):
        assert type(conf.transformer.decoder_attn.positions) is Alibi
