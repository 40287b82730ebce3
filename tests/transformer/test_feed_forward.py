"""FeedForward and its GLU variants against the formulas written out by hand."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from labml_txl.configs import FeedForwardConfigs
from labml_txl.transformer.feed_forward import FeedForward


def test_plain_ffn_is_two_linears_around_the_activation():
    ffn = FeedForward(8, 16, dropout=0.0, activation=nn.GELU()).eval()
    x = torch.randn(5, 3, 8)
    # $GELU(x W_1^T + b_1) W_2^T + b_2$
    expected = F.gelu(x @ ffn.layer1.weight.T + ffn.layer1.bias) @ ffn.layer2.weight.T + ffn.layer2.bias
    torch.testing.assert_close(ffn(x), expected)


GLU_VARIANTS = {
    'GLU': torch.sigmoid,
    'Bilinear': lambda z: z,
    'ReGLU': F.relu,
    'GEGLU': F.gelu,
    'SwiGLU': lambda z: z * torch.sigmoid(z),
}


@pytest.mark.parametrize('variant', sorted(GLU_VARIANTS))
def test_glu_variant_from_configs_computes_the_papers_formula(variant, labml_experiment):
    conf = FeedForwardConfigs()
    labml_experiment.configs(conf, {'glu_variant': variant, 'd_model': 6, 'd_ff': 10, 'dropout': 0.0})
    ffn = conf.ffn.eval()
    # The paper drops every bias
    assert ffn.is_gated
    assert ffn.layer1.bias is None and ffn.layer2.bias is None and ffn.linear_v.bias is None
    x = torch.randn(4, 2, 6)
    # $(f(x W_1) \otimes x V) W_2$
    expected = (GLU_VARIANTS[variant](x @ ffn.layer1.weight.T) * (x @ ffn.linear_v.weight.T)) @ ffn.layer2.weight.T
    torch.testing.assert_close(ffn(x), expected)


@pytest.mark.parametrize('name,function', [('ReLU', F.relu), ('GELU', F.gelu), ('SiLU', F.silu)])
def test_activation_options(name, function, labml_experiment):
    conf = FeedForwardConfigs()
    labml_experiment.configs(conf, {'activation': name, 'd_model': 4, 'd_ff': 8})
    z = torch.randn(20)
    torch.testing.assert_close(conf.ffn.activation(z), function(z))
    assert not conf.ffn.is_gated and conf.ffn.layer1.bias is not None
