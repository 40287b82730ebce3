"""
The fast paths of Transformer-XL (`docs/performance.md`) against the plain computation: the shift as a view,
head-major scores, SDPA, cached positions and masks, `torch.compile`, one-token generation, bf16 autocast, and
a smoke run of `experiments/benchmark.py`. No test looks at wall-clock time.
"""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from labml_txl import native
from labml_txl.attention_mask import subsequent_mask
from labml_txl.generation import generate
from labml_txl.native import attention as native_attention
from labml_txl.relative_attention import (CausalPositionBias, masked_softmax_heads, pad_table,
                                          relative_attention_scores, relative_attention_scores_heads,
                                          relative_attention_sdpa, relative_attention_weights_heads, relative_shift,
                                          relative_shift_view)
from labml_txl.relative_mha import RelativeMultiHeadAttention
from labml_txl.xl import MemTransformerLM

from xl.helpers import plain_and_fast, reference_files, small_config

ROOT = Path(__file__).resolve().parents[1]


# -- the shared math --

@pytest.mark.parametrize('qlen,klen', [(1, 1), (3, 3), (3, 7), (5, 9), (4, 4)])
def test_shift_view_equals_pad_and_copy_on_the_causal_part(qlen, klen):
    x = torch.randn(2, 3, qlen, klen, dtype=torch.float64)
    # The plain shift works on `[qlen, rlen, ...]`
    expected = relative_shift(x.permute(2, 3, 0, 1)).permute(2, 3, 0, 1)
    shifted = relative_shift_view(pad_table(x.transpose(-1, -2), klen).transpose(-1, -2).contiguous(), klen)
    mlen = klen - qlen
    for i in range(qlen):
        assert torch.equal(shifted[..., i, :mlen + i + 1], expected[..., i, :mlen + i + 1])


@pytest.mark.parametrize('qlen,klen', [(1, 1), (3, 3), (5, 9), (6, 2)])
def test_shift_view_equals_pad_and_copy_for_an_encoder_table(qlen, klen):
    x = torch.randn(2, qlen, klen + qlen - 1, dtype=torch.float64)
    expected = relative_shift(x.permute(1, 2, 0)).permute(2, 0, 1)[..., :klen]
    shifted = relative_shift_view(pad_table(x.transpose(-1, -2), klen).transpose(-1, -2).contiguous(), klen)
    assert torch.equal(shifted, expected)


def test_shift_view_refuses_a_short_table():
    with pytest.raises(ValueError, match='klen \\+ 1'):
        relative_shift_view(torch.zeros(3, 4), 4)


@pytest.mark.parametrize('bidirectional', [False, True])
def test_head_major_scores_equal_the_einsums(bidirectional):
    qlen, klen, bsz, heads, d = 4, 9, 3, 2, 5
    q, k = torch.randn(qlen, bsz, heads, d), torch.randn(klen, bsz, heads, d)
    r = torch.randn(klen + qlen - 1 if bidirectional else klen, heads, d)
    u, v = torch.randn(heads, d), torch.randn(heads, d)
    expected = relative_attention_scores(q, k, r, u, v).permute(2, 3, 0, 1)
    fast = relative_attention_scores_heads(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), r.transpose(0, 1),
                                           u, v, scale=0.5)
    causal = torch.ones(qlen, klen, dtype=torch.bool).tril(klen - qlen)
    keep = torch.ones_like(causal) if bidirectional else causal
    torch.testing.assert_close(fast[..., keep], 0.5 * expected[..., keep], atol=1e-5, rtol=1e-5)


def _weights_inputs(qlen=4, klen=7, batch=2, heads=3, d=5, with_v=True, with_bias=False):
    torch.manual_seed(0)
    make = lambda *shape: torch.randn(*shape, dtype=torch.float64, requires_grad=True)  # noqa: E731
    return (make(batch, heads, qlen, d), make(batch, heads, klen, d), make(heads, klen, d), make(heads, d),
            make(heads, d) if with_v else None, make(heads, klen) if with_bias else None)


def _composite_weights(q, k, r, u, v, r_bias, masked, scale, zero_masked_rows=True):
    score = relative_attention_scores_heads(q, k, r, u, v, r_bias=r_bias, scale=scale)
    return masked_softmax_heads(score, masked, zero_masked_rows)


def _first_row_masked(mask):
    mask[0] = True
    return mask


MASKS = {
    'none': lambda q, k: None,
    'causal': lambda q, k: torch.ones(q, k, dtype=torch.bool).triu(k - q + 1),
    # Per batch element (`[batch, 1, qlen, klen]`), with one row of the second element fully masked
    'per-batch': lambda q, k: torch.stack([torch.ones(q, k, dtype=torch.bool).triu(k - q + 1),
                                              _first_row_masked(torch.ones(q, k, dtype=torch.bool).triu(1))])[:, None],
}


@pytest.mark.parametrize('mask', MASKS)
@pytest.mark.parametrize('with_v,with_bias', [(True, False), (False, True)], ids=['type0', 'type1'])
def test_decoder_weights_with_their_own_backward_equal_the_composite(mask, with_v, with_bias):
    """`relative_attention_weights_heads` (hand-written backward) against autograd through the composite."""
    q, k, r, u, v, r_bias = _weights_inputs(with_v=with_v, with_bias=with_bias)
    masked = MASKS[mask](4, 7)
    inputs = [t for t in (q, k, r, u, v, r_bias) if t is not None]
    grad = torch.randn(2, 3, 4, 7, dtype=torch.float64)
    fused = relative_attention_weights_heads(q, k, r, u, v, masked, 0.3, r_bias=r_bias)
    assert type(fused.grad_fn).__name__ == '_DecoderRelativeWeightsBackward'
    composite = _composite_weights(q, k, r, u, v, r_bias, masked, 0.3)
    fused_grads = torch.autograd.grad(fused, inputs, grad)
    composite_grads = torch.autograd.grad(composite, inputs, grad)
    torch.testing.assert_close(fused, composite, rtol=1e-12, atol=1e-12)
    for a, b in zip(fused_grads, composite_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if mask == 'per-batch':
        # The fully masked row attends to nothing
        assert torch.equal(fused[1, :, 0], torch.zeros_like(fused[1, :, 0]))


def test_decoder_weights_under_bf16_autocast_equal_the_composite():
    """Under autocast the products run in bf16 and the softmax in float32, in both."""
    q, k, r, u, v, _ = (None if t is None else t.detach().float().requires_grad_() for t in _weights_inputs())
    masked = MASKS['causal'](4, 7)
    grad = torch.randn(2, 3, 4, 7).bfloat16()
    results = []
    for weights_of in ('fused', 'composite'):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            if weights_of == 'fused':
                weights = relative_attention_weights_heads(q, k, r, u, v, masked, 0.3)
                assert type(weights.grad_fn).__name__ == '_DecoderRelativeWeightsBackward'
            else:
                weights = _composite_weights(q, k, r, u, v, None, masked, 0.3)
        results.append((weights, torch.autograd.grad(weights, (q, k, r, u, v), grad)))
    (fused, fused_grads), (composite, composite_grads) = results
    assert fused.dtype == composite.dtype == torch.bfloat16
    assert torch.equal(fused, composite)
    for a, b in zip(fused_grads, composite_grads):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_decoder_weights_pass_gradcheck():
    q, k, r, u, v, r_bias = _weights_inputs(qlen=3, klen=5, batch=2, heads=2, d=3, with_bias=True)
    masked = MASKS['causal'](3, 5)
    torch.autograd.gradcheck(lambda *t: relative_attention_weights_heads(*t[:5], masked, 0.7, r_bias=t[5]),
                             (q, k, r, u, v, r_bias))


# -- the model: fast against plain --

def _pair(**overrides):
    plain, fast = plain_and_fast(**overrides)
    assert fast.fast and not plain.fast
    return plain, fast


def _segments(model, data, n=3, grad=True, tgt_len=5):
    """Losses and memories of `n` consecutive segments; the gradients of the last segment's mean loss."""
    model.zero_grad()
    mems, losses = [], []
    for s in range(n):
        x, y = data[s * tgt_len:(s + 1) * tgt_len], data[s * tgt_len + 1:(s + 1) * tgt_len + 1]
        with torch.set_grad_enabled(grad):
            loss, *mems = model(x, y, *mems)
        losses.append(loss.detach())
    if grad:
        loss.mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, mems, grads


CONFIGS = [dict(attn_type=0), dict(attn_type=1), dict(attn_type=2), dict(attn_type=3),
           dict(attn_type=0, pre_lnorm=True, same_length=True, clamp_len=3),
           dict(attn_type=0, untie_r=True, cutoffs=[10, 20], div_val=2), dict(attn_type=2, pre_lnorm=True)]


@pytest.mark.parametrize('overrides', CONFIGS, ids=lambda c: '-'.join(f'{k}={v}' for k, v in c.items()))
@pytest.mark.parametrize('grad', [True, False], ids=['train-grad', 'no-grad'])
def test_fast_model_equals_plain_model_in_float32(overrides, grad):
    plain, fast = _pair(**overrides)
    data = torch.randint(40, (16, 3))
    for model in (plain, fast):
        model.train(grad)
    (pl, pm, pg), (fl, fm, fg) = _segments(plain, data, grad=grad), _segments(fast, data, grad=grad)
    for a, b in zip(pl + pm, fl + fm):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert pg.keys() == fg.keys()
    for name in pg:
        torch.testing.assert_close(fg[name], pg[name], atol=1e-5, rtol=1e-4, msg=lambda m: f'{name}: {m}')


REFERENCE_FILES = [p for p in reference_files() if p is not None][:13]


def _reference_segment_losses(path, dtype):
    """`(our loss, the reference segment)` for every segment of a reference file, evaluated without gradients in
    `dtype` on the fast path (under whatever autocast the caller has on)."""
    ref = torch.load(path, weights_only=True)
    model = MemTransformerLM(**ref['config']['model'])
    model.load_state_dict(ref['state_dict'], strict=True)
    model = model.to(dtype).eval()
    data, mems = ref['data'], []
    with torch.no_grad():
        for (tgt_len, mem_len, ext_len), seg in zip(ref['config']['segments'], ref['segments']):
            model.reset_length(tgt_len, ext_len, mem_len)
            start = seg['start']
            loss, *mems = model(data[max(0, start - ext_len): start + tgt_len],
                                data[start + 1: start + 1 + tgt_len], *mems)
            yield loss, seg


@pytest.mark.parametrize('path', REFERENCE_FILES, ids=lambda p: p.stem)
def test_fast_no_grad_path_matches_the_reference_losses(path):
    """The evaluation path (SDPA with the positions as a bias) against the original's float64 losses."""
    for loss, seg in _reference_segment_losses(path, torch.float64):
        torch.testing.assert_close(loss, seg['loss'], atol=1e-7, rtol=1e-7)


def test_switching_fast_off_and_on_gives_the_same_numbers():
    plain, model = _pair()
    model.eval()
    data = torch.randint(40, (6, 2))
    fast_loss = model(data[:5], data[1:6])[0]
    model.fast = False
    torch.testing.assert_close(model(data[:5], data[1:6])[0], fast_loss, atol=1e-6, rtol=1e-6)
    with pytest.raises(TypeError, match='fast='):
        model.fast = 'yes'


# -- cached positions and masks --

def test_cached_values_follow_a_fused_optimizer_step():
    """A fused optimizer writes the parameters without bumping their versions; `parameter_versions` bumps them, so
    the kept keys and values, the projected table and the prepacked weights are made again after a step."""
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config()).eval()
    data = torch.randint(40, (11, 2))
    with torch.no_grad():
        _, *mems = model(data[:5], data[1:6])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    versions = [p._version for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    assert all(p._version > v for p, v in zip(model.parameters(), versions))
    fresh = MemTransformerLM(**small_config()).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        # The same memories as before the step: the kept keys and values were made with the old weights
        after = model(data[5:10], data[6:11], *mems)[0]
        expected = fresh(data[5:10], data[6:11], *mems)[0]
    torch.testing.assert_close(after, expected, atol=1e-6, rtol=1e-6)


def test_positions_and_masks_are_cached_per_shape_and_dropped_when_lengths_change():
    _, model = _pair(same_length=True)
    model.eval()
    data = torch.randint(40, (12, 2))
    loss, *mems = model(data[:5], data[1:6])
    model(data[5:10], data[6:11], *mems)
    keys = set(model._cache)
    assert {k[0] for k in keys} == {'mask', 'pos'} and len(keys) == 4, 'one mask and table per (qlen, mlen)'
    mask_key = next(k for k in keys if k[0] == 'mask' and k[2] == 5)
    model(data[5:10], data[6:11], *mems)
    assert set(model._cache) == keys, 'the same shapes reuse the cache'
    model.reset_length(5, 0, 3)
    assert model._cache == {}, 'new lengths start a fresh cache'
    # `same_length` masks depend on mem_len: the cached mask of the old mem_len is not reused
    expected = model._attn_mask(5, 5, data.device)
    model(data[5:10], data[6:11], *mems)
    assert torch.equal(model._cache[('mask', 5, 5, 3) + mask_key[4:]], expected)
    model.double()
    assert model._cache == {}, 'a new dtype starts a fresh cache'
    model(data[:5], data[1:6])
    assert all(v.dtype in (torch.float64, torch.bool) for v in model._cache.values())


def test_cached_positions_see_loaded_frequencies():
    _, model = _pair()
    model.eval()
    data = torch.randint(40, (6, 2))
    before = model(data[:5], data[1:6])[0]
    with torch.no_grad():
        model.pos_emb.inv_freq.mul_(2)
    after = model(data[:5], data[1:6])[0]
    model.fast = False
    torch.testing.assert_close(after, model(data[:5], data[1:6])[0], atol=1e-6, rtol=1e-6)
    assert not torch.equal(before, after)


# -- the causal position bias of the SDPA path --

def _naive_causal_bias(q, r, v, scale, mlen):
    r"""$B_{i,j} = \mathit{scale}\,(q_i + v)^\top r_{(k - 1) - (m + i - j)}$ for $j \le m + i$, else $-\infty$: one
    entry at a time, with the table entry of each distance looked up directly."""
    batch, heads, qlen, _ = q.shape
    klen = mlen + qlen
    out = torch.full((batch, heads, qlen, klen), float('-inf'), dtype=q.dtype)
    for i in range(qlen):
        for j in range(mlen + i + 1):
            entry = (klen - 1) - (mlen + i - j)
            out[:, :, i, j] = scale * ((q[:, :, i] + v) * r[:, entry]).sum(-1)
    return out


@pytest.mark.parametrize('qlen,mlen', [(1, 0), (1, 5), (4, 0), (4, 3), (5, 9)])
@pytest.mark.parametrize('padded', [False, True], ids=['table', 'padded-table'])
def test_causal_position_bias_equals_the_naive_masked_shifted_product(qlen, mlen, padded):
    batch, heads, d_head, klen = 2, 3, 4, mlen + qlen
    bias_maker = CausalPositionBias()
    # The queries in the projection's layout (`[qlen, batch, heads, d_head]` in memory), as the model passes them
    for _ in range(2):  # the second call reuses the buffer the first one made
        q = torch.randn(qlen, batch, heads, d_head, dtype=torch.float64).permute(1, 2, 0, 3)
        r = torch.randn(heads, klen, d_head, dtype=torch.float64)
        v = torch.randn(heads, d_head, dtype=torch.float64)
        table = pad_table(r, klen) if padded else r
        causal = torch.ones(qlen, klen, dtype=torch.bool).triu_(1 + mlen)
        assert bias_maker.applies(q, table, v, causal, klen)
        bias = bias_maker(q, table, v, 0.5, klen)
        torch.testing.assert_close(bias, _naive_causal_bias(q, r, v, 0.5, mlen), rtol=1e-12, atol=1e-12)


def test_causal_position_bias_serves_only_the_decoder_causal_mask():
    bias_maker = CausalPositionBias()
    qlen, mlen, klen = 3, 4, 7
    q, r, v = torch.randn(2, 2, qlen, 4), torch.randn(2, klen + 1, 4), torch.randn(2, 4)
    causal = torch.ones(qlen, klen, dtype=torch.bool).triu_(1 + mlen)
    assert bias_maker.applies(q, r, v, causal, klen)
    same_length = causal | torch.ones(qlen, klen, dtype=torch.bool).tril_(-1)
    assert not bias_maker.applies(q, r, v, same_length, klen)
    assert not bias_maker.applies(q, r, v, None, klen)
    assert not bias_maker.applies(q, r, v, causal[None, None].expand(2, 1, qlen, klen), klen)
    # An encoder's table runs past distance 0
    assert not bias_maker.applies(q, torch.randn(2, klen + qlen - 1, 4), v, causal, klen)
    assert not bias_maker.applies(q, r.double(), v, causal, klen)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not bias_maker.applies(q, r, v, causal, klen)


@pytest.mark.parametrize('mlen', [0, 6])
def test_sdpa_with_the_causal_position_bias_equals_the_masked_bias(mlen):
    batch, heads, qlen, d_head = 2, 3, 5, 8
    klen = mlen + qlen
    q = torch.randn(qlen, batch, heads, d_head).permute(1, 2, 0, 3)
    k, values = torch.randn(batch, heads, klen, d_head), torch.randn(batch, heads, klen, d_head)
    r, u, v = pad_table(torch.randn(heads, klen, d_head), klen), torch.randn(heads, d_head), torch.randn(heads, d_head)
    causal = torch.ones(qlen, klen, dtype=torch.bool).triu_(1 + mlen)
    with torch.no_grad():
        expected = relative_attention_sdpa(q.contiguous(), k, values, r, u, v, 0.125, causal)
        out = relative_attention_sdpa(q, k, values, r, u, v, 0.125, causal, causal_bias=CausalPositionBias())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('kernel', [True, False], ids=['kernel', 'no-kernel'])
def test_model_evaluation_takes_the_causal_kernel_else_the_causal_position_bias(count_calls, monkeypatch, kernel):
    """Without `same_length`, every evaluation segment's mask is the decoder's causal mask: our kernel runs each
    layer's attention, or, where it is not available, SDPA with `CausalPositionBias`."""
    if not kernel:
        monkeypatch.setattr(native_attention, 'kernel_available', lambda: False)
    plain, fast = _pair()
    calls = count_calls(CausalPositionBias, ['__call__'])
    kernel_calls = count_calls(native, ['causal_relative_attention'])
    data = torch.randint(40, (16, 3))
    for model in (plain, fast):
        model.eval()
    (pl, pm, _), (fl, fm, _) = _segments(plain, data, grad=False), _segments(fast, data, grad=False)
    # 3 segments of 2 layers (the plain path calls neither)
    counted = (kernel_calls.get('causal_relative_attention', 0), calls.get('__call__', 0))
    assert counted == ((6, 0) if kernel else (0, 6))
    for a, b in zip(pl + pm, fl + fm):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


# -- the drop-in RelativeMultiHeadAttention --

@pytest.mark.parametrize('mask_kind', ['none', 'causal', 'padding'])
def test_relative_mha_fast_equals_plain(mask_kind):
    torch.manual_seed(0)
    attn = RelativeMultiHeadAttention(2, 8, dropout_prob=0.0).double()
    with torch.no_grad():
        attn.r_w_bias.normal_()
        attn.r_r_bias.normal_()
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    mask = None
    if mask_kind == 'causal':
        mask = subsequent_mask(5)
    elif mask_kind == 'padding':
        mask = torch.ones(1, 5, 3, dtype=torch.bool)
        mask[0, 3:, 1] = False
        mask = mask.expand(5, 5, 3).clone()
        mask[2, :, 2] = False  # a query with every key masked attends to nothing
    out, weights = attn(query=x, key=x, value=x, mask=mask, need_weights=True)
    attn.fast = False
    out_plain, weights_plain = attn(query=x, key=x, value=x, mask=mask, need_weights=True)
    torch.testing.assert_close(out, out_plain, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(weights, weights_plain, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize('training', [False, True], ids=['eval', 'train'])
def test_relative_mha_under_a_causal_mask_runs_the_kernel_and_equals_plain(count_calls, training):
    """float32 under the decoder's causal mask: the fast path runs our kernel (forward, and backward in training)
    and matches the plain computation's output and gradients; with `need_weights` it does not (the kernel keeps
    no weights to return)."""
    torch.manual_seed(0)
    attn = RelativeMultiHeadAttention(2, 16, dropout_prob=0.0).train(training)
    with torch.no_grad():
        attn.r_w_bias.normal_()
        attn.r_r_bias.normal_()
    x = torch.randn(37, 3, 16)
    calls = count_calls(native, ['causal_relative_attention'])

    def output_and_gradients():
        source = x.clone().requires_grad_()
        with torch.set_grad_enabled(training):
            out = attn(query=source, key=source, value=source, mask=subsequent_mask(37))
        if not training:
            return [out]
        parameters = [source] + list(attn.parameters())
        return [out] + list(torch.autograd.grad(out, parameters, torch.ones_like(out)))

    fast = output_and_gradients()
    assert calls['causal_relative_attention'] == 1
    attn.fast = False
    for a, b in zip(fast, output_and_gradients()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    attn.fast = True
    attn(query=x, key=x, value=x, mask=subsequent_mask(37), need_weights=True)
    assert calls['causal_relative_attention'] == 1


# -- torch.compile --

def test_whole_model_compiles_without_graph_breaks():
    """`fullgraph=True` fails on any graph break; training step with memories, and with clusters."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(n_layer=1, cutoffs=[10, 20], div_val=2))
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    data = torch.randint(40, (6, 2))
    loss, *mems = compiled(data[:5], data[1:6])
    loss.mean().backward()
    expected, *expected_mems = model(data[:5], data[1:6])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    for a, b in zip(mems, expected_mems):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# -- generation: one new position per step --

def test_generation_computes_only_the_new_position_each_step():
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(tgt_len=8, mem_len=8))
    seen = []
    model.layers[0].register_forward_hook(lambda module, args, output: seen.append(args[0].shape[0]))
    embedded = []
    model.word_emb.register_forward_hook(lambda module, args, output: embedded.append(args[0].shape[0]))
    prompt = torch.randint(40, (6, 2))
    generate(model, prompt, 5, context=16)
    # The prompt once, then one position per sampled token (the last token's is the next distribution)
    assert seen == [6, 1, 1, 1, 1, 1]
    assert embedded == seen


# -- bf16 autocast --

@pytest.mark.parametrize('path', REFERENCE_FILES, ids=lambda p: p.stem)
def test_bf16_autocast_keeps_the_reference_mean_losses(path):
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for loss, seg in _reference_segment_losses(path, torch.float32):
            assert abs(loss.float().mean().item() - seg['loss'].mean().item()) < 1e-2


# -- the benchmark --

def _benchmark():
    spec = importlib.util.spec_from_file_location('benchmark', ROOT / 'experiments' / 'benchmark.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules['benchmark'] = module
    spec.loader.exec_module(module)
    return module


def test_benchmark_measures_every_row_on_tiny_sizes():
    bench = _benchmark()
    cfg = bench.BenchConfig(n_token=16, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=4,
                            mem_len=4, batch=2, repeats=1, matmul_n=32)
    speed = bench.measure_speed(cfg, compile_model=False)
    assert set(speed) == {'fast', 'plain', 'labml_nn', 'bf16 autocast', 'matmul', 'products alone',
                          'fast without our kernels'}
    assert all(v > 0 for name, row in speed.items() for v in row.values())
    table9 = bench.measure_table9(cfg, [4, 8], repeats=1)
    assert [r['length'] for r in table9] == [4, 8]
    assert all(r[k] > 0 for r in table9 for k in ('xl_segment', 'xl_token', 'vanilla'))
    memory = bench.measure_memory(cfg, [8])
    assert all(memory[0][path][k] > 0 for path in ('fast', 'plain') for k in ('model_mib', 'mems_mib'))
    assert all(memory[0][path]['eval_peak_mib'] >= 0 for path in ('fast', 'plain'))
    table = bench.format_table(bench.speed_rows(speed, cfg) + bench.table9_rows(table9) + bench.memory_rows(memory))
    lines = table.splitlines()
    assert lines[0] == '| measurement | value | ratio |'
    assert set(speed['fast without our kernels']) == {'train', 'eval'}
    for needle in ('train: fast vs plain', 'train: fast vs labml_nn', 'eval: fast vs plain', 'eval: fast vs labml_nn',
                   "eval: the fast path's products alone", 'train: fast vs fast without our kernels',
                   'eval: fast vs fast without our kernels',
                   'bf16 autocast', 'train step matmul FLOP/s', 'Table 9, L=4', 'Table 9, L=8',
                   'eval peak memory above the model, mem_len=8'):
        assert any(needle in line for line in lines), needle
    assert bench.train_step_flops(cfg) == 3 * bench.forward_flops(cfg) > 0


def test_generation_steps_project_nothing_of_the_past():
    """With a full memory, every product of a step has one row: the memory's keys and values and the projected
    distance table are kept from the step before (no-grad evaluation), not recomputed."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(tgt_len=8, mem_len=8))
    events = []
    # The kernels a linear layer reaches: MKL's (`F.linear`) and oneDNN's (`inference_linear`)
    linear_kernels = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                      torch.ops.mkldnn._linear_pointwise.default)

    class RowsOfProducts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in linear_kernels:
                # Positions in the product: its rows are `[seq * bsz]` with bsz = 2
                events.append(args[1 if func is torch.ops.aten.addmm.default else 0].shape[0] // 2)
            return func(*args, **(kwargs or {}))

    model.word_emb.register_forward_hook(lambda module, args, output: events.append(('step', args[0].shape[0])))
    with RowsOfProducts():
        generate(model, torch.randint(40, (6, 2)), 12, context=4)
    steps, current = [], None
    for event in events:
        if isinstance(event, tuple):
            current = []
            steps.append((event[1], current))
        else:
            current.append(event)
    assert [qlen for qlen, _ in steps] == [6] + [1] * 12
    # Once the memory is full (4 positions) the table stops changing: from then on only one-row products
    for _, rows in steps[3:]:
        assert rows and max(rows) == 1, rows


def test_masked_softmax_heads_leaves_its_input_alone_unless_asked():
    from labml_txl.relative_attention import masked_softmax, masked_softmax_heads
    scores = torch.randn(2, 3, 4, 6)
    masked = torch.ones(4, 6, dtype=torch.bool).triu(3)
    masked[1] = True  # a fully masked row: zero weights, as `masked_softmax`
    before = scores.clone()
    probs = masked_softmax_heads(scores, masked)
    assert torch.equal(scores, before)
    expected = masked_softmax(scores.permute(2, 3, 0, 1), masked, dim=1).permute(2, 3, 0, 1)
    torch.testing.assert_close(probs, expected)
    assert torch.equal(probs[:, :, 1], torch.zeros(2, 3, 6))


def test_fast_switches_every_part_with_a_fast_path():
    """`model.fast` reaches each part that has a path of its own: attention, feed-forward, softmax layer, dropout."""
    from torch import nn

    from labml_txl.xl import PositionwiseFF, ProjectedAdaptiveLogSoftmax
    from labml_txl.xl.attention_base import XLAttentionBase

    for attn_type in (0, 1, 2):
        model = MemTransformerLM(**small_config(attn_type=attn_type, dropout=0.1))
        parts = [m for m in model.modules()
                 if isinstance(m, (XLAttentionBase, PositionwiseFF, ProjectedAdaptiveLogSoftmax, nn.Dropout))]
        assert len(parts) == 2 * model.n_layer + 1 + (1 + 4 * model.n_layer)
        for value in (False, True):
            model.fast = value
            assert model.fast is value and all(m.fast is value for m in parts)
