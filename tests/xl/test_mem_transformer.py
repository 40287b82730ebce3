"""
`MemTransformerLM` beyond the reference vectors: the clean API, memories, `untie_r`, absolute attention with
memory, half precision.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labml_txl.fast.dispatch import Plan
from labml_txl.positions.encoding import sinusoidal_embeddings
from labml_txl.xl import MemTransformerLM
from tolerance import assert_close_rounding, assert_same_function

from .helpers import small_config, small_model

ATTN_TYPES = [0, 1, 2, 3]
SOFTMAXES = {
    'plain': {},
    'adaptive_div2': dict(d_embed=16, div_val=2, cutoffs=[10, 25], tie_projs=[False, True, True]),
    'adaptive_div1_proj': dict(d_embed=12, cutoffs=[20], tie_projs=[False, True]),
    'untied_weights': dict(tie_weight=False, cutoffs=[20]),
    'sampled_softmax': dict(sample_softmax=8),
}


def tokens(seq, bsz, n_token=40, seed=0):
    return torch.randint(0, n_token, (seq, bsz), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize('softmax', list(SOFTMAXES))
def test_log_probs_at_targets_are_minus_loss(softmax):
    model = small_model(**SOFTMAXES[softmax])
    data = tokens(12, 3)
    mems = []
    for start in (0, 5):
        inp, target = data[start:start + 5], data[start + 1:start + 6]
        loss, *new_mems = model(inp, target, *mems)
        log_probs, api_mems = model.log_probs(inp, mems)
        assert log_probs.shape == (5, 3, 40)
        # a distribution over the whole vocabulary at every position
        assert_same_function(log_probs.exp().sum(-1), torch.ones(5, 3, dtype=torch.float64))
        torch.testing.assert_close(log_probs.gather(2, target[:, :, None]).squeeze(2), -loss, atol=1e-12, rtol=0)
        logits, _ = model.logits(inp, mems)
        torch.testing.assert_close(logits.log_softmax(-1), log_probs, atol=1e-12, rtol=0)
        hidden, hidden_mems = model.forward_hidden(inp, mems)
        assert hidden.shape == (5, 3, 16)
        for a, b, c in zip(new_mems, api_mems, hidden_mems):
            assert torch.equal(a, b) and torch.equal(a, c)
        mems = new_mems


def test_forward_hidden_without_memory_length():
    model = small_model(mem_len=0)
    hidden, mems = model.forward_hidden(tokens(5, 2))
    assert hidden.shape == (5, 2, 16) and mems == []
    assert len(model(tokens(5, 2), tokens(5, 2, seed=1))) == 1


@pytest.mark.parametrize('attn_type', ATTN_TYPES)
@pytest.mark.parametrize('mem_len,ext_len,tgt_lens', [(4, 0, [3, 3, 3, 3]), (7, 2, [5, 5, 5]), (3, 0, [6, 2, 6]),
                                                      (6, 0, [1] * 20)])
@pytest.mark.parametrize('training', [True, False], ids=['training', 'no-grad-evaluation'])
def test_memories_bounded_detached_and_never_changed(attn_type, mem_len, ext_len, tgt_lens, training):
    """In training, and in no-grad evaluation, where the memories are windows of append buffers that later segments
    write after (one-token steps go through several buffers here)."""
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(attn_type=attn_type, mem_len=mem_len, ext_len=ext_len, tgt_len=6,
                                            dropout=0.1, dropatt=0.1)).double().train(training)
    data = tokens(sum(tgt_lens) + 1, 2)
    mems, history, start, appended = [], [], 0, 0
    for tgt_len in tgt_lens:
        if (model.tgt_len, model.ext_len, model.mem_len) != (tgt_len, ext_len, mem_len):
            model.reset_length(tgt_len, ext_len, mem_len)
        inp = data[max(0, start - ext_len):start + tgt_len]
        before = mems
        with torch.set_grad_enabled(training):
            loss, *mems = model(inp, data[start + 1:start + 1 + tgt_len], *mems)
        if training:
            loss.mean().backward()
        # (a memory written after the one before, in the same storage)
        appended += sum(m.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for m, b in zip(mems, before))
        assert len(mems) == model.n_layer + 1
        for m in mems:
            assert m.shape[0] <= mem_len and m.shape[1:] == (2, 16)
            assert not m.requires_grad and m.grad_fn is None
        history.append((mems, [m.clone() for m in mems]))
        start += tgt_len
    # no later segment changed an earlier segment's memories in place
    for returned, copies in history:
        for m, c in zip(returned, copies):
            assert torch.equal(m, c)
    # (only no-grad evaluation writes memories after the ones before, here where every memory keeps rows of the one
    # before)
    assert (appended > 0) == (not training and mem_len > max(tgt_lens))


@pytest.mark.parametrize('attn_type', ATTN_TYPES)
def test_same_memories_give_same_result(attn_type):
    """Running a segment twice on the same memories gives the same loss (nothing cached was modified)."""
    model = small_model(attn_type=attn_type, tgt_len=4, mem_len=4)
    data = tokens(9, 2)
    _, *mems = model(data[:4], data[1:5])
    first = model(data[4:8], data[5:9], *mems)[0]
    second = model(data[4:8], data[5:9], *mems)[0]
    assert torch.equal(first, second)


@pytest.mark.parametrize('attn_type,n_layer', [(0, 3), (1, 3), (2, 1), (3, 1)])
def test_memory_equals_recomputing_the_window(attn_type, n_layer):
    """
    Segment 2 over the memory of segment 1 scores its tokens as one pass over both segments without memory
    (same window, same causal mask, same positions). The relative types are translation-invariant, so this
    holds for any depth; the absolute types count positions back from the window's end, so the deeper layers'
    cached states (computed in a shorter window) differ, and the check is exact for one layer. It fails for
    the original's type 2/3, which add positions in place into the cached tensors (twice on reuse).
    """
    L = 4
    model = small_model(attn_type=attn_type, n_layer=n_layer, tgt_len=L, mem_len=L, seed=1)
    data = tokens(2 * L + 1, 3, seed=2)
    _, *mems = model(data[:L], data[1:L + 1])
    with_memory = model(data[L:2 * L], data[L + 1:2 * L + 1], *mems)[0]
    model.reset_length(2 * L, 0, 0)
    whole = model(data[:2 * L], data[1:2 * L + 1])[0]
    torch.testing.assert_close(with_memory, whole[L:], atol=1e-12, rtol=0)


def test_absolute_memories_hold_no_positions():
    """Type 2 caches the layer-0 input without position embeddings: the dropped-out word embeddings."""
    model = small_model(attn_type=2)
    data = tokens(6, 2)
    _, *mems = model(data[:5], data[1:6])
    assert_same_function(mems[0], model.word_emb(data[:5]))


def untie(tied: MemTransformerLM, seed: int = 5) -> MemTransformerLM:
    """An `untie_r=True` copy of `tied` with every layer's biases set to the shared ones."""
    torch.manual_seed(seed)
    untied = MemTransformerLM(**small_config(untie_r=True)).double().eval()
    state = {k: v for k, v in tied.state_dict().items() if k not in ('r_w_bias', 'r_r_bias')}
    missing, unexpected = untied.load_state_dict(state, strict=False)
    assert unexpected == []
    assert sorted(missing) == sorted(f'layers.{i}.dec_attn.{n}' for i in range(2) for n in ('r_w_bias', 'r_r_bias'))
    with torch.no_grad():
        for layer in untied.layers:
            layer.dec_attn.r_w_bias.copy_(tied.r_w_bias)
            layer.dec_attn.r_r_bias.copy_(tied.r_r_bias)
    return untied


def test_untie_r_runs_and_equals_tied_when_biases_agree():
    tied = small_model()
    untied = untie(tied)
    assert 'r_w_bias' not in dict(untied.named_parameters())
    data = tokens(11, 2)
    mems_t, mems_u = [], []
    for start in (0, 5):
        inp, target = data[start:start + 5], data[start + 1:start + 6]
        loss_t, *mems_t = tied(inp, target, *mems_t)
        loss_u, *mems_u = untied(inp, target, *mems_u)
        torch.testing.assert_close(loss_u, loss_t, atol=1e-12, rtol=0)
    # per-layer biases learn separately
    untied.train()
    loss_u.sum().backward()
    assert untied.layers[0].dec_attn.r_w_bias.grad is not None
    assert not torch.equal(untied.layers[0].dec_attn.r_r_bias.grad, untied.layers[1].dec_attn.r_r_bias.grad)
    # and differ once they differ
    with torch.no_grad():
        untied.layers[1].dec_attn.r_w_bias.add_(0.5)
    difference = untied(data[:5], data[1:6])[0] - tied(data[:5], data[1:6])[0]
    # (another function: far beyond float64's rounding of losses of size ~4, 1e-15)
    assert difference.abs().max() > 1e-8


@pytest.mark.parametrize('attn_type', ATTN_TYPES)
def test_bf16_forward_is_finite(attn_type):
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(attn_type=attn_type, d_embed=16, div_val=2, cutoffs=[10, 25],
                                            tie_projs=[False, True, True], same_length=True, tgt_len=6,
                                            mem_len=6)).to(torch.bfloat16).eval()
    data = tokens(13, 2)
    mems = []
    for start in (0, 6):
        loss, *mems = model(data[start:start + 6], data[start + 1:start + 7], *mems)
        assert loss.dtype == torch.bfloat16 and torch.isfinite(loss).all()
        assert all(m.dtype == torch.bfloat16 and torch.isfinite(m).all() for m in mems)


def test_bf16_positions_are_exact_for_long_windows():
    """Distances above 256 are not integers in bf16; they are computed in float32 and only the result is cast."""
    model = small_model(mem_len=300, tgt_len=20)
    emb = model._model_positions.shared(model, Plan.now(torch.device('cpu'), 'reference'), 320, 320,
                                        torch.empty(0, dtype=torch.bfloat16))
    expected = sinusoidal_embeddings(torch.arange(319, -1, -1.0, dtype=torch.float64),
                                     model.pos_emb.inv_freq.double())
    # bf16 (tolerance.py's rule 2): one rounding of each value, of size at most 1, to bf16 (depth 1); float32's error
    # in the angles (up to 319, 2^-24 of them a rounding) is far below it. Distances rounded to bf16 (steps of 2 above
    # 256) would be off by up to 1 radian
    assert_close_rounding(emb[:, 0], expected, dtype=torch.bfloat16, depth=1, magnitude=1)


@pytest.mark.parametrize('attn_type', ATTN_TYPES)
@pytest.mark.parametrize('pre_lnorm', [False, True])
def test_training_step_gives_finite_gradients(attn_type, pre_lnorm):
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(attn_type=attn_type, pre_lnorm=pre_lnorm, dropout=0.2, dropatt=0.2,
                                            clamp_len=3)).train()
    data = tokens(11, 2)
    loss, *mems = model(data[:5], data[1:6])
    loss, *mems = model(data[5:10], data[6:11], *mems)
    loss.mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize('softmax', ['plain', 'adaptive_div2'])
def test_generation_step_by_step_equals_one_pass(softmax):
    """Feeding one token at a time through the memory gives the log-probabilities of one pass over all."""
    model = small_model(mem_len=20, **SOFTMAXES[softmax])
    sequence = tokens(9, 2, seed=3)
    whole, _ = model.log_probs(sequence)
    log_probs, mems = model.log_probs(sequence[:4])
    steps = [log_probs]
    for t in range(4, 9):
        log_probs, mems = model.log_probs(sequence[t:t + 1], mems)
        steps.append(log_probs)
    torch.testing.assert_close(torch.cat(steps), whole, atol=1e-12, rtol=0)
    # and the documented sampling loop runs
    token = whole[-1].exp().multinomial(1).T
    assert token.shape == (1, 2)
    assert model.log_probs(token, mems)[0].shape == (1, 2, 40)


@pytest.mark.parametrize('attn_type', [0, 1, 2])
def test_plain_path_softmax_is_the_originals(attn_type):
    """`impl='reference'` is the original's computation down to its passes: one masked fill of the scores per layer
    before the softmax, none after it (the model's masks leave every query a key, so the fill that gives fully
    masked rows zero weights is left out)."""
    model = small_model(attn_type=attn_type, impl='reference')
    fills = []

    class CountFills(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.masked_fill.Scalar, torch.ops.aten.masked_fill_.Scalar):
                fills.append(func)
            return func(*args, **(kwargs or {}))

    data = torch.randint(40, (5, 2))
    with torch.no_grad(), CountFills():
        model(data, data)
    assert len(fills) == model.n_layer
