"""
The `norm` item: LayerNorm or RMSNorm (Zhang & Sennrich, 2019) in the vanilla parts (`TransformerConfigs`) and in
Transformer-XL (`TransformerXLConfigs`, `MemTransformerLM(norm=...)`).
"""
import pytest
import torch
from labml.configs import BaseConfigs
from torch import nn

from labml_txl.fast import dispatch
from labml_txl.configs.validation import ConfigOptionError
from labml_txl.configs import TransformerConfigs, TransformerXLConfigs
from labml_txl.transformer.interop import from_torch, to_torch
from labml_txl.transformer.norms import make_norm
from labml_txl.xl import MemTransformerLM

from tolerance import assert_same_function
from xl.helpers import small_config


def test_rms_norm_is_its_formula():
    r"""$g \odot x / \sqrt{\frac{1}{d}\sum_i x_i^2 + \epsilon}$, computed here element by element in float64."""
    norm = make_norm('rms_norm', 6, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 6))
    x = torch.randn(4, 3, 6, dtype=torch.float64) * 3
    expected = torch.empty_like(x)
    for index in range(4 * 3):
        row = x.view(-1, 6)[index]
        rms = (sum(float(v) ** 2 for v in row) / 6 + 1e-5) ** 0.5
        expected.view(-1, 6)[index] = torch.tensor([float(v) / rms for v in row], dtype=torch.float64) * norm.weight
    # Rule 1: float64 both
    assert_same_function(norm(x), expected)
    # No re-centring and no bias: RMSNorm of x + c is not that of x
    assert not hasattr(norm, 'bias') or norm.bias is None
    assert not torch.allclose(norm(x + 1.0), norm(x))


def test_an_unknown_norm_is_refused_naming_the_accepted_ones():
    for make in (lambda: make_norm('batch_norm', 4), lambda: MemTransformerLM(**small_config(), norm='RMSNorm')):
        with pytest.raises(ValueError, match=r"norm='.*' is not accepted: 'layer_norm' .* or 'rms_norm'"):
            make()


class _EncoderConfigs(BaseConfigs):
    transformer: TransformerConfigs


@pytest.mark.parametrize('norm, norm_class', [('layer_norm', nn.LayerNorm), ('rms_norm', nn.RMSNorm)])
def test_the_norm_item_reaches_every_norm_of_the_vanilla_parts(labml_experiment, norm, norm_class):
    conf = _EncoderConfigs()
    overrides = {'transformer.d_model': 8, 'transformer.n_heads': 2, 'transformer.n_layers': 2,
                 'transformer.norm_first': False}
    if norm != 'layer_norm':
        overrides['transformer.norm'] = norm
    labml_experiment.configs(conf, overrides)
    # (in float64: the composition below is the same function as the layer, rule 1)
    encoder, decoder = conf.transformer.encoder.double().eval(), conf.transformer.decoder.double().eval()
    norms = [m for m in list(encoder.modules()) + list(decoder.modules()) if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    # Two per encoder layer, three per decoder layer, and each stack's final norm
    assert len(norms) == 2 * 2 + 2 * 3 + 2 and all(type(n) is norm_class for n in norms)
    # Post-norm, sub-layer by sub-layer, with the layer's own norms
    layer, x = encoder.layers[0], torch.randn(3, 2, 8, dtype=torch.float64)
    h = layer.norm_self_attn(x + layer.self_attn(query=x, key=x, value=x, mask=None))
    assert_same_function(layer(x=x), layer.norm_ff(h + layer.feed_forward(h)))


def test_to_torch_refuses_rms_norm_with_a_message():
    model = from_torch(nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                      dim_feedforward=16))
    model.encoder.layers[0].norm_ff = make_norm('rms_norm', 8)
    with pytest.raises(ValueError, match=r"encoder.layers.0.norm_ff is an RMSNorm: nn.Transformer has LayerNorms only"):
        to_torch(model)


@pytest.mark.parametrize('attn_type', [0, 1, 2, 3])
@pytest.mark.parametrize('pre_lnorm', [False, True])
def test_transformer_xl_with_rms_norm_in_every_layer(attn_type, pre_lnorm):
    """Every norm of every layer is an RMSNorm (kept as `layer_norm`, with no bias); the fast path equals the reference
    over segments with memories, and the layer-norm kernel is refused for it with the reason."""
    torch.manual_seed(0)
    config = small_config(attn_type=attn_type, pre_lnorm=pre_lnorm, norm='rms_norm')
    reference = MemTransformerLM(**config, impl='reference').double()
    auto = MemTransformerLM(**config).double()
    auto.load_state_dict(reference.state_dict())
    for layer in auto.layers:
        assert type(layer.dec_attn.layer_norm) is nn.RMSNorm and type(layer.pos_ff.layer_norm) is nn.RMSNorm
    assert not any(name.endswith('layer_norm.bias') for name in auto.state_dict())
    # The original's initialisation of norm gains, N(1, init_std^2), reaches RMSNorm too
    gains = torch.cat([layer.pos_ff.layer_norm.weight for layer in auto.layers])
    assert not torch.equal(gains, torch.ones_like(gains)) and (gains - 1).abs().max() < 0.2
    data = torch.randint(40, (5, 3))
    mems_r, mems_a = [], []
    with torch.no_grad(), dispatch.recording() as choices:
        for _ in range(3):
            loss_r, *mems_r = reference.eval()(data, data, *mems_r)
            loss_a, *mems_a = auto.eval()(data, data, *mems_a)
            # Rule 1: float64 both
            assert_same_function(loss_a, loss_r)
    norms = {c.chosen: c for c in choices if c.operation == 'residual layer norm'}
    if not pre_lnorm:
        assert set(norms) == {'PyTorch'}
        assert any('a RMSNorm: the kernel computes LayerNorm' in str(c) for c in choices)


def test_the_xl_norm_item_builds_the_model_with_it(labml_experiment):
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'n_token': 20, 'n_layer': 2, 'n_head': 2, 'd_model': 8, 'd_head': 4,
                                    'd_inner': 16, 'norm': 'rms_norm'})
    model = conf.model
    assert model.norm == 'rms_norm' and type(model.layers[1].pos_ff.layer_norm) is nn.RMSNorm
    # The default is the original's
    assert TransformerXLConfigs().norm == 'layer_norm' and MemTransformerLM(**small_config()).norm == 'layer_norm'


def test_an_unknown_norm_in_the_configs_names_the_options(labml_experiment):
    conf = _EncoderConfigs()
    labml_experiment.configs(conf, {'transformer.norm': 'rmsnorm'})
    with pytest.raises(ConfigOptionError, match=r"norm='rmsnorm' is not an option.*Did you mean 'rms_norm'"
                                                r".*Accepted: 'layer_norm' or 'rms_norm'"):
        _ = conf.transformer.encoder
