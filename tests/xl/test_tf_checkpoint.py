"""
The converter of the authors' TensorFlow checkpoints (`labml_txl/xl/formats/tf_checkpoint.py`).

Each test writes a small checkpoint with TensorFlow itself, random values under the names and in the layouts of the
authors' `tf/model.py` (`authors_variables` below lists them from that file), and reads it back two ways:
- with Hugging Face 4.44's own TensorFlow loader (`load_tf_weights_in_transfo_xl`) into its `TransfoXLLMHeadModel`,
  whose log-probabilities over segments with memories ours must equal (both in float64, which holds the
  checkpoint's float32 values exactly: the same function, tolerance.py's rule 1). HF's loader reads only the layout
  of the published WikiText-103 model (a table per cluster, `div_val > 1`, every projection, per-layer u and v);
- for the layouts HF's loader does not read (one table, `div_val` 1, as enwik8 and text8; projections left out with
  `proj_same_dim=False`), the embedding and the adaptive softmax computed with numpy from the checkpoint's arrays
  by `tf/model.py`'s formulas, tail cluster i scored by the head's column `cutoffs[0] + i - 1`.

TensorFlow is the `tf` extra: the tests that need it are marked `tf`, deselected by `make test` (the summary says why) and
run by `make test-tf`; the one that checks the message naming the extra runs without it.
"""
import json
import math
import os
import sys
from unittest import mock

import numpy as np
import pytest
import torch

from labml_txl.xl import MemTransformerLM
from labml_txl.xl.formats import tf_checkpoint
from labml_txl.xl.formats.tf_checkpoint import TFCheckpointError, convert_tf_checkpoint
from tolerance import assert_same_function

# TensorFlow's C++ start-up messages stay out of the test output
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

SIZES = dict(n_token=50, n_layer=2, n_head=2, d_head=8, d_inner=48)
# The layout of the published WikiText-103 model (`tf/sota/wt103.sh`: a table per cluster, untie_r), three tail clusters
WT103_LIKE = dict(SIZES, div_val=4, cutoffs=[10, 20, 35], d_model=32, d_embed=64, untie_r=True)
# Evaluation settings, as a published model is run: memory longer than a segment, clamped distances, same length
SETTINGS = dict(mem_len=6, clamp_len=5, same_length=True)
SEGMENT, BATCH, SEGMENTS = 4, 2, 3



@pytest.fixture(scope='module')
def tf():
    """TensorFlow, for the tests marked `tf`: those run only with `--with-tf`, which requires it (conftest.py)."""
    import tensorflow
    return tensorflow


def authors_variables(n_token, n_layer, n_head, d_head, d_inner, d_model, d_embed, div_val, cutoffs, untie_r,
                      proj_share_all_but_first, proj_same_dim=True):
    """`{name: shape}` of the variables the authors' `tf/model.py` makes (`transformer(...)` with `use_tpu=False`,
    `tie_projs` of `train_gpu.py`)."""
    variables = {}
    r_shape = [n_layer, n_head, d_head] if untie_r else [n_head, d_head]
    variables['transformer/r_w_bias'] = variables['transformer/r_r_bias'] = r_shape
    bounds = [0] + list(cutoffs) + [n_token]
    if div_val == 1:
        variables['transformer/adaptive_embed/lookup_table'] = [n_token, d_embed]
        if d_model != d_embed:
            variables['transformer/adaptive_embed/proj_W'] = [d_embed, d_model]
    else:
        for i in range(len(bounds) - 1):
            d_i = d_embed // div_val ** i
            variables[f'transformer/adaptive_embed/cutoff_{i}/lookup_table'] = [bounds[i + 1] - bounds[i], d_i]
            if proj_same_dim or d_i != d_model:
                variables[f'transformer/adaptive_embed/cutoff_{i}/proj_W'] = [d_i, d_model]
    for n in range(n_layer):
        layer = f'transformer/layer_{n}/'
        variables.update({
            layer + 'rel_attn/qkv/kernel': [d_model, 3 * n_head * d_head],
            layer + 'rel_attn/r/kernel': [d_model, n_head * d_head],
            layer + 'rel_attn/o/kernel': [n_head * d_head, d_model],
            layer + 'rel_attn/LayerNorm/gamma': [d_model], layer + 'rel_attn/LayerNorm/beta': [d_model],
            layer + 'ff/layer_1/kernel': [d_model, d_inner], layer + 'ff/layer_1/bias': [d_inner],
            layer + 'ff/layer_2/kernel': [d_inner, d_model], layer + 'ff/layer_2/bias': [d_model],
            layer + 'ff/LayerNorm/gamma': [d_model], layer + 'ff/LayerNorm/beta': [d_model],
        })
    if not cutoffs:
        variables['transformer/adaptive_softmax/bias'] = [n_token]
        return variables
    for i in range(len(bounds) - 1):
        d_i = d_embed // div_val ** i
        variables[f'transformer/adaptive_softmax/cutoff_{i}/b'] = [bounds[i + 1] - bounds[i]]
        tied = proj_share_all_but_first and i > 0
        if not tied and not ((div_val == 1 or not proj_same_dim) and d_model == d_i):
            variables[f'transformer/adaptive_softmax/cutoff_{i}/proj'] = [d_i, d_model]
    variables['transformer/adaptive_softmax/cutoff_0/cluster_W'] = [len(cutoffs), d_embed]
    variables['transformer/adaptive_softmax/cutoff_0/cluster_b'] = [len(cutoffs)]
    return variables


def write_checkpoint(tf, prefix, variables, seed=0):
    """Random float32 values for `variables`, written by TensorFlow as a name-based (V2) checkpoint like the
    authors' `tf.train.Saver`, with an optimizer slot and a global step as a training run leaves them. Returns
    the values."""
    rng = np.random.default_rng(seed)
    values = {}
    for name, shape in variables.items():
        # The spread of trained weights (log-probabilities of magnitude ~10)
        value = rng.normal(0.0, 0.2, shape) + (1.0 if name.endswith('LayerNorm/gamma') else 0.0)
        values[name] = value.astype(np.float32)
    extra = {'transformer/layer_0/ff/layer_1/bias/Adam': np.zeros(variables['transformer/layer_0/ff/layer_1/bias'],
                                                                  np.float32),
             'global_step': np.array(1000, np.int64)}
    save(tf, prefix, {**values, **extra})
    return values


def save(tf, prefix, values):
    """`{name: array}` written by TensorFlow as a name-based (V2) checkpoint at `prefix`."""
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=list(values), shape_and_slices=[''] * len(values),
                      tensors=[tf.constant(v) for v in values.values()])


def hf_model(prefix, arch, proj_share_all_but_first):
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    from transformers.models.deprecated.transfo_xl.modeling_transfo_xl import load_tf_weights_in_transfo_xl
    config = TransfoXLConfig(vocab_size=arch['n_token'], cutoffs=arch['cutoffs'], d_model=arch['d_model'],
                             d_embed=arch['d_embed'], n_head=arch['n_head'], d_head=arch['d_head'],
                             d_inner=arch['d_inner'], div_val=arch['div_val'], n_layer=arch['n_layer'],
                             untie_r=arch['untie_r'], proj_share_all_but_first=proj_share_all_but_first,
                             pre_lnorm=False, attn_type=0, adaptive=True, dropout=0.0, dropatt=0.0, **SETTINGS)
    model = TransfoXLLMHeadModel(config)
    load_tf_weights_in_transfo_xl(model, config, str(prefix))
    return model.eval()


def segments(n_token, seed=1):
    torch.manual_seed(seed)
    data = torch.randint(n_token, (BATCH, SEGMENT * SEGMENTS))
    return data.split(SEGMENT, dim=1)


def ours_log_probs(model, data):
    """Log-probabilities `[batch, len, n_token]` segment after segment, from no memory."""
    mems, out = None, []
    with torch.no_grad():
        for segment in data:
            log_probs, mems = model.log_probs(segment.t(), mems)
            out.append(log_probs.transpose(0, 1))
    return torch.cat(out, dim=1)


def hf_log_probs(model, data, n_layer, d_model):
    """The same with HF, from *empty* memories: its own `init_mems` starts from `mem_len` zero vectors, where the
    original (and ours) starts from none. (Under the `hf_on_current_torch` fixture: HF 4.44 on current torch.)"""
    mems, out = [torch.zeros(0, BATCH, d_model, dtype=model.dtype) for _ in range(n_layer)], []
    with torch.no_grad():
        for segment in data:
            result = model(input_ids=segment, mems=mems)
            mems = result.mems
            out.append(result.prediction_scores)
    return torch.cat(out, dim=1)


# The WikiText-103 layout (`proj_share_all_but_first` too) and the other choices of the authors' flags
HF_CASES = {
    'wt103-like': dict(d_model=32, d_embed=64, untie_r=True, proj_share_all_but_first=True),
    'shared-r-untied-projections': dict(d_model=32, d_embed=64, untie_r=False, proj_share_all_but_first=False),
    'd_embed-equals-d_model': dict(d_model=64, d_embed=64, untie_r=True, proj_share_all_but_first=True),
}


@pytest.mark.parametrize('case', list(HF_CASES))
@pytest.mark.tf
def test_log_probs_equal_hf_loading_the_same_checkpoint(tf, tmp_path, case, hf_in_float64):
    options = HF_CASES[case]
    arch = dict(WT103_LIKE, d_model=options['d_model'], d_embed=options['d_embed'], untie_r=options['untie_r'])
    prefix = tmp_path / 'model.ckpt-0'
    values = write_checkpoint(tf, prefix, authors_variables(**arch, proj_share_all_but_first=options['proj_share_all_but_first']))
    # (`original_numerics`: HF's attention rounds its scores to float32, `attn_score.float()`, as the original does)
    ours = convert_tf_checkpoint(prefix, dict(SETTINGS, original_numerics=True)).double()

    if not arch['untie_r']:
        # HF 4.44's loader fails on a shared u, v (it reads the list it builds for them as a tensor): it reads the
        # same values with u and v repeated for every layer, the same function
        for bias in ('transformer/r_w_bias', 'transformer/r_r_bias'):
            values[bias] = np.stack([values[bias]] * arch['n_layer'])
        prefix = tmp_path / 'untied.ckpt-0'
        save(tf, prefix, values)
        arch['untie_r'] = True
    theirs = hf_model(prefix, arch, options['proj_share_all_but_first']).double()
    data = segments(arch['n_token'])
    expected = hf_log_probs(theirs, data, arch['n_layer'], arch['d_model'])
    got = ours_log_probs(ours, data)
    assert got.shape == expected.shape == (BATCH, SEGMENT * SEGMENTS, arch['n_token'])
    assert_same_function(got, expected)

    # The test sees the order of the clusters: TF's rows taken as they are give other log-probabilities
    with torch.no_grad():
        ours.crit.cluster_weight.copy_(ours.crit.cluster_weight.flip(0))
        ours.crit.cluster_bias.copy_(ours.crit.cluster_bias.flip(0))
    assert (ours_log_probs(ours, data) - expected).abs().max().item() > 1e-2


def tf_embedding(values, arch, tokens):
    """`tf/model.py`'s `mask_adaptive_embedding_lookup`: $\\sqrt{d_{model}}\\, E_i[x - c_i] W_{proj,i}$."""
    if arch['div_val'] == 1:
        out = values['transformer/adaptive_embed/lookup_table'][tokens]
        proj = values.get('transformer/adaptive_embed/proj_W')
        return math.sqrt(arch['d_model']) * (out if proj is None else out @ proj)
    bounds = [0] + arch['cutoffs'] + [arch['n_token']]
    out = np.zeros(tokens.shape + (arch['d_model'],), np.float64)
    for i in range(len(bounds) - 1):
        in_cluster = (tokens >= bounds[i]) & (tokens < bounds[i + 1])
        rows = values[f'transformer/adaptive_embed/cutoff_{i}/lookup_table'][tokens[in_cluster] - bounds[i]]
        proj = values.get(f'transformer/adaptive_embed/cutoff_{i}/proj_W')
        out[in_cluster] = rows if proj is None else rows @ proj
    return math.sqrt(arch['d_model']) * out


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def tf_log_probs(values, arch, hidden, proj_share_all_but_first):
    """`tf/model.py`'s `mask_adaptive_logsoftmax` for every word: logits $(h P_i^\\top) W_i^\\top + b_i$ with the
    embedding tables as $W_i$; tail cluster i scored by the head's column `cutoffs[0] + i - 1`."""
    div_val, cutoffs = arch['div_val'], arch['cutoffs']
    embed = 'transformer/adaptive_embed/'
    if not cutoffs:
        proj = values.get(embed + 'proj_W')
        y = hidden if proj is None else hidden @ proj.T
        return log_softmax(y @ values[embed + 'lookup_table'].T + values['transformer/adaptive_softmax/bias'])
    bounds = [0] + cutoffs + [arch['n_token']]
    logits = []
    for i in range(len(bounds) - 1):
        scope = f'transformer/adaptive_softmax/cutoff_{i}/'
        if div_val == 1:
            weight, embed_proj = values[embed + 'lookup_table'][bounds[i]:bounds[i + 1]], values.get(embed + 'proj_W')
        else:
            weight, embed_proj = (values[f'{embed}cutoff_{i}/lookup_table'],
                                  values.get(f'{embed}cutoff_{i}/proj_W'))
        bias = values[scope + 'b']
        proj = embed_proj if proj_share_all_but_first and i > 0 else values.get(scope + 'proj')
        if i == 0:
            weight = np.concatenate([weight, values[scope + 'cluster_W']])
            bias = np.concatenate([bias, values[scope + 'cluster_b']])
        y = hidden if proj is None else hidden @ proj.T
        logits.append(y @ weight.T + bias)
    head = log_softmax(logits[0])
    out = [head[:, :cutoffs[0]]]
    for i in range(1, len(bounds) - 1):
        out.append(head[:, cutoffs[0] + i - 1, None] + log_softmax(logits[i]))
    return np.concatenate(out, axis=1)


# The layouts HF's loader does not read: one table (enwik8, text8: no cutoffs, d_embed = d_model), one table with
# clusters and a projection, and `proj_same_dim=False` (no projection where a cluster has d_model features)
NUMPY_CASES = {
    'one-table-no-cutoffs': dict(div_val=1, cutoffs=[], d_model=32, d_embed=32),
    'one-table-projected-no-cutoffs': dict(div_val=1, cutoffs=[], d_model=32, d_embed=24),
    'one-table-three-tail-clusters': dict(div_val=1, cutoffs=[10, 20, 35], d_model=32, d_embed=32),
    'one-table-projected-shared': dict(div_val=1, cutoffs=[10, 20, 35], d_model=32, d_embed=24,
                                       proj_share_all_but_first=True),
    'proj_same_dim-false': dict(div_val=4, cutoffs=[10, 20, 35], d_model=64, d_embed=64, proj_same_dim=False),
}


@pytest.mark.parametrize('case', list(NUMPY_CASES))
@pytest.mark.tf
def test_embedding_and_softmax_follow_the_authors_formulas(tf, tmp_path, case):
    options = dict(NUMPY_CASES[case])
    shared = options.pop('proj_share_all_but_first', False)
    proj_same_dim = options.pop('proj_same_dim', True)
    arch = dict(SIZES, untie_r=True, **options)
    prefix = tmp_path / 'model.ckpt-0'
    values = write_checkpoint(tf, prefix, authors_variables(**arch, proj_share_all_but_first=shared,
                                                            proj_same_dim=proj_same_dim))
    values = {name: value.astype(np.float64) for name, value in values.items()}
    model = convert_tf_checkpoint(prefix, SETTINGS).double()
    assert model.n_token == arch['n_token'] and model.cutoffs == arch['cutoffs']

    # (float64 both: the same function, tolerance.py's rule 1)
    tokens = np.arange(arch['n_token']).reshape(-1, 1)
    embedded = model.word_emb(torch.from_numpy(tokens))
    assert_same_function(embedded.detach(), torch.from_numpy(tf_embedding(values, arch, tokens)))

    hidden = np.random.default_rng(2).normal(0.0, 1.0, (7, arch['d_model']))
    with torch.no_grad():
        log_probs = model.hidden_to_log_probs(torch.from_numpy(hidden))
    assert_same_function(log_probs, torch.from_numpy(tf_log_probs(values, arch, hidden, shared)))


@pytest.mark.tf
def test_sizes_come_from_the_checkpoint_and_settings_from_the_config(tf, tmp_path):
    prefix = tmp_path / 'model.ckpt-0'
    write_checkpoint(tf, prefix, authors_variables(**WT103_LIKE, proj_share_all_but_first=True))
    model = convert_tf_checkpoint(str(prefix) + '.index', dict(SETTINGS, tgt_len=SEGMENT, n_layer=2))
    assert (model.n_layer, model.n_head, model.d_head, model.d_model, model.d_embed, model.div_val) == (2, 2, 8, 32,
                                                                                                       64, 4)
    assert (model.mem_len, model.tgt_len, model.untie_r, model.training) == (6, SEGMENT, True, False)
    # The softmax shares the embedding's projections of the tail clusters (proj_share_all_but_first)
    assert model.crit.out_projs[1] is model.word_emb.emb_projs[1]
    assert model.crit.out_projs[0] is not model.word_emb.emb_projs[0]


@pytest.mark.tf
def test_a_missing_variable_is_named(tf, tmp_path):
    variables = authors_variables(**WT103_LIKE, proj_share_all_but_first=True)
    del variables['transformer/layer_1/ff/layer_2/bias']
    prefix = tmp_path / 'model.ckpt-0'
    write_checkpoint(tf, prefix, variables)
    with pytest.raises(TFCheckpointError, match=r'transformer/layer_1/ff/layer_2/bias is missing '
                                                r'\(expected shape \[32\] for layers\.1\.pos_ff\.CoreNet\.3\.bias\)'):
        convert_tf_checkpoint(prefix)


@pytest.mark.tf
def test_a_variable_of_another_shape_is_named_with_both_shapes(tf, tmp_path):
    variables = authors_variables(**WT103_LIKE, proj_share_all_but_first=True)
    variables['transformer/layer_1/rel_attn/o/kernel'] = [16, 30]
    prefix = tmp_path / 'model.ckpt-0'
    write_checkpoint(tf, prefix, variables)
    with pytest.raises(TFCheckpointError, match=r'transformer/layer_1/rel_attn/o/kernel has shape \[16, 30\] in the '
                                                r'checkpoint, expected \[16, 32\] for layers\.1\.dec_attn\.o_net\.weight'):
        convert_tf_checkpoint(prefix)


@pytest.mark.tf
def test_a_variable_the_authors_model_does_not_make_is_refused(tf, tmp_path):
    variables = authors_variables(**WT103_LIKE, proj_share_all_but_first=True)
    variables['transformer/adaptive_softmax/cutoff_1/lookup_table'] = [10, 16]
    prefix = tmp_path / 'model.ckpt-0'
    write_checkpoint(tf, prefix, variables)
    with pytest.raises(TFCheckpointError, match=r'does not make .*transformer/adaptive_softmax/cutoff_1/lookup_table'):
        convert_tf_checkpoint(prefix)


@pytest.mark.tf
def test_a_config_that_disagrees_with_the_checkpoint_is_refused(tf, tmp_path):
    prefix = tmp_path / 'model.ckpt-0'
    write_checkpoint(tf, prefix, authors_variables(**WT103_LIKE, proj_share_all_but_first=True))
    with pytest.raises(TFCheckpointError, match=r"config n_layer=3 disagrees with the checkpoint, which has "
                                                r"n_layer=2 \(read from transformer/layer_\*/\)"):
        convert_tf_checkpoint(prefix, {'n_layer': 3})
    with pytest.raises(TFCheckpointError, match=r"config key 'mem_lenght' is not accepted.*Did you mean 'mem_len'"):
        convert_tf_checkpoint(prefix, {'mem_lenght': 3})
    with pytest.raises(TFCheckpointError, match=r"pre_lnorm=True is not accepted: the authors' tf/model.py has only "
                                                r"pre_lnorm=False"):
        convert_tf_checkpoint(prefix, {'pre_lnorm': True})
    with pytest.raises(TFCheckpointError, match=r'no .*nothing\.index; expected the prefix of a TensorFlow checkpoint'):
        convert_tf_checkpoint(tmp_path / 'nothing')


@pytest.mark.tf
def test_command_line_writes_a_folder_with_hf_config_and_safetensors(tf, tmp_path, capsys):
    from transformers import TransfoXLConfig
    prefix = tmp_path / 'ckpt' / 'model.ckpt-0'
    prefix.parent.mkdir()
    write_checkpoint(tf, prefix, authors_variables(**WT103_LIKE, proj_share_all_but_first=True))
    (tmp_path / 'eval.json').write_text(json.dumps(SETTINGS))
    out = tmp_path / 'converted'
    assert tf_checkpoint.main([str(prefix), '--out', str(out), '--config', str(tmp_path / 'eval.json')]) == 0
    assert 'wrote' in capsys.readouterr().out

    # HF reads the config as the same model
    config = TransfoXLConfig.from_json_file(str(out / 'config.json'))
    assert (config.vocab_size, config.cutoffs, config.div_val, config.d_embed, config.n_layer, config.untie_r,
            config.tie_projs, config.mem_len, config.same_length) == (50, [10, 20, 35], 4, 64, 2, True,
                                                                      [False, True, True, True], 6, True)
    # The folder loads here as the converted model (`from_pretrained`)
    reloaded = MemTransformerLM.from_pretrained(out)
    data = segments(WT103_LIKE['n_token'])
    assert torch.equal(ours_log_probs(reloaded, data), ours_log_probs(convert_tf_checkpoint(prefix, SETTINGS), data))

    # A folder that holds a converted model already is refused before any work
    with pytest.raises(SystemExit):
        tf_checkpoint.main([str(prefix), '--out', str(out)])
    assert 'it holds config.json and model.safetensors' in capsys.readouterr().err


def test_without_tensorflow_the_error_names_the_extra(tmp_path):
    (tmp_path / 'model.ckpt-0.index').write_bytes(b'')
    with mock.patch.dict(sys.modules, {'tensorflow': None}):
        with pytest.raises(ImportError, match=r"optional extra of labml_txl: pip install 'labml_txl\[tf\]' "
                                              r"\(in a clone: pip install -e '\.\[tf\]'\)"):
            convert_tf_checkpoint(tmp_path / 'model.ckpt-0')
