"""
Hugging Face TransfoXL folders, against transformers 4.44.2 itself: random `TransfoXLLMHeadModel`s of small
WikiText-103-like shapes (three tail clusters) saved by Hugging Face load here with the same log-probabilities over
three segments with memories, and models saved here load in Hugging Face with the same log-probabilities (both
in float64: the same function, tolerance.py's rule 1); bad folders are refused, naming what is wrong.
"""
import json
import re

import pytest
import safetensors.torch
import torch
from transformers.models.deprecated.transfo_xl import TransfoXLConfig, TransfoXLLMHeadModel

from labml_txl.fast import dispatch
from labml_txl.xl import MemTransformerLM
from labml_txl.xl.formats.hf import WeightFiles
from tolerance import assert_same_function

N_TOKEN = 100
# Three tail clusters, as WikiText-103's [20000, 40000, 200000]
CUTOFFS = [20, 40, 70]
BSZ, SEGMENT, N_SEGMENTS = 2, 5, 3

pytestmark = pytest.mark.filterwarnings('ignore:The output of TransfoXL will be updated:DeprecationWarning')



def raises(exception, *fragments):
    """`pytest.raises` that also checks every fragment appears in the message."""
    return pytest.raises(exception, match=''.join(f'(?=[\\s\\S]*{re.escape(f)})' for f in fragments))


def hf_settings(div_val: int, **changes) -> dict:
    """A tiny TransfoXLConfig of the published WikiText-103 model's kind (adaptive input and softmax, `same_length`,
    `clamp_len`, memories longer than a segment)."""
    settings = dict(vocab_size=N_TOKEN, cutoffs=CUTOFFS, d_model=64, d_embed=64, n_head=2, d_head=8, d_inner=128,
                    div_val=div_val, n_layer=2, mem_len=8, clamp_len=4, same_length=True, untie_r=True,
                    dropout=0.1, dropatt=0.0)
    settings.update(changes)
    return settings


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn from N(0, 0.15^2), so that no weight (a zero bias, a unit layer-norm gain) hides a
    swapped row; tied parameters are drawn once."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.15)


def random_hf_model(settings: dict, seed: int = 0) -> TransfoXLLMHeadModel:
    model = TransfoXLLMHeadModel(TransfoXLConfig(**settings))
    randomize(model, seed)
    return model.eval()


def segments(seed: int = 1) -> torch.Tensor:
    """`[N_SEGMENTS, SEGMENT, BSZ]` token ids, every cluster's words among them."""
    return torch.randint(0, N_TOKEN, (N_SEGMENTS, SEGMENT, BSZ), generator=torch.Generator().manual_seed(seed))


def hf_log_probs(model: TransfoXLLMHeadModel, data: torch.Tensor) -> list:
    """Hugging Face's log-probabilities `[SEGMENT, BSZ, N_TOKEN]` of each segment, with memories."""
    # Empty memories to start with, as ours (Hugging Face's own `init_mems` would be mem_len zero vectors)
    mems = [torch.empty(0, BSZ, model.config.d_model, dtype=model.dtype) for _ in range(model.config.n_layer)]
    out = []
    with torch.no_grad():
        for segment in data:
            result = model(segment.t(), mems=mems)
            mems = result.mems
            out.append(result.prediction_scores.transpose(0, 1))
    return out


def our_log_probs(model: MemTransformerLM, data: torch.Tensor) -> list:
    mems, out = [], []
    with torch.no_grad():
        for segment in data:
            log_probs, mems = model.log_probs(segment, mems)
            out.append(log_probs)
    return out


def max_difference(a: list, b: list) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def assert_same_log_probs(hf: TransfoXLLMHeadModel, ours: MemTransformerLM, data: torch.Tensor):
    """Both models' log-probabilities over the segments, in float64, the same function (tolerance.py's rule 1).
    Hugging Face's attention rounds its scores to float32 (`attn_score.float()`, as the original does), which ours
    does with `original_numerics`."""
    assert ours.original_numerics
    hf, ours = hf.double(), ours.double()
    assert_same_function(torch.stack(our_log_probs(ours, data)), torch.stack(hf_log_probs(hf, data)))


# Hugging Face's folders: (name, config changes, how Hugging Face saves)
HF_FOLDERS = [
    # The published WikiText-103 model's kind: div_val 4, per-layer biases, projections of the tail clusters tied
    ('div4_untie_r_safetensors', dict(div_val=4), dict(safe_serialization=True)),
    ('div4_untie_r_bin', dict(div_val=4), dict(safe_serialization=False)),
    # Shared biases: Hugging Face cannot write them as safetensors (shared tensors), only as pytorch_model.bin;
    # d_embed < d_model, so every cluster's projection is the embedding's one
    ('div1_shared_r_projected_bin', dict(div_val=1, d_embed=32, untie_r=False), dict(safe_serialization=False)),
    ('div1_pre_lnorm_shards', dict(div_val=1, pre_lnorm=True, same_length=False, clamp_len=-1,
                                   proj_share_all_but_first=False),
     dict(safe_serialization=True, max_shard_size='40KB')),
    ('div4_nothing_tied', dict(div_val=4, tie_word_embeddings=False, proj_share_all_but_first=False),
     dict(safe_serialization=True)),
]


@pytest.mark.parametrize('changes, save', [case[1:] for case in HF_FOLDERS], ids=[case[0] for case in HF_FOLDERS])
def test_hf_folder_loads_with_the_same_log_probs(tmp_path, hf_in_float64, changes, save):
    hf = random_hf_model(hf_settings(**changes))
    hf.save_pretrained(tmp_path, **save)
    ours = MemTransformerLM.from_pretrained(tmp_path)
    # A published model computes as the original code that trained it
    assert not ours.training and ours.original_numerics
    with dispatch.recording() as choices:
        our_log_probs(ours, segments())
    # ... which in float32 changes nothing, so the fast paths serve it
    assert 'reference' not in {c.chosen for c in choices if c.operation == 'attention'}
    assert_same_log_probs(hf, ours, segments())


def test_saved_shards_are_read(tmp_path):
    """The sharded case above is sharded indeed (else it tests the single file twice)."""
    random_hf_model(hf_settings(div_val=1)).save_pretrained(tmp_path, max_shard_size='40KB')
    assert (tmp_path / 'model.safetensors.index.json').is_file()
    assert len(list(tmp_path.glob('model-*.safetensors'))) > 1


def test_bin_of_the_legacy_torch_format(tmp_path):
    """A `pytorch_model.bin` written before torch's zip format (as files of 2019 are) is read too (without mmap)."""
    random_hf_model(hf_settings(div_val=4)).save_pretrained(tmp_path, safe_serialization=False)
    model = MemTransformerLM.from_pretrained(tmp_path)
    bin_file = tmp_path / 'pytorch_model.bin'
    torch.save(torch.load(bin_file, weights_only=True), bin_file, _use_new_zipfile_serialization=False)
    legacy = MemTransformerLM.from_pretrained(tmp_path)
    for name, value in model.state_dict().items():
        assert torch.equal(legacy.state_dict()[name], value), name


def test_cluster_rows_copied_as_they_are_would_differ(tmp_path, hf_in_float64):
    """The fact the conversion handles: with the head's cluster rows in Hugging Face's order, the hidden states
    agree (float64, the same function) but the log-probabilities do not."""
    hf = random_hf_model(hf_settings(div_val=4))
    hf.save_pretrained(tmp_path)
    ours = MemTransformerLM.from_pretrained(tmp_path).double()
    hf = hf.double()
    with torch.no_grad():
        ours.crit.cluster_weight.copy_(hf.crit.cluster_weight)
        ours.crit.cluster_bias.copy_(hf.crit.cluster_bias)
        data = segments()[0]
        hidden, _ = ours.forward_hidden(data)
        hf_mems = [torch.empty(0, BSZ, 64, dtype=torch.float64)] * 2
        hf_hidden = hf.transformer(data.t(), mems=hf_mems).last_hidden_state.transpose(0, 1)
    assert_same_function(hidden, hf_hidden)
    assert max_difference(hf_log_probs(hf, segments()), our_log_probs(ours, segments())) > 0.1


# Our models saved for Hugging Face: constructor arguments
OUR_MODELS = [
    ('div4_untie_r', dict(div_val=4, d_embed=64, untie_r=True, tie_projs=[False, True, True, True])),
    ('div1_shared_r_projected', dict(div_val=1, d_embed=32, untie_r=False, tie_projs=[False, True, True, True])),
    ('div4_nothing_tied', dict(div_val=4, d_embed=64, untie_r=True, tie_weight=False)),
]


@pytest.mark.parametrize('arguments', [case[1] for case in OUR_MODELS], ids=[case[0] for case in OUR_MODELS])
def test_saved_folder_loads_in_hf_with_the_same_log_probs(tmp_path, hf_in_float64, arguments):
    # (`original_numerics`: the float32 rounding of the scores Hugging Face's attention does, which in float32, as
    # saved, changes nothing)
    ours = MemTransformerLM(n_token=N_TOKEN, n_layer=2, n_head=2, d_model=64, d_head=8, d_inner=128, dropout=0.1,
                            dropatt=0.0, cutoffs=CUTOFFS, mem_len=8, clamp_len=4, same_length=True,
                            original_numerics=True, **arguments)
    randomize(ours, seed=2)
    ours.eval()
    ours.save_pretrained(tmp_path)
    hf, info = TransfoXLLMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    # And back here: the same tensors
    again = MemTransformerLM.from_pretrained(tmp_path)
    assert again.state_dict().keys() == ours.state_dict().keys()
    for name, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name
    assert_same_log_probs(hf, ours, segments())


def test_config_of_the_original_era(tmp_path):
    """`n_token` and `tie_weight` (the original's names, in configs written before transformers renamed them) and
    no `model_type` read as `vocab_size`, `tie_word_embeddings` and 'transfo-xl'."""
    random_hf_model(hf_settings(div_val=4)).save_pretrained(tmp_path / 'new')
    model = MemTransformerLM.from_pretrained(tmp_path / 'new')
    config = json.loads((tmp_path / 'new' / 'config.json').read_text())
    config['n_token'] = config.pop('vocab_size')
    config['tie_weight'] = True
    del config['model_type']
    (tmp_path / 'new' / 'config.json').write_text(json.dumps(config))
    old = MemTransformerLM.from_pretrained(tmp_path / 'new')
    assert old.n_token == N_TOKEN
    assert old.crit.out_layers[1].weight is old.word_emb.emb_layers[1].weight
    for name, value in model.state_dict().items():
        assert torch.equal(old.state_dict()[name], value), name


def test_overrides_replace_the_config(tmp_path):
    random_hf_model(hf_settings(div_val=4)).save_pretrained(tmp_path)
    model = MemTransformerLM.from_pretrained(tmp_path, mem_len=16, same_length=False, impl='reference',
                                             original_numerics=False)
    assert (model.mem_len, model.same_length, model.impl, model.clamp_len) == (16, False, 'reference', 4)
    assert not model.original_numerics


# -- bad input --

@pytest.fixture(scope='module')
def hf_state():
    """The weights and config of a Hugging Face model, to write bad folders from: the weights as its safetensors hold
    them, the softmax's tied to the embedding (all out_layers' weights, the projections but the first) left out."""
    model = random_hf_model(hf_settings(div_val=4))
    tied = {f'crit.out_layers.{i}.weight' for i in range(4)} | {f'crit.out_projs.{i}' for i in range(1, 4)}
    state = {k: v for k, v in model.state_dict().items() if k not in tied}
    return state, model.config.to_dict()


def write_folder(folder, state, config):
    folder.mkdir(exist_ok=True)
    safetensors.torch.save_file(state, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    (folder / 'config.json').write_text(json.dumps(config))
    return folder


@pytest.fixture
def no_weight_read(count_calls):
    """Counts the weights read from a file: a refusal comes before any."""
    counts = count_calls(WeightFiles, ['tensor'])
    yield
    assert counts == {}


def test_bad_folder_is_written_right(tmp_path, hf_state):
    """The good folder the bad ones are made from loads."""
    MemTransformerLM.from_pretrained(write_folder(tmp_path, *hf_state))


def test_folder_without_config(tmp_path):
    with raises(FileNotFoundError, str(tmp_path), 'no config.json', 'model.safetensors'):
        MemTransformerLM.from_pretrained(tmp_path)
    with raises(FileNotFoundError, 'missing', 'does not exist'):
        MemTransformerLM.from_pretrained(tmp_path / 'missing')


def test_config_without_weights(tmp_path, hf_state):
    folder = write_folder(tmp_path, *hf_state)
    (folder / 'model.safetensors').unlink()
    with raises(FileNotFoundError, 'no weights', 'model.safetensors', 'pytorch_model.bin'):
        MemTransformerLM.from_pretrained(folder)


def test_config_of_another_model_type(tmp_path, hf_state):
    state, config = hf_state
    with raises(ValueError, "model_type='gpt2'", "'transfo-xl'"):
        MemTransformerLM.from_pretrained(write_folder(tmp_path, state, {**config, 'model_type': 'gpt2'}))


@pytest.mark.parametrize('change, fragments', [
    (dict(attn_type=2), ['attn_type=2', 'builds only 0']),
    (dict(sample_softmax=64), ['sample_softmax=64', 'no sampled softmax']),
    (dict(layer_norm_epsilon=1e-12), ['layer_norm_epsilon=1e-12', '1e-05']),
    (dict(d_head=None), ["lacks ['d_head']", 'vocab_size (or n_token)']),
    (dict(same_length='true'), ['config.json', "same_length='true'", 'bool']),
])
def test_config_that_cannot_be_represented(tmp_path, hf_state, no_weight_read, change, fragments):
    state, config = hf_state
    config = {**config, **change}
    config = {k: v for k, v in config.items() if v is not None}
    with raises((ValueError, TypeError), *fragments):
        MemTransformerLM.from_pretrained(write_folder(tmp_path, state, config))


def test_weight_of_the_wrong_shape(tmp_path, hf_state, no_weight_read):
    state, config = hf_state
    state = {**state, 'transformer.layers.1.pos_ff.CoreNet.0.bias': torch.zeros(96)}
    with raises(ValueError, 'transformer.layers.1.pos_ff.CoreNet.0.bias', '[96]', '[128]'):
        MemTransformerLM.from_pretrained(write_folder(tmp_path, state, config))


def test_missing_and_unexpected_weights(tmp_path, hf_state, no_weight_read):
    state, config = hf_state
    state = {k: v for k, v in state.items() if k != 'crit.cluster_bias'}
    state['transformer.layers.0.dec_attn.q_net.weight'] = torch.zeros(16, 64)
    with raises(ValueError, 'missing from the file: crit.cluster_bias',
                'not in the model: transformer.layers.0.dec_attn.q_net.weight'):
        MemTransformerLM.from_pretrained(write_folder(tmp_path, state, config))


def test_overrides_that_change_the_shapes(tmp_path, hf_state, no_weight_read):
    with raises(ValueError, 'missing from the file: transformer.layers.2.'):
        MemTransformerLM.from_pretrained(write_folder(tmp_path, *hf_state), n_layer=3)


def test_tied_weights_that_differ(tmp_path, hf_state):
    state, config = hf_state
    state = {**state, 'crit.out_layers.1.weight': torch.zeros_like(state['transformer.word_emb.emb_layers.1.weight'])}
    with raises(ValueError, 'different values', 'transformer.word_emb.emb_layers.1.weight',
                'crit.out_layers.1.weight'):
        MemTransformerLM.from_pretrained(write_folder(tmp_path, state, config))


EXECUTED = []


def _record_execution():
    EXECUTED.append(True)
    return {}


class _CodeInPickle:
    def __reduce__(self):
        return _record_execution, ()


def test_bin_with_pickled_code_is_refused_unexecuted(tmp_path, hf_state):
    state, config = hf_state
    write_folder(tmp_path, state, config)
    (tmp_path / 'model.safetensors').unlink()
    torch.save({**state, 'extra': _CodeInPickle()}, tmp_path / 'pytorch_model.bin')
    with raises(ValueError, 'pytorch_model.bin', 'weights_only=True', '_record_execution'):
        MemTransformerLM.from_pretrained(tmp_path)
    assert EXECUTED == []


@pytest.mark.parametrize('arguments, fragments', [
    (dict(attn_type=4), ['attn_type=4', 'only 0']),
    (dict(norm='rms_norm'), ["norm='rms_norm'", 'LayerNorm']),
    (dict(sample_softmax=8), ['sample_softmax=8', 'adaptive softmax']),
    (dict(ext_len=2, tgt_len=5), ['ext_len=2', 'reset_length']),
])
def test_save_refuses_what_hf_cannot_represent(tmp_path, arguments, fragments):
    model = MemTransformerLM(n_token=N_TOKEN, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0,
                             dropatt=0.0, mem_len=4, **arguments)
    with raises(ValueError, 'Hugging Face', *fragments):
        model.save_pretrained(tmp_path / 'out')
    assert not (tmp_path / 'out').exists()
