"""
The keys and values kept between evaluation segments (`xl/kv_memo.py`) when the memory is longer than a segment:
kept in an append buffer whose window moves on, against the plain path, which projects the whole memory again at
every segment.
"""
from collections import Counter

import pytest
import torch

from labml_txl.fast import dispatch

from .helpers import assert_the_same_step, plain_and_fast


def _pair(dtype, **overrides):
    return tuple(model.to(dtype).eval() for model in plain_and_fast(**overrides))

@pytest.mark.parametrize('dtype', [torch.float64, torch.float32], ids=['float64', 'float32'])
@pytest.mark.parametrize('qlen', [1, 3], ids=['one-token', 'segments-of-3'])
@pytest.mark.parametrize('attn_type', [0, 1])
def test_kept_window_over_many_segments_equals_the_plain_path(dtype, qlen, attn_type):
    """A memory of 12 positions over 40 positions in steps of `qlen`: the window moves through its buffer and is
    copied to a new one whenever the room runs out (several times here), and every step equals the plain path
    (float32 runs the decoder-layer kernel, float64 the modules with SDPA)."""
    plain, fast = _pair(dtype, attn_type=attn_type, mem_len=12, tgt_len=qlen)
    data = torch.randint(40, (41, 2), generator=torch.Generator().manual_seed(1))
    plain_mems, fast_mems, buffers = None, None, []
    with torch.no_grad(), dispatch.recording() as choices:
        for start in range(0, 40, qlen):
            x = data[start:start + qlen]
            klen = qlen + (0 if plain_mems is None else plain_mems[0].shape[0])
            plain_log_probs, plain_mems = plain.log_probs(x, plain_mems)
            fast_log_probs, fast_mems = fast.log_probs(x, fast_mems)
            assert_the_same_step(fast, klen, fast_log_probs, plain_log_probs, fast_mems, plain_mems)
            buffers.append(fast._memory.keys_values.entries[0][3])
    layers = Counter(c.chosen for c in choices if c.operation == 'decoder layers')
    attention = Counter(c.chosen for c in choices if c.operation == 'attention')
    steps = len(range(0, 40, qlen))
    if dtype == torch.float32:
        # The fast model's layers in one call of the decoder-layer kernel a step (with the kept keys and values), the
        # plain's by their modules
        assert layers == {'fused': steps, 'modules': steps} and attention == {'reference': 2 * steps}
    else:
        assert layers == {'modules': 2 * steps} and attention == {'sdpa': 2 * steps, 'reference': 2 * steps}
    # Once the memory is full, each buffer serves the step that made it and then `room // qlen` steps that append
    # to it (room = max(qlen, 12 // 4) rows), before the window moves to a new one
    full = buffers[12 // qlen:]
    assert all(b is not None for b in full)
    runs = [1]
    for previous, current in zip(full, full[1:]):
        if current is previous:
            runs[-1] += 1
        else:
            runs.append(1)
    assert len(runs) >= 3 and set(runs[1:-1]) == {1 + max(qlen, 3) // qlen}


@pytest.mark.parametrize('qlen', [1, 3], ids=['one-token', 'segments-of-3'])
def test_branching_from_one_memory_recomputes_and_matches(qlen):
    """Two steps evaluated from the same memory tensor (a search that branches), then one more from the second
    branch's memory: the second branch is not given the keys and values the first left (they belong to the first
    branch's new memory), its own are kept from its own memory, and every step equals the plain path."""
    plain, fast = _pair(torch.float32, mem_len=12, tgt_len=qlen)
    data = torch.randint(40, (12 + 4 * qlen, 2), generator=torch.Generator().manual_seed(2))
    segments = [data[:12]] + [data[12 + i * qlen:12 + (i + 1) * qlen] for i in range(4)]

    def step(x, fast_mems, plain_mems):
        klen = x.shape[0] + (0 if plain_mems is None else plain_mems[0].shape[0])
        fast_out, fast_mems = fast.log_probs(x, fast_mems)
        plain_out, plain_mems = plain.log_probs(x, plain_mems)
        assert_the_same_step(fast, klen, fast_out, plain_out)
        return fast_mems, plain_mems

    with torch.no_grad():
        mems = step(segments[0], None, None)
        mems = step(segments[1], *mems)
        step(segments[2], *mems)
        second_branch = step(segments[3], *mems)
        step(segments[4], *second_branch)


@pytest.mark.parametrize('clamp_len', [-1, 5], ids=['no-clamp', 'clamp-5'])
def test_one_token_steps_project_the_relative_table_once(clamp_len):
    """Greedy generation over a growing context: every step's table `klen - 1 .. 0` is the last rows of the one kept
    table, so $W_{k,R} R$ (`r_net`) is projected by the prompt's call alone, once per layer, and every step still
    equals the plain path, which projects each step's own table (float64: the same function)."""
    plain, fast = _pair(torch.float64, attn_type=0, mem_len=12, tgt_len=4, clamp_len=clamp_len)
    projected = Counter()
    for i, layer in enumerate(fast.layers):
        layer.dec_attn.r_net.register_forward_hook(lambda module, inputs, output, i=i: projected.update([i]))
    prompt = torch.randint(40, (4, 2), generator=torch.Generator().manual_seed(2))
    plain_mems, fast_mems, x = None, None, prompt
    with torch.no_grad():
        for step in range(10):
            plain_log_probs, plain_mems = plain.log_probs(x, plain_mems)
            fast_log_probs, fast_mems = fast.log_probs(x, fast_mems)
            assert_the_same_step(fast, x.shape[0] + (step and plain_mems[0].shape[0]), fast_log_probs,
                                 plain_log_probs, fast_mems, plain_mems)
            if step == 0:
                assert projected == {i: 1 for i in range(len(fast.layers))}
            x = fast_log_probs[-1].argmax(-1)[None]
    assert projected == {i: 1 for i in range(len(fast.layers))}
