"""Sampling with memories: greedy decoding equals recomputing the whole context; the filters keep what they say."""

import pytest
import torch

from labml_txl.fast import dispatch
from labml_txl.xl.generation import filter_distribution, generate
from labml_txl.xl import MemTransformerLM


def small_model(**kwargs):
    model = MemTransformerLM(n_token=23, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0,
                             dropatt=0.0, tgt_len=8, mem_len=8, **kwargs).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # away from the init, so the argmax is not trivial
    return model


@pytest.mark.parametrize('attention', [0, 1])
def test_greedy_generation_equals_recomputing_the_whole_sequence(attention):
    model = small_model(attn_type=attention)
    prompt = torch.randint(23, (5, 3))
    generated = generate(model, prompt, 10, top_k=1, context=64)
    # Naive: run the model over everything so far (memory off), take the argmax of the last position
    sequence = prompt
    model.reset_length(64, 0, 0)
    for _ in range(10):
        log_probs, _ = model.log_probs(sequence, None)
        sequence = torch.cat([sequence, log_probs[-1].argmax(-1)[None]])
    assert torch.equal(generated, sequence[5:])
    assert (model.tgt_len, model.mem_len) == (64, 0), 'generate restored the lengths it found'


@pytest.mark.parametrize('batch', [2, 1])
@pytest.mark.parametrize('attn_type', [0, 1, 2, 3, 4, 5, 6])
def test_greedy_generation_equals_the_plain_paths(attn_type, batch):
    """The fast path (the decoder-layer kernel where it serves, else the modules with their fast paths; the
    memories and kept keys and values in append buffers) against the plain one (`impl='reference'`: the memory joined and projected anew at every
    step), token for token, in float32, batch 2 and batch 1 (whose steps' products have a row per sequence, for our
    few-rows kernel): a context of 12 longer than the prompt of 3, and 42 tokens, the last 33 over a full memory that
    moves through several buffers (room for 12 // 4 rows after each window)."""
    torch.manual_seed(attn_type)
    config = dict(n_token=23, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.1, dropatt=0.1,
                  tgt_len=8, mem_len=8, attn_type=attn_type)
    plain = MemTransformerLM(**config, impl='reference')
    fast = MemTransformerLM(**config)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    fast.load_state_dict(plain.state_dict())
    prompt = torch.randint(23, (3, batch), generator=torch.Generator().manual_seed(1))
    with dispatch.recording() as choices:
        fast_tokens = generate(fast, prompt, 42, top_k=1, context=12)
    plain_tokens = generate(plain, prompt, 42, top_k=1, context=12)
    assert torch.equal(fast_tokens, plain_tokens)
    layers = {c.chosen for c in choices if c.operation == 'decoder layers'}
    attention = {c.chosen for c in choices if c.operation == 'attention'}
    # (the types with a relative table step through the decoder-layer kernel, whose attention is the attention
    # kernel's; the others through their modules, with SDPA)
    if attn_type in (0, 1):
        assert layers == {'fused'} and attention == set()
    else:
        assert layers == {'modules'} and attention == {'sdpa'}
    # (a row per sequence: the few-rows kernel's)
    assert 'few rows' in {c.chosen for c in choices if c.operation == 'linear'}


def test_sampling_is_repeatable_with_a_generator():
    model = small_model()
    prompt = torch.randint(23, (3, 2))
    a = generate(model, prompt, 12, temperature=0.8, generator=torch.Generator().manual_seed(5))
    b = generate(model, prompt, 12, temperature=0.8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == (12, 2)
    assert (model.tgt_len, model.mem_len) == (8, 8)


def test_top_k_keeps_the_k_most_likely():
    log_probs = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    kept = filter_distribution(log_probs, top_k=2).exp()
    torch.testing.assert_close(kept, torch.tensor([0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7]))


def test_top_p_keeps_the_smallest_set_reaching_p():
    log_probs = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    # 0.4 + 0.3 = 0.7 < 0.75, so 0.2 is needed too; 0.1 is not
    kept = filter_distribution(log_probs, top_p=0.75).exp()
    torch.testing.assert_close(kept, torch.tensor([0.0, 0.4, 0.2, 0.3]) / 0.9)
    assert filter_distribution(log_probs, top_p=0.4).exp().tolist() == pytest.approx([0, 1, 0, 0])


def test_temperature_sharpens():
    log_probs = torch.log(torch.tensor([0.25, 0.75]))
    cold = filter_distribution(log_probs, temperature=0.5).exp()
    assert cold[1].item() == pytest.approx(0.75 ** 2 / (0.75 ** 2 + 0.25 ** 2))


@pytest.mark.parametrize('kwargs,message', [({'temperature': 0}, 'temperature=0 is not accepted'),
                                            ({'top_p': 0}, 'top_p=0 is not accepted'),
                                            ({'top_k': -1}, 'top_k=-1 is not accepted')])
def test_bad_sampling_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        filter_distribution(torch.zeros(3), **kwargs)


def test_a_context_the_compressed_memory_cannot_be_made_of_is_refused_naming_context():
    """The user gives `context`, never `mem_len`: a refusal names what they gave, and the model is left as it was."""
    model = small_model(cmem_len=4, compression_rate=3).train()
    with pytest.raises(ValueError, match=r"^context=2 is not accepted for this model: while it samples, its memory "
                                         r"holds the last `context` positions \(mem_len=context\), and cmem_len=4 is "
                                         r"not accepted with mem_len=2 and compression_rate=3"):
        generate(model, torch.zeros(3, 1, dtype=torch.long), 4, context=2)
    assert (model.tgt_len, model.mem_len, model.training) == (8, 8, True)
    assert generate(model, torch.zeros(3, 1, dtype=torch.long), 4, context=3).shape[0] == 4  # (the new tokens)
