"""
The fused decoder layers (`xl/fused_step.py`, `native/decoder_layer.cpp`): segments of a few rows (generation's
steps) run all layers in one call of the decoder-layer kernel. Against the plain path (`impl='reference'`: the
original's computation, the memory joined and projected anew at every step) over many steps with memories, for each
configuration it serves; then each reason it is refused, where the layers' modules run instead and give the plain
path's numbers.
"""
from collections import Counter

import pytest
import torch

from labml_txl.fast import dispatch, native
from labml_txl.xl import MemTransformerLM
from labml_txl.xl.positionwise_ff import PositionwiseFF
from labml_txl.xl.attention import XLAttention

from .helpers import assert_the_same_step, small_config


def _pair(**overrides):
    """The plain and the fast model with the same weights, moved away from the initialisation (so that every term
    of the attention weighs), in evaluation mode."""
    torch.manual_seed(0)
    config = small_config(**{'mem_len': 8, **overrides})
    plain = MemTransformerLM(**config, impl='reference')
    with torch.no_grad():
        for parameter in plain.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    fast = MemTransformerLM(**config)
    fast.load_state_dict(plain.state_dict())
    return plain.eval(), fast.eval()


def _layer_choices(choices):
    return [c for c in choices if c.operation == 'decoder layers']

def _fast_choices(plain, fast, data, qlen, grad=False):
    """Both models over `data` in segments of `qlen`, each feeding its memories back: log-probabilities and memories
    equal at every step. Returns the choices the fast model made."""
    plain_mems, fast_mems, recorded = None, None, []
    with torch.set_grad_enabled(grad):
        for start in range(0, data.shape[0] - qlen + 1, qlen):
            x = data[start:start + qlen]
            klen = qlen + (0 if plain_mems is None else plain_mems[0].shape[0])
            plain_log_probs, plain_mems = plain.log_probs(x, plain_mems)
            with dispatch.recording() as choices:
                fast_log_probs, fast_mems = fast.log_probs(x, fast_mems)
            recorded += choices
            assert_the_same_step(fast, klen, fast_log_probs, plain_log_probs, fast_mems, plain_mems)
    return recorded


SERVED = [dict(attn_type=0), dict(attn_type=1), dict(attn_type=0, pre_lnorm=True),
          dict(attn_type=1, pre_lnorm=True), dict(attn_type=0, untie_r=True), dict(attn_type=0, same_length=True),
          dict(attn_type=1, same_length=True, mem_len=3), dict(attn_type=0, clamp_len=4)]


@pytest.mark.parametrize('qlen, batch', [(1, 1), (1, 2), (3, 2)], ids=['one-token', 'one-token-batch-2', '3x2'])
@pytest.mark.parametrize('overrides', SERVED, ids=lambda c: '-'.join(f'{k}={v}' for k, v in c.items()))
def test_fused_steps_equal_the_plain_path(overrides, qlen, batch):
    """31 positions in steps of `qlen` behind a memory of 8 (or 3), which moves through several append buffers:
    every step's layers are one fused call, and each step's log-probabilities and memories are the plain path's."""
    plain, fast = _pair(**overrides)
    data = torch.randint(40, (31, batch), generator=torch.Generator().manual_seed(1))
    choices = _fast_choices(plain, fast, data, qlen)
    steps = len(range(0, 31 - qlen + 1, qlen))
    assert Counter(c.chosen for c in _layer_choices(choices)) == {'fused': steps}
    # (nothing of the layers is chosen operation by operation: the softmax's product is all that is left)
    assert {c.operation for c in choices} <= {'decoder layers', 'linear', 'dropout'}


def test_greedy_generation_through_fused_layers_equals_recomputing_the_context():
    """Without memories at all: each token from the whole sequence so far in one pass of the plain path (the
    independent computation), against `generate`'s fused one-token steps over a context that holds it all."""
    from labml_txl.xl.generation import generate

    plain, fast = _pair(attn_type=0, mem_len=0)
    prompt = torch.randint(40, (4, 1), generator=torch.Generator().manual_seed(2))
    with dispatch.recording() as choices:
        generated = generate(fast, prompt, 20, top_k=1, context=64)
    assert {c.chosen for c in _layer_choices(choices)} == {'fused'}
    sequence = prompt[:, 0]
    with torch.no_grad():
        for _ in range(20):
            log_probs, _ = plain.log_probs(sequence[:, None])
            sequence = torch.cat([sequence, log_probs[-1, 0].argmax()[None]])
    assert torch.equal(generated[:, 0], sequence[4:])


# -- refused: the modules run, with the reason recorded --

class _OwnFeedForward(PositionwiseFF):
    """A feed-forward network whose `forward` is the user's (the same numbers, written elsewhere)."""

    def forward(self, inp, *, plan=None):
        return super().forward(inp, plan=plan)


class _OwnScores(XLAttention):
    """An attention whose scores are the user's `get_scores` (the same numbers)."""

    def get_scores(self, query, key, terms):
        return super().get_scores(query, key, terms) * 1.0


def _refusal_of(fast, plain, data, qlen):
    """The reasons the fast model's calls over `data` in segments of `qlen` ran the modules (all of them must)."""
    choices = _layer_choices(_fast_choices(plain, fast, data, qlen))
    assert [c.chosen for c in choices] == ['modules'] * len(choices)
    return [dict(c.refused)['fused'] for c in choices]


def test_a_hook_on_any_module_of_a_layer_keeps_the_modules():
    """A forward hook (an interpretability probe) on the last layer's feed-forward network: the layers run their
    modules, and the hook sees every step."""
    plain, fast = _pair()
    seen = []
    fast.layers[1].pos_ff.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    reasons = _refusal_of(fast, plain, torch.randint(40, (6, 2)), 1)
    assert reasons == ['layer 1: a module of the layer has hooks, which the fused call would not run'] * 6
    assert seen == [torch.Size([1, 2, 16])] * 6


def test_a_global_hook_keeps_the_modules():
    plain, fast = _pair()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        reasons = _refusal_of(fast, plain, torch.randint(40, (3, 2)), 1)
    finally:
        handle.remove()
    assert len(reasons) == 3 and all('layer 0' in reason and 'hooks' in reason for reason in reasons)


@pytest.mark.parametrize('replace, expected', [
    (lambda layer: setattr(layer.pos_ff, '__class__', _OwnFeedForward), 'overrides forward'),
    (lambda layer: setattr(layer.dec_attn, '__class__', _OwnScores), 'get_scores'),
], ids=['own-forward', 'own-get_scores'])
def test_a_users_subclass_keeps_the_modules_that_call_it(replace, expected):
    plain, fast = _pair()
    replace(fast.layers[0])
    reasons = _refusal_of(fast, plain, torch.randint(40, (5, 2)), 1)
    assert len(reasons) == 5 and all(expected in reason for reason in reasons)


@pytest.mark.parametrize('overrides, qlen, batch, expected', [
    (dict(attn_type=2), 1, 2, 'attention types 2 to 6'),
    (dict(attn_type=3), 1, 2, 'attention types 2 to 6'),
    (dict(attn_type=4), 1, 2, 'attention types 2 to 6'),
    (dict(attn_type=5), 1, 2, 'attention types 2 to 6'),
    (dict(attn_type=6), 1, 2, 'attention types 2 to 6'),
    (dict(norm='rms_norm'), 1, 2, 'RMSNorm'),
    (dict(), 5, 4, '20 rows'),
], ids=['type-2', 'type-3', 'type-4', 'type-5', 'type-6', 'rms_norm', '20-rows'])
def test_what_the_kernel_does_not_compute_runs_the_modules(overrides, qlen, batch, expected):
    plain, fast = _pair(**overrides)
    reasons = _refusal_of(fast, plain, torch.randint(40, (3 * qlen, batch)), qlen)
    assert len(reasons) == 3 and all(expected in reason for reason in reasons), reasons


def test_a_memory_the_model_did_not_return_is_projected_by_the_modules():
    """Memories that are copies of the returned ones have no kept keys and values: the modules project them (the
    first step, no memory, and the step after a returned memory are fused)."""
    plain, fast = _pair()
    data = torch.randint(40, (3, 2))
    with torch.no_grad():
        expected, _ = plain.log_probs(data[2:3], plain.log_probs(data[1:2], plain.log_probs(data[:1])[1])[1])
        with dispatch.recording() as choices:
            _, mems = fast.log_probs(data[:1])
            _, returned = fast.log_probs(data[1:2], [m.clone() for m in mems])
            log_probs, _ = fast.log_probs(data[2:3], returned)
    # (the third step: one query behind two of memory)
    assert_the_same_step(fast, 3, log_probs, expected)
    layers = _layer_choices(choices)
    assert [c.chosen for c in layers] == ['fused', 'modules', 'fused']
    assert 'layer 0: the memory\'s keys and values are not kept' in dict(layers[1].refused)['fused']


@pytest.mark.parametrize('how, expected', [
    ('gradients', 'gradients are recorded'),
    ('disabled', 'our kernels are disabled'),
    ('reference', "impl='reference'"),
    ('float64', 'float32'),
    ('dropout', 'dropout in training'),
])
def test_the_run_can_refuse_it(how, expected):
    """What the run asks for: gradients, our kernels off, the reference, float64, dropout in training; the modules
    give the plain path's numbers (dropout aside: it draws its own masks)."""
    plain, fast = _pair(dropout=0.1 if how == 'dropout' else 0.0)
    data = torch.randint(40, (3, 2))
    if how == 'float64':
        plain, fast = plain.double(), fast.double()
    if how == 'reference':
        fast.impl = 'reference'
    if how == 'dropout':
        fast.train()
        with torch.no_grad(), dispatch.recording() as choices:
            fast.log_probs(data[:1], fast.log_probs(data[1:2])[1])
        layers = _layer_choices(choices)
    else:
        with native.disabled() if how == 'disabled' else torch.no_grad():
            layers = _layer_choices(_fast_choices(plain, fast, data, 1, grad=how == 'gradients'))
    assert len(layers) == (2 if how == 'dropout' else 3)
    assert all(c.chosen == 'modules' and expected in dict(c.refused)['fused'] for c in layers), layers


def test_weights_changed_or_replaced_between_steps_are_the_ones_used():
    """Between fused steps, a projection changed in place (the kept keys and values are then stale: that step's
    memory is projected by the modules) and a parameter replaced by a new one (what the kernel reads is gathered
    again): each step equals the plain path with the same change."""
    plain, fast = _pair()
    data = torch.randint(40, (6, 2), generator=torch.Generator().manual_seed(3))
    plain_mems, fast_mems, chosen = None, None, []
    with torch.no_grad():
        for t in range(6):
            if t == 2:
                for model in (plain, fast):
                    model.layers[0].dec_attn.qkv_net.weight.mul_(1.5)
            if t == 4:
                replacement = torch.randn(plain.layers[1].dec_attn.o_net.weight.shape)
                for model in (plain, fast):
                    model.layers[1].dec_attn.o_net.weight = torch.nn.Parameter(replacement.clone())
            plain_log_probs, plain_mems = plain.log_probs(data[t:t + 1], plain_mems)
            with dispatch.recording() as choices:
                fast_log_probs, fast_mems = fast.log_probs(data[t:t + 1], fast_mems)
            chosen += [c.chosen for c in _layer_choices(choices)]
            # (one query behind the memory: t keys, at most mem_len)
            assert_the_same_step(fast, 1 + min(t, fast.mem_len), fast_log_probs, plain_log_probs)
    # (the in-place change leaves the keys and values kept before it stale for one step; the replaced parameter
    # changes the layer's slots, so what the kernel reads is gathered again and the kept ones are stale too)
    assert chosen == ['fused', 'fused', 'modules', 'fused', 'modules', 'fused']
