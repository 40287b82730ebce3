"""TransformerXLConfigs: every MemTransformerLM keyword, lazy model, attention names and the presets of presets.md."""
import inspect
import re
from pathlib import Path

import pytest
import torch

from labml_txl.configs.validation import ConfigOptionError
from labml_txl.memories import registry as memory_registry
from labml_txl.configs import TransformerConfigs, TransformerXLConfigs
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.positions.relative import Relative
from labml_txl.xl import MemTransformerLM
from tolerance import SAME_FUNCTION

PRESETS_MD = Path(__file__).resolve().parents[1] / 'reference' / 'xl' / 'presets.md'


def test_every_constructor_keyword_is_a_config_item():
    keywords = set(inspect.signature(MemTransformerLM.__init__).parameters) - {'self', 'memory_settings'}
    # How to compute (the dispatcher's choice or the reference), not what: configs do not carry it
    keywords.discard('impl')
    # The memory mechanisms' settings, keywords too (`**memory_settings`)
    keywords |= set(memory_registry.settings())
    assert {'cmem_len', 'compression_rate', 'compression'} <= keywords
    items = set(TransformerXLConfigs()._Configs__types)
    assert keywords - items == set()


def test_the_memory_settings_reach_the_model(labml_experiment):
    """The generated items are passed to the model: a compressed memory built from the configs has their values."""
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'n_token': 50, 'n_layer': 2, 'n_head': 2, 'd_model': 16, 'd_head': 8,
                                    'd_inner': 32, 'tgt_len': 6, 'mem_len': 6, 'cmem_len': 3,
                                    'compression_rate': 2, 'compression': 'max_pool'})
    memory = conf.model.compressed_memory
    assert (memory.cmem_len, memory.compression_rate, memory.compression) == (3, 2, 'max_pool')
    assert TransformerXLConfigs().compression == 'conv'


def test_model_is_built_on_first_use_from_the_items(labml_experiment):
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'n_token': 50, 'n_layer': 2, 'n_head': 2, 'd_model': 16, 'd_head': 8,
                                    'd_inner': 32, 'tgt_len': 6, 'mem_len': 6, 'attention': 'learnable',
                                    'cutoffs': [20], 'div_val': 2, 'tie_projs': 'all_but_first'})
    assert conf._to_json()['model']['order'] == -1, 'not built before it is used'
    model = conf.model
    assert isinstance(model, MemTransformerLM) and model.attn_type == 1 and len(model.layers) == 2
    assert model.impl == 'auto'
    # tie_projs 'all_but_first' with div_val 2: the tail's output projection is the embedding's
    assert model.crit.out_projs[1] is model.word_emb.emb_projs[1]
    data = torch.randint(50, (6, 3))
    loss, *mems = model(data, data)
    assert loss.shape == (6, 3) and len(mems) == 3


@pytest.mark.parametrize('name,attn_type', [('relative', 0), ('learnable', 1), ('absolute', 2),
                                            ('absolute_deeper', 3)])
def test_attention_names(name, attn_type, labml_experiment):
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'attention': name})
    assert conf.attn_type == attn_type


def _presets_table():
    """Rows of the training table of presets.md, read at test time: {preset: {column: text}}."""
    lines = PRESETS_MD.read_text().split('## Training')[1].split('##')[0].strip().splitlines()
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines if line.startswith('|')]
    header, body = rows[0], rows[2:]
    return {row[0]: dict(zip(header, row)) for row in body}


def _eval_table():
    lines = PRESETS_MD.read_text().split('## Evaluation')[1].split('##')[0].strip().splitlines()
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines if line.startswith('|')]
    return {row[0]: dict(zip(rows[0], row)) for row in rows[2:]}


PRESETS = ['enwik8_base', 'enwik8_large', 'text8_base', 'text8_large', 'wt103_base', 'wt103_large', 'lm1b_base',
           'lm1b_large']


def test_presets_cover_every_row_of_presets_md():
    assert sorted(_presets_table()) == sorted(PRESETS)


@pytest.mark.parametrize('preset', PRESETS)
def test_preset_sets_the_columns_of_presets_md(preset, labml_experiment):
    row, eval_row = _presets_table()[preset], _eval_table()[preset]
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'preset': preset})
    for column in ('n_layer', 'd_model', 'n_head', 'd_head', 'd_inner', 'tgt_len', 'mem_len'):
        assert getattr(conf, column) == int(row[column]), column
    for column in ('dropout', 'dropatt'):
        assert getattr(conf, column) == float(row[column]), column
    assert conf.eval_tgt_len == int(row['eval_tgt_len'])
    assert conf.test_tgt_len == int(eval_row['tgt_len'])
    assert conf.test_mem_len == int(eval_row['mem_len'])
    clamp = eval_row['clamp_len']
    assert conf.test_clamp_len == (int(clamp) if clamp.isdigit() else -1)
    assert conf.test_same_length == (eval_row['same_length'] == 'yes')
    adaptive = row['adaptive (cutoffs, div_val)']
    if adaptive == 'no':
        assert conf.cutoffs == [] and conf.div_val == 1
    else:
        cutoffs, div_val = re.match(r'cutoffs \[(.*)\], div_val (\d+)', adaptive).groups()
        assert conf.cutoffs == [int(x) for x in cutoffs.split(',')] and conf.div_val == int(div_val)
        # presets.md: tie_projs [False] + [True] * 3 for WikiText-103, [False] * 4 for One Billion Words
        assert conf.tie_projs == ([False] + [True] * 3 if preset.startswith('wt103') else [False] * 4)
    assert conf.attn_type == 0 and conf.tie_weight and conf.d_embed is None


def test_a_preset_item_can_still_be_overridden(labml_experiment):
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'preset': 'enwik8_base', 'mem_len': 256, 'n_layer': 4})
    assert (conf.mem_len, conf.n_layer, conf.d_model) == (256, 4, 512)


def test_unknown_preset_names_the_presets():
    conf = TransformerXLConfigs()
    with pytest.raises(ConfigOptionError, match=r"preset='enwik8' is not an option.*Did you mean 'enwik8_base'\?"
                                                r".*'lm1b_large'"):
        conf._set_values({'preset': 'enwik8'})


@pytest.mark.parametrize('attention', ['mha', 'relative'])
def test_relative_option_of_transformer_configs_builds_the_relative_attention(attention, labml_experiment):
    conf = TransformerConfigs()
    labml_experiment.configs(conf, {'encoder_attn': attention, 'src_embed': 'no_pos', 'd_model': 16,
                                    'n_heads': 4, 'n_layers': 2, 'n_src_vocab': 10, 'dropout': 0.0})
    encoder = conf.encoder.eval().double()
    expected_scheme = Relative if attention == 'relative' else type(None)
    assert all(type(layer.self_attn) is MultiHeadAttention and type(layer.self_attn.positions) is expected_scheme
               for layer in encoder.layers)
    with torch.no_grad():
        for layer in encoder.layers:
            if attention == 'relative':
                # u and v start at zero; make them count
                torch.nn.init.normal_(layer.self_attn.r_w_bias)
                torch.nn.init.normal_(layer.self_attn.r_r_bias)
        x = conf.src_embed.double()(torch.randint(10, (7, 2)))
        out, reversed_out = encoder(x), encoder(x.flip(0))
    assert out.shape == (7, 2, 16) and out.dtype == torch.float64 and torch.isfinite(out).all()
    # Without position embeddings, plain attention is order-blind (reversing the input reverses the output: the same
    # function in float64, tolerance.py's rule 1); relative attention sees the order through the distances i - j
    order_blind = torch.allclose(reversed_out.flip(0), out, rtol=0,
                                 atol=SAME_FUNCTION * max(1.0, out.abs().max().item()))
    assert order_blind == (attention == 'mha')
