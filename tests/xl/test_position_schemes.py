"""
Transformer-XL with the positional schemes of the attention (`attn_type` 4 rotary, 5 ALiBi, 6 T5 bias): the
recurrence is exact, empty memories change nothing, the fast path equals the reference, and greedy generation with
memories equals recomputing the whole context.
"""
import pytest
import torch

from labml_txl import dispatch
from labml_txl.configs import TransformerXLConfigs
from labml_txl.xl import MemTransformerLM

from .helpers import small_config

SCHEMES = {'rotary': 4, 'alibi': 5, 't5_bias': 6}


def _model(attn_type: int, n_layer: int = 2, **overrides) -> MemTransformerLM:
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(attn_type=attn_type, n_layer=n_layer, **overrides)).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if 'relative_attention_bias' in name:
                # A bias that differs by bucket (the original's init draws small values)
                parameter.normal_()
    return model


@pytest.mark.parametrize('scheme', SCHEMES)
@pytest.mark.parametrize('n_layer', [1, 3])
def test_the_recurrence_is_exact(scheme, n_layer):
    """Segment 2 over the memory of segment 1 (the whole of it) gives the states of running both at once."""
    model = _model(SCHEMES[scheme], n_layer=n_layer, tgt_len=5, mem_len=5)
    data = torch.randint(40, (10, 2))
    with torch.no_grad():
        both, _ = model.forward_hidden(data)
        first, mems = model.forward_hidden(data[:5])
        second, _ = model.forward_hidden(data[5:], mems)
    torch.testing.assert_close(torch.cat([first, second]), both, rtol=0, atol=1e-10)


@pytest.mark.parametrize('scheme', SCHEMES)
def test_empty_memories_are_no_memories(scheme):
    model = _model(SCHEMES[scheme])
    data = torch.randint(40, (5, 2))
    with torch.no_grad():
        none, _ = model.forward_hidden(data)
        empty, _ = model.forward_hidden(data, model.init_mems(2))
    torch.testing.assert_close(empty, none, rtol=0, atol=0)


@pytest.mark.parametrize('scheme', SCHEMES)
@pytest.mark.parametrize('grad', [False, True])
def test_fast_equals_reference_over_segments_with_memories(scheme, grad):
    reference = _model(SCHEMES[scheme])
    auto = _model(SCHEMES[scheme])
    reference.impl = 'reference'
    data = torch.randint(40, (5, 2))
    mems_r, mems_a = [], []
    with torch.set_grad_enabled(grad), dispatch.recording() as choices:
        for _ in range(3):
            loss_r, *mems_r = reference(data, data, *mems_r)
            loss_a, *mems_a = auto(data, data, *mems_a)
            torch.testing.assert_close(loss_a, loss_r, rtol=0, atol=1e-10)
    assert {c.chosen for c in choices if c.operation == 'attention'} == {'reference'}


@pytest.mark.parametrize('scheme', SCHEMES)
def test_greedy_generation_with_memories_equals_recomputing_the_context(scheme):
    model = _model(SCHEMES[scheme], tgt_len=4, mem_len=64)
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
