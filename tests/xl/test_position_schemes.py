"""
Transformer-XL with every scheme whose positions are relative (`attn_type` 0 the paper's, 1 learned, and the schemes
of the attention, 4 rotary, 5 ALiBi, 6 T5 bias): the recurrence is exact, empty memories change nothing, greedy
generation with memories equals recomputing the whole context; and for the new three the fast path equals the
reference and the settings of the configs reach the model. (The absolute types 2 and 3 are not in this list: their
memory's states were computed at other window positions, so segment-level recurrence is not exact for them, as the
paper says.)
"""
import pytest
import torch

from labml_txl.fast import dispatch
from labml_txl.configs import TransformerXLConfigs
from labml_txl.xl import MemTransformerLM

from tolerance import assert_same_function

from .helpers import small_config

SCHEMES = {'rotary': 4, 'alibi': 5, 't5_bias': 6}
RELATIVE = {'relative': 0, 'learnable': 1, **SCHEMES}


def _model(attn_type: int = 0, n_layer: int = 2, **overrides) -> MemTransformerLM:
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(attn_type=attn_type, n_layer=n_layer, **overrides)).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if 'relative_attention_bias' in name:
                # A bias that differs by bucket (the original's init draws small values)
                parameter.normal_()
    return model


def _assert_recurrence_is_exact(model: MemTransformerLM) -> None:
    """Segment 2 over the memory of segment 1 (the whole of it) gives the states of running both at once."""
    data = torch.randint(40, (10, 2))
    with torch.no_grad():
        both, _ = model.forward_hidden(data)
        first, mems = model.forward_hidden(data[:5])
        second, _ = model.forward_hidden(data[5:], mems)
    # Rule 1: float64 both
    assert_same_function(torch.cat([first, second]), both)


@pytest.mark.parametrize('scheme', RELATIVE)
@pytest.mark.parametrize('n_layer', [1, 3])
def test_the_recurrence_is_exact(scheme, n_layer):
    _assert_recurrence_is_exact(_model(RELATIVE[scheme], n_layer=n_layer, tgt_len=5, mem_len=5))


@pytest.mark.parametrize('scheme', RELATIVE)
def test_empty_memories_are_no_memories(scheme):
    model = _model(RELATIVE[scheme])
    data = torch.randint(40, (5, 2))
    with torch.no_grad():
        none, _ = model.forward_hidden(data)
        empty, _ = model.forward_hidden(data, model.init_mems(2))
    # Exactly: an empty memory adds nothing to compute
    torch.testing.assert_close(empty, none, rtol=0, atol=0)


# The fast implementation of each scheme: SDPA, but for a learned bias while gradients are recorded
FAST = {('rotary', False): 'sdpa', ('rotary', True): 'sdpa', ('alibi', False): 'sdpa', ('alibi', True): 'sdpa',
        ('t5_bias', False): 'sdpa', ('t5_bias', True): 'composite'}


@pytest.mark.parametrize('scheme', SCHEMES)
@pytest.mark.parametrize('grad', [False, True])
def test_fast_equals_reference_over_segments_with_memories(scheme, grad):
    """Losses and gradients of the fast path equal the reference's over three segments with memories (the second and
    third read keys and values kept from the segment before where there are no gradients)."""
    reference = _model(SCHEMES[scheme])
    auto = _model(SCHEMES[scheme])
    reference.impl = 'reference'
    data = torch.randint(40, (5, 2))
    mems_r, mems_a = [], []
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            with dispatch.recording() as reference_choices:
                loss_r, *mems_r = reference(data, data, *mems_r)
            with dispatch.recording() as fast_choices:
                loss_a, *mems_a = auto(data, data, *mems_a)
            # Rule 1: float64 both
            assert_same_function(loss_a, loss_r)
            if grad:
                loss_r.sum().backward()
                loss_a.sum().backward()
            assert {c.chosen for c in reference_choices if c.operation == 'attention'} == {'reference'}
            assert {c.chosen for c in fast_choices if c.operation == 'attention'} == {FAST[scheme, grad]}
    if grad:
        for (name, fast), slow in zip(auto.named_parameters(), reference.parameters()):
            if fast.grad is None or slow.grad is None:
                # (a parameter the scheme does not use has no gradient in either)
                assert fast.grad is None and slow.grad is None, name
            else:
                assert_same_function(fast.grad, slow.grad, msg=name)


@pytest.mark.parametrize('scheme', RELATIVE)
def test_greedy_generation_with_memories_equals_recomputing_the_context(scheme):
    model = _model(RELATIVE[scheme], tgt_len=4, mem_len=64)
    prompt = torch.randint(40, (4, 1))
    with torch.no_grad():
        log_probs, mems = model.log_probs(prompt)
        tokens = prompt[:, 0].tolist()
        for _ in range(6):
            tokens.append(int(log_probs[-1, 0].argmax()))
            log_probs, mems = model.log_probs(torch.tensor([[tokens[-1]]]), mems)
        # The same tokens, each chosen from the whole context at once
        context = torch.tensor(tokens)[:, None]
        full, _ = model.log_probs(context[:-1])
    assert [int(t) for t in full[3:, 0].argmax(-1)] == tokens[4:]


@pytest.mark.parametrize('scheme', SCHEMES)
def test_the_configs_name_the_schemes(labml_experiment, scheme):
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {'attention': scheme, 'n_token': 20, 'n_layer': 1, 'd_model': 8, 'n_head': 2,
                                    'd_head': 4, 'd_inner': 16})
    assert conf.model.attn_type == SCHEMES[scheme]


@pytest.mark.parametrize('overrides, expected', [
    ({'attention': 'rotary', 'rotary_fraction': 0.5}, {'d_rotary': 4}),
    ({'attention': 't5_bias', 't5_num_buckets': 8, 't5_max_distance': 20}, {'num_buckets': 8, 'max_distance': 20}),
])
def test_the_scheme_settings_of_the_configs_reach_the_model(labml_experiment, overrides, expected):
    conf = TransformerXLConfigs()
    labml_experiment.configs(conf, {**overrides, 'n_token': 20, 'n_layer': 1, 'd_model': 16, 'n_head': 2,
                                    'd_head': 8, 'd_inner': 16})
    scheme = conf.model.layers[0].dec_attn.positions
    assert {name: getattr(scheme, name) for name in expected} == expected


def test_partial_rotation_and_other_buckets_keep_the_recurrence_exact():
    for overrides in (dict(attn_type=4, rotary_fraction=0.5), dict(attn_type=6, t5_num_buckets=8, t5_max_distance=6)):
        _assert_recurrence_is_exact(_model(tgt_len=5, mem_len=5, **overrides))


@pytest.mark.parametrize('overrides, message', [
    (dict(rotary_fraction=0.0), r"rotary_fraction=0.0 is not accepted: .* in \(0, 1\]"),
    (dict(rotary_fraction=0.1), r"rotates 0 of the 8 features of a head"),
    (dict(t5_num_buckets=1, t5_max_distance=128), r"t5_num_buckets=1, t5_max_distance=128 are not accepted"),
    (dict(t5_num_buckets=32, t5_max_distance=16), r"t5_num_buckets=32, t5_max_distance=16 are not accepted"),
])
def test_scheme_settings_are_checked_whichever_attention(overrides, message):
    """Checked when the model is built, for every attention type (a wrong setting is a mistake even where unused)."""
    with pytest.raises(ValueError, match=message):
        MemTransformerLM(**small_config(attn_type=0, **overrides))
