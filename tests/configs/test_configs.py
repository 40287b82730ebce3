"""TransformerConfigs: laziness, labml_nn's keys and overrides, and errors for bad overrides."""
import re

import pytest
import torch
from labml.configs import BaseConfigs
from torch import nn

import labml_txl.configs.transformer as configs_module
from labml_txl.attention.masks import subsequent_mask
from labml_txl.configs.validation import ConfigKeyError, ConfigOptionError
from labml_txl.configs import FeedForwardConfigs, TransformerConfigs

from configs_yaml import assert_matches_configs_yaml


class AutoregressiveConfigs(BaseConfigs):
    """A user's experiment configs, as labml_nn's experiments write them: only the encoder is used."""
    transformer: TransformerConfigs
    n_tokens: int = 11

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        hidden = t.encoder(t.src_embed(tokens), subsequent_mask(tokens.shape[0]))
        return t.generator(hidden)


@pytest.fixture
def construction_counts(count_calls):
    """Count constructions of each module class that TransformerConfigs can build."""
    return count_calls(configs_module, ('Encoder', 'Decoder', 'Generator', 'EncoderDecoder',
                                        'EmbeddingsWithPositionalEncoding', 'MultiHeadAttention', 'TransformerLayer',
                                        'FeedForward'))


def test_only_the_modules_used_are_built(labml_experiment, construction_counts):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.n_src_vocab': 11, 'transformer.n_tgt_vocab': 11,
                                    'transformer.d_model': 16, 'transformer.n_heads': 2,
                                    'transformer.n_layers': 2, 'transformer.ffn.d_ff': 32})
    assert construction_counts == {}, 'nothing is built before it is used'
    encoder = conf.transformer.encoder
    # One encoder from one encoder layer, built from one attention and one feed-forward; no decoder side
    assert construction_counts == {'Encoder': 1, 'TransformerLayer': 1, 'MultiHeadAttention': 1, 'FeedForward': 1}
    assert len(encoder.layers) == 2 and encoder.layers[0].src_attn is None
    computed = conf.transformer._to_json()
    for never_used in ('decoder', 'decoder_layer', 'decoder_attn', 'decoder_mem_attn', 'generator',
                       'tgt_embed', 'src_embed', 'encoder_decoder'):
        assert computed[never_used]['order'] == -1, never_used


def test_the_whole_encoder_decoder_builds_every_module(labml_experiment, construction_counts):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.n_src_vocab': 7, 'transformer.n_tgt_vocab': 9,
                                    'transformer.d_model': 8, 'transformer.n_heads': 2, 'transformer.n_layers': 1})
    model = conf.transformer.encoder_decoder
    assert construction_counts['Decoder'] == 1 and construction_counts['Generator'] == 1
    # Encoder self-attention, decoder self-attention, decoder attention to the encoder
    assert construction_counts['MultiHeadAttention'] == 3
    src, tgt = torch.randint(7, (5, 2)), torch.randint(9, (4, 2))
    out = model(src, tgt, None, subsequent_mask(4))
    assert model.generator(out).shape == (4, 2, 9)


def test_post_norm_item_reaches_the_layers(labml_experiment):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.norm_first': False, 'transformer.d_model': 8,
                                    'transformer.n_heads': 2})
    layer = conf.transformer.encoder_layer.eval()
    x = torch.randn(3, 2, 8)
    # Post-norm: $LN(x + f(x))$, sub-layer by sub-layer
    h = layer.norm_self_attn(x + layer.self_attn(query=x, key=x, value=x, mask=None))
    expected = layer.norm_ff(h + layer.feed_forward(h))
    torch.testing.assert_close(layer(x=x), expected)


def _registrations(configs: BaseConfigs):
    """Items with their defaults, and each item's options and aggregate options, read from labml's registry."""
    items = set(configs._Configs__types)
    defaults = dict(configs._Configs__defaults)
    options = {k: set(v) for k, v in configs._Configs__options.items()}
    aggregates = {k: set(v) for k, v in configs._Configs__aggregates_options.items()}
    return items, defaults, options, aggregates


@pytest.mark.parametrize('class_name', ['TransformerConfigs', 'FeedForwardConfigs'])
def test_every_item_default_and_option_of_labml_nn_is_here(class_name):
    # labml-nn is installed by `make test`; without it this test fails rather than skips
    import labml_nn.transformers.configs as labml_nn_configs
    their_items, their_defaults, their_options, their_aggregates = \
        _registrations(getattr(labml_nn_configs, class_name)())
    our_items, our_defaults, our_options, our_aggregates = _registrations(getattr(configs_module, class_name)())
    assert their_items - our_items == set(), 'items of labml_nn missing here'
    for key, default in their_defaults.items():
        assert our_defaults.get(key) == default, f'default of {key}'
    for key, names in their_options.items():
        assert names - our_options.get(key, set()) == set(), f'options of {key} missing here'
    for key, names in their_aggregates.items():
        assert names - our_aggregates.get(key, set()) == set(), f'aggregates of {key} missing here'


@pytest.mark.parametrize('glu_variant', ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU'])
def test_labml_nn_style_override_dictionaries_run(glu_variant, labml_experiment):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.ffn.glu_variant': glu_variant, 'transformer.d_model': 16,
                                    'transformer.n_heads': 4, 'transformer.n_layers': 3, 'transformer.ffn.d_ff': 24,
                                    'transformer.n_src_vocab': 11, 'transformer.n_tgt_vocab': 11})
    ffn = conf.transformer.encoder.layers[0].feed_forward
    assert ffn.layer1.out_features == 24 and ffn.is_gated == (glu_variant != 'none')
    assert len(conf.transformer.encoder.layers) == 3 and conf.transformer.encoder_attn.heads == 4
    # One optimisation step on next-token prediction lowers the loss on that batch
    tokens = torch.randint(11, (8, 4))
    params = [p for m in (conf.transformer.encoder, conf.transformer.src_embed, conf.transformer.generator)
              for p in m.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)

    def loss():
        return nn.functional.cross_entropy(conf.logits(tokens[:-1]).reshape(-1, 11), tokens[1:].reshape(-1))

    before = loss()
    before.backward()
    optimizer.step()
    assert loss().item() < before.item()


def test_unknown_option_names_key_value_and_accepted_options(labml_experiment):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.encoder_attn': 'mhaa'})
    with pytest.raises(ConfigOptionError, match=r"encoder_attn='mhaa' is not an option.*Did you mean 'mha'\?"
                                                r".*Accepted: 'mha'"):
        _ = conf.transformer


def test_unknown_glu_variant_lists_the_variants():
    conf = FeedForwardConfigs()
    with pytest.raises(ConfigOptionError, match=r"glu_variant='SwiGlu'.*Did you mean 'SwiGLU'\?.*Accepted: 'none', "
                                                r"'Bilinear', 'GEGLU', 'GLU', 'ReGLU' or 'SwiGLU'"):
        conf.glu_variant = 'SwiGlu'


def test_unknown_config_key_names_the_key_and_the_closest_valid_key():
    conf = TransformerConfigs()
    with pytest.raises(ConfigKeyError, match=r"unknown config key 'n_layer': TransformerConfigs has no item "
                                             r"'n_layer'\. Did you mean 'n_layers'\? Accepted keys"):
        conf._set_values({'n_layer': 3})


def test_unknown_nested_key_is_caught_when_given_not_when_used():
    conf = TransformerConfigs()
    with pytest.raises(ConfigKeyError, match=r"unknown config key 'ffn\.d_f': FeedForwardConfigs has no item "
                                             r"'d_f'\. Did you mean 'd_ff'\?"):
        conf._set_values({'d_model': 16, 'ffn.d_f': 3})


def test_odd_d_model_with_sinusoidal_positions_is_rejected(labml_experiment):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.d_model': 15, 'transformer.n_heads': 3,
                                    'transformer.n_src_vocab': 5})
    with pytest.raises(ValueError, match=r"d_model=15 is not accepted for sinusoidal positional encodings.*even"):
        _ = conf.transformer.src_embed


def test_learned_positions_accept_odd_d_model(labml_experiment):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.d_model': 15, 'transformer.n_heads': 3, 'transformer.n_src_vocab': 5,
                                    'transformer.src_embed': 'learned_pos'})
    assert conf.transformer.src_embed(torch.zeros(2, 1, dtype=torch.long)).shape == (2, 1, 15)


# -- values of the wrong type --

def test_a_string_for_a_bool_item_is_refused_in_a_nested_override(labml_experiment):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.norm_first': 'no', 'transformer.n_src_vocab': 11})
    with pytest.raises(TypeError, match=r"norm_first='no' is not accepted: TransformerConfigs\.norm_first takes a "
                                        r"bool: True or False"):
        _ = conf.transformer


@pytest.mark.parametrize('value, expected', [(False, False), (True, True), (0, False), (1, True)])
def test_a_bool_item_takes_bools_and_one_and_zero(labml_experiment, value, expected):
    conf = AutoregressiveConfigs()
    labml_experiment.configs(conf, {'transformer.norm_first': value, 'transformer.n_src_vocab': 11,
                                    'transformer.d_model': 8, 'transformer.n_heads': 2, 'transformer.ffn.d_ff': 8})
    assert conf.transformer.norm_first is expected
    assert conf.transformer.encoder_layer.norm_first is expected


@pytest.mark.parametrize('key, value, accepted', [('d_model', 'abc', 'an integer'), ('d_model', 2.5, 'an integer'),
                                                  ('n_layers', True, 'an integer'), ('dropout', 'x', 'a number'),
                                                  ('norm_first', 2, 'a bool'), ('norm_first', 'True', 'a bool')])
def test_values_of_the_wrong_type_name_the_item_and_its_type(key, value, accepted):
    conf = TransformerConfigs()
    with pytest.raises(TypeError, match=rf"{key}={re.escape(repr(value))} is not accepted: "
                                        rf"TransformerConfigs\.{key} takes {accepted}"):
        conf._set_values({key: value})


def test_numbers_are_converted_to_the_items_type():
    import numpy as np
    conf = TransformerConfigs()
    conf._set_values({'d_model': np.int64(16), 'dropout': 0})
    assert conf.d_model == 16 and type(conf.d_model) is int and conf.dropout == 0.0 and type(conf.dropout) is float


def test_module_constructors_take_only_bools_and_probabilities():
    from labml_txl.transformer.feed_forward import FeedForward
    from labml_txl.transformer.models import Encoder, TransformerLayer
    with pytest.raises(TypeError, match=r"is_gated='False' is not accepted: is_gated must be a bool"):
        FeedForward(8, 16, is_gated='False')
    layer = TransformerLayer(d_model=8, self_attn=nn.Identity(), feed_forward=nn.Identity(), dropout_prob=0.1)
    with pytest.raises(TypeError, match=r"norm_first='no' is not accepted"):
        TransformerLayer(d_model=8, self_attn=nn.Identity(), feed_forward=nn.Identity(), dropout_prob=0.1,
                         norm_first='no')
    with pytest.raises(ValueError, match=r"dropout_prob=1\.5 is not accepted: dropout_prob must be a probability"):
        TransformerLayer(d_model=8, self_attn=nn.Identity(), feed_forward=nn.Identity(), dropout_prob=1.5)
    with pytest.raises(TypeError, match=r"final_norm='True' is not accepted"):
        Encoder(layer, 2, final_norm='True')


# ## The resolved configs, as data and as a table

@pytest.fixture
def lab_in_tmp(tmp_path, monkeypatch):
    """A labml project in tmp_path: a started experiment writes its run folder, configs.yaml included, there."""
    from pathlib import Path

    from labml import lab
    monkeypatch.chdir(tmp_path)
    lab.configure({'path': str(tmp_path)})
    yield tmp_path
    lab.configure({'path': str(Path(__file__).resolve().parents[2])})


def test_resolved_configs_equal_the_configs_yaml_labml_writes(lab_in_tmp):
    import yaml
    from labml import experiment
    from labml.internal.experiment import experiment_singleton

    from labml_txl.configs.validation import ResolvedItem, resolved
    conf = TransformerConfigs()
    experiment.create(name='resolved', writers=set())
    experiment.configs(conf, {'n_heads': 2, 'd_model': 16, 'n_layers': 1, 'encoder_attn': 'relative',
                              'ffn.d_ff': 32, 'ffn.glu_variant': 'SwiGLU'})
    with experiment.start():
        conf.encoder
    written = yaml.safe_load(experiment_singleton().run.configs_path.read_text())
    items = resolved(conf)
    assert_matches_configs_yaml(items, written)
    assert items['ffn.d_ff'] == ResolvedItem('ffn.d_ff', 32, overridden=True, computed=True, option=None)
    assert items['ffn.d_model'] == ResolvedItem('ffn.d_model', 16, overridden=False, computed=True, option=None)
    assert items['encoder_attn'] == ResolvedItem('encoder_attn', 'relative', True, True, 'relative')
    assert items['encoder'] == ResolvedItem('encoder', 'default', False, True, 'default')
    # set by the GLU variant (an aggregate): labml's string of the module
    assert items['ffn.activation'].value == 'SiLU()' and items['ffn.is_gated'].value is True
    assert items['ffn'].value == 'default' and list(items) == sorted(items)
    # the table of a nested configs does not reach configs.yaml: labml's class path stays
    assert written['ffn']['computed'] == 'labml_txl.configs.transformer.FeedForwardConfigs'


def test_nested_configs_in_a_plain_labml_configs_keep_configs_yaml_as_labml_writes_it(lab_in_tmp):
    """A user's `BaseConfigs` (not ours) holding TransformerConfigs: labml writes the nested item as its class's path,
    not as our table, and `resolved` reads the user's configs too."""
    import yaml
    from labml import experiment
    from labml.internal.experiment import experiment_singleton

    from labml_txl.configs.validation import resolved
    conf = AutoregressiveConfigs()
    experiment.create(name='plain', writers=set())
    experiment.configs(conf, {'transformer.d_model': 16, 'transformer.n_heads': 2, 'transformer.n_src_vocab': 11,
                              'transformer.n_tgt_vocab': 11, 'transformer.n_layers': 1})
    with experiment.start():
        conf.logits(torch.zeros(3, 1, dtype=torch.long))
        # labml saves configs.yaml when an item of the configs it was given is computed, not one of a nested configs
        conf.n_tokens
    written = yaml.safe_load(experiment_singleton().run.configs_path.read_text())
    assert written['transformer']['computed'] == 'labml_txl.configs.transformer.TransformerConfigs'
    items = resolved(conf)
    assert_matches_configs_yaml(items, written)
    assert items['transformer.d_model'].value == 16 and items['transformer.d_model'].overridden
    assert items['transformer.encoder'].value == 'default'
    # everywhere else, the table
    assert str(conf.transformer) == repr(conf.transformer) == f'{conf.transformer}'
    assert str(conf.transformer).startswith('TransformerConfigs: ')


def test_printing_configs_shows_a_key_value_table_with_the_overrides_marked(capsys):
    conf = TransformerConfigs()
    conf._set_values({'d_model': 16, 'n_heads': 2, 'ffn.d_ff': 32, 'n_src_vocab': 7})
    conf.encoder_layer
    capsys.readouterr()  # labml's "Prepare ..." lines
    print(conf)
    text = capsys.readouterr().out
    assert text == repr(conf) + '\n' and 'object at 0x' not in text
    lines = text.splitlines()
    assert lines[0] == f'TransformerConfigs: {sum(1 for l in lines if " = " in l)} items computed (* overridden)'
    assert re.search(r'^\* d_model\s+= 16$', text, re.M) and re.search(r'^\* ffn\.d_ff\s+= 32$', text, re.M)
    assert re.search(r'^  dropout\s+= 0\.1$', text, re.M) and re.search(r'^  ffn\.ffn\s+= default$', text, re.M)
    assert re.search(r'^  encoder_layer\s+= default$', text, re.M)
    # never computed: named at the end, an override of one marked
    not_computed = ' '.join(text.split('not computed: ', 1)[1].split())
    assert 'decoder,' in not_computed and 'n_src_vocab*' in not_computed and 'encoder_layer' not in not_computed


def test_resolved_of_a_lazy_conf_gives_the_computed_items_and_computes_nothing():
    from labml_txl.configs.validation import ResolvedItem, resolved
    conf = TransformerConfigs()
    assert resolved(conf) == {} and repr(conf).startswith('TransformerConfigs: nothing computed yet')
    conf.d_model = 16
    conf._set_values({'ffn.d_ff': 64, 'n_layers': 3})
    assert conf.n_heads == 8
    cached = dict(conf._Configs__cached)
    assert resolved(conf) == {'n_heads': ResolvedItem('n_heads', 8, overridden=False, computed=True)}
    every = resolved(conf, include_uncomputed=True)
    assert every['d_model'] == ResolvedItem('d_model', 16, overridden=False, computed=False)
    assert every['n_layers'] == ResolvedItem('n_layers', 3, overridden=True, computed=False)
    assert every['encoder'] == ResolvedItem('encoder', 'default', False, False, 'default')
    assert every['ffn.d_ff'] == ResolvedItem('ffn.d_ff', 64, overridden=True, computed=False)
    assert 'ffn.d_ff*' in repr(conf)
    # neither resolving nor printing computed anything
    assert conf._Configs__cached == cached
    # an assignment in code is no override, computed or not
    assert conf.d_model == 16 and resolved(conf)['d_model'] == ResolvedItem('d_model', 16, False, True)
