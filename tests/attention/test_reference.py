"""
The shared relative-attention math (`labml_txl.attention.reference`) and `MultiHeadAttention` with `'relative'` (each
implementation the dispatcher runs it by, and `impl='reference'`), against index-based and naive per-pair
computations.
"""
import math

import pytest
import torch
from torch.nn import functional as F

from labml_txl.fast import dispatch
from labml_txl.attention.masks import subsequent_mask
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.positions.encoding import relative_distances
from labml_txl.attention.reference import masked_softmax, relative_attention_scores, relative_shift
from labml_txl.positions.relative import Relative

from tolerance import assert_close_rounding, assert_same_function, rounding_bound


def gather_shift(x: torch.Tensor) -> torch.Tensor:
    """`out[i, j] = x[i, j + qlen - 1 - i]` by explicit indexing (NaN where that index is past the table)."""
    qlen, rlen = x.shape[:2]
    out = torch.full_like(x, float('nan'))
    for i in range(qlen):
        for j in range(rlen):
            s = j + qlen - 1 - i
            if s < rlen:
                out[i, j] = x[i, s]
    return out


@pytest.mark.parametrize('qlen,klen', [(1, 1), (3, 3), (3, 7), (5, 9), (4, 4)])
def test_shift_decoder_table_matches_gather(qlen, klen):
    """Table of `klen` distances `klen - 1 .. 0`: exact for every key `j <= mlen + i` (the causal part)."""
    torch.manual_seed(0)
    x = torch.randn(qlen, klen, 2, 3, dtype=torch.float64)
    shifted, expected = relative_shift(x), gather_shift(x)
    mlen = klen - qlen
    for i in range(qlen):
        torch.testing.assert_close(shifted[i, :mlen + i + 1], expected[i, :mlen + i + 1], atol=0, rtol=0)


@pytest.mark.parametrize('qlen,klen', [(1, 1), (3, 3), (3, 7), (5, 9), (6, 2)])
def test_shift_encoder_table_matches_gather(qlen, klen):
    """Table of `klen + qlen - 1` distances down to `-(qlen - 1)`: exact for every key of every query."""
    torch.manual_seed(1)
    x = torch.randn(qlen, klen + qlen - 1, 2, 3, dtype=torch.float64)
    shifted = relative_shift(x)[:, :klen]
    expected = gather_shift(x)[:, :klen]
    assert not expected.isnan().any()
    torch.testing.assert_close(shifted, expected, atol=0, rtol=0)


def test_relative_distances():
    assert relative_distances(3, 5, bidirectional=False).tolist() == [4, 3, 2, 1, 0]
    assert relative_distances(3, 5, bidirectional=True).tolist() == [4, 3, 2, 1, 0, -1, -2]
    assert relative_distances(3, 5, bidirectional=True, clamp_len=2).tolist() == [2, 2, 2, 1, 0, -1, -2]
    assert relative_distances(2, 5, bidirectional=False, clamp_len=3).tolist() == [3, 3, 2, 1, 0]


def test_decoder_scores_are_the_four_terms():
    """`relative_attention_scores` with a decoder table equals (a)+(b)+(c)+(d) pair by pair, j <= m + i."""
    torch.manual_seed(2)
    qlen, klen, bsz, heads, d = 3, 7, 2, 2, 4
    mlen = klen - qlen
    q = torch.randn(qlen, bsz, heads, d, dtype=torch.float64)
    k = torch.randn(klen, bsz, heads, d, dtype=torch.float64)
    r = torch.randn(klen, heads, d, dtype=torch.float64)      # entry s: distance klen - 1 - s
    u = torch.randn(heads, d, dtype=torch.float64)
    v = torch.randn(heads, d, dtype=torch.float64)
    scores = relative_attention_scores(q, k, r, u, v)
    expected = torch.full_like(scores, float('nan'))
    for i in range(qlen):
        for j in range(mlen + i + 1):
            r_ij = r[klen - 1 - (mlen + i - j)]
            for b in range(bsz):
                for n in range(heads):
                    a = q[i, b, n] @ k[j, b, n]
                    b_term = q[i, b, n] @ r_ij[n]
                    c = u[n] @ k[j, b, n]
                    d_term = v[n] @ r_ij[n]
                    expected[i, j, b, n] = a + b_term + c + d_term
    # Rule 1 (float64 both) on the causal part
    causal = ~expected.isnan()
    assert causal.sum() == bsz * heads * sum(mlen + i + 1 for i in range(qlen))
    assert_same_function(scores[causal], expected[causal])


def sinusoid(distance: float, d_model: int) -> torch.Tensor:
    """$R_d$ computed from its definition: sines of every frequency, then cosines."""
    half = d_model // 2
    freqs = [1 / 10000 ** (2 * f / d_model) for f in range(half)]
    return torch.tensor([math.sin(distance * w) for w in freqs] + [math.cos(distance * w) for w in freqs],
                        dtype=torch.float64)


def naive_relative_mha(mha: MultiHeadAttention, query, key, value, allowed):
    """A_rel(i, j) = (a) + (b) + (c) + (d) for every pair in Python loops, then softmax, values, output."""
    seq_q, bsz, d_model = query.shape
    seq_k = key.shape[0]
    h, dk = mha.heads, mha.d_k
    wq, bq = mha.query.weight, mha.query.bias
    wk, bk = mha.key.weight, mha.key.bias
    wv, bv = mha.value.weight, mha.value.bias
    wr = mha.r_net.weight
    out = torch.zeros(seq_q, bsz, d_model, dtype=query.dtype)
    for b in range(bsz):
        for i in range(seq_q):
            pos_i = seq_k - seq_q + i          # queries are the last seq_q of the seq_k positions
            concat = []
            for n in range(h):
                sl = slice(n * dk, (n + 1) * dk)
                q_i = wq[sl] @ query[i, b] + bq[sl]
                u, v = mha.r_w_bias[n], mha.r_r_bias[n]
                scores, values = [], []
                for j in range(seq_k):
                    k_j = wk[sl] @ key[j, b] + bk[sl]
                    r_ij = wr[sl] @ sinusoid(pos_i - j, d_model)     # W_{k,R} R_{i-j}, j > i included
                    a_rel = q_i @ k_j + q_i @ r_ij + u @ k_j + v @ r_ij
                    if allowed is None or allowed[min(i, allowed.shape[0] - 1), j, min(b, allowed.shape[2] - 1)]:
                        scores.append(a_rel / math.sqrt(dk))
                        values.append(wv[sl] @ value[j, b] + bv[sl])
                p = torch.softmax(torch.stack(scores), dim=0)
                concat.append(sum(p_j * v_j for p_j, v_j in zip(p, values)))
            out[i, b] = mha.output.weight @ torch.cat(concat) + mha.output.bias
    return out


def _mha(d_model=8, heads=2, seed=3, impl='auto'):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(heads, d_model, dropout_prob=0.0, impl=impl, positions=Relative()).double().eval()
    with torch.no_grad():
        mha.r_w_bias.normal_()
        mha.r_r_bias.normal_()
        for lin in (mha.query, mha.key, mha.value, mha.output):
            lin.bias.normal_()
    return mha


def _attention_paths(choices):
    return [c.chosen for c in choices if c.operation == 'attention']


# The implementation of each impl in float64: with gradients recorded the composite (SDPA would need a bias with a
# gradient), without them SDPA; the reference with impl='reference'
PATHS = {('auto', True): 'composite', ('auto', False): 'sdpa', ('reference', True): 'reference',
         ('reference', False): 'reference'}


@pytest.mark.parametrize('impl,grad', PATHS, ids=[f'{impl}-{"grad" if grad else "no-grad"}' for impl, grad in PATHS])
@pytest.mark.parametrize('seq_q,seq_k,mask_kind', [
    (4, 4, None),            # unmasked encoder self-attention: keys after the query are scored too
    (3, 6, None),            # with memory: queries are the last 3 of 6 positions
    (4, 4, 'causal'),        # decoder
    (3, 6, 'causal_mem'),    # decoder with memory
    (3, 5, 'batch'),         # a [seq_q, seq_k, batch] mask
    (5, 2, None),            # fewer keys than queries
])
def test_relative_mha_matches_naive_double_loop(seq_q, seq_k, mask_kind, impl, grad):
    mha = _mha(impl=impl)
    bsz = 2
    torch.manual_seed(4)
    query = torch.randn(seq_q, bsz, 8, dtype=torch.float64)
    key = torch.randn(seq_k, bsz, 8, dtype=torch.float64)
    value = torch.randn(seq_k, bsz, 8, dtype=torch.float64)
    if mask_kind is None:
        mask = None
    elif mask_kind == 'causal':
        mask = subsequent_mask(seq_q)
    elif mask_kind == 'causal_mem':
        mlen = seq_k - seq_q
        mask = torch.tril(torch.ones(seq_q, seq_k, dtype=torch.bool), diagonal=mlen)[:, :, None]
    else:
        mask = torch.rand(seq_q, seq_k, bsz, generator=torch.Generator().manual_seed(5)) > 0.4
        mask[:, 0, :] = True
    with torch.set_grad_enabled(grad), dispatch.recording() as choices:
        ours = mha(query=query, key=key, value=value, mask=mask)
    assert _attention_paths(choices) == [PATHS[impl, grad]]
    with torch.no_grad():
        expected = naive_relative_mha(mha, query, key, value, mask)
    # Rule 1: float64 both
    assert_same_function(ours, expected)


@pytest.mark.parametrize('mask_kind', [None, 'causal'])
def test_relative_mha_float32_matches_naive(mask_kind):
    """float32 without gradients: SDPA, and under a decoder's causal mask our kernel (the module's table of
    `seq_k + seq_q - 1` distances has every entry the kernel reads)."""
    mha = _mha()
    torch.manual_seed(6)
    x = torch.randn(4, 2, 8, dtype=torch.float64)
    mask = None if mask_kind is None else subsequent_mask(4)
    expected = naive_relative_mha(mha, x, x, x, mask)
    with torch.no_grad(), dispatch.recording() as choices:
        ours = mha.float()(query=x.float(), key=x.float(), value=x.float(), mask=mask)
    assert _attention_paths(choices) == ['sdpa' if mask is None else 'kernel']
    # Rule 2 against the float64 loop: the table's angles (4 float32 roundings: the frequencies' division, power
    # and reciprocal, the product, each of the angle's size, up to 3) and sines, its projection over d_model 8, a
    # score's product over d_k 4 and its two elementwise steps (q + u or q + v, the sum of the terms), the softmax and
    # the weighted sum over 4 keys, the output projection over 8
    assert_close_rounding(ours, expected, depth=4 * 3 + 1 + 8 + 4 + 2 + 4 + 4 + 8)


def test_relative_mha_gradients_are_the_references():
    """Training through the kernel (causal mask, float32) and through the composite (no mask, float32): the
    gradients of every parameter equal those of `impl='reference'` with the same weights, in float64."""
    torch.manual_seed(9)
    x = torch.randn(6, 2, 8)
    # Rule 2. Forward: the table's angles (4 float32 roundings, each of the angle's size, up to 5) and sines, its
    # projection over d_model 8, a score's product over d_k 4 and its two elementwise steps, the softmax and the
    # weighted sum over 6 keys, the output projection over 8. Back: the output projection (8), the weighted sum (4),
    # the softmax and the scores (6 each); then the parameter's own sum: over every score for u and v (2 x 6 x 6),
    # else over the rows (2 x 6) and for the table's projection its 11 entries
    depth = (4 * 5 + 1 + 8 + 4 + 2 + 6 + 6 + 8) + (8 + 4 + 6 + 6)
    own = {'r_w_bias': 2 * 6 * 6, 'r_r_bias': 2 * 6 * 6}
    for mask, path in ((subsequent_mask(6), 'kernel'), (None, 'composite')):
        grads = {}
        for impl, dtype in (('auto', torch.float32), ('reference', torch.float64)):
            mha = _mha(impl=impl).to(dtype)
            with dispatch.recording() as choices:
                mha(query=x.to(dtype), key=x.to(dtype), value=x.to(dtype), mask=mask).square().sum().backward()
            assert _attention_paths(choices) == [path if impl == 'auto' else 'reference']
            grads[impl] = {name: p.grad for name, p in mha.named_parameters()}
        assert grads['auto'].keys() == grads['reference'].keys()
        for name, grad in grads['auto'].items():
            assert_close_rounding(grad, grads['reference'][name], depth=depth + own.get(name, 2 * 6 + 11), msg=name)


def test_a_subclass_with_its_own_scores_runs_the_reference_with_them():
    """labml_nn's hook: a `get_scores` of a subclass's own is what the scores are, on the reference path."""
    class Doubled(MultiHeadAttention):
        def get_scores(self, query, key):
            return 2 * super().get_scores(query, key)

    torch.manual_seed(10)
    # (in float64, where the same paths serve it as in float32: rule 1)
    doubled = Doubled(2, 8, dropout_prob=0.0).double().eval()
    plain = MultiHeadAttention(2, 8, dropout_prob=0.0).double().eval()
    plain.load_state_dict(doubled.state_dict())
    # Doubling the scores is halving the temperature
    plain.scale = 2 * plain.scale
    x = torch.randn(5, 2, 8, dtype=torch.float64)
    with torch.no_grad(), dispatch.recording() as choices:
        ours = doubled(query=x, key=x, value=x, mask=subsequent_mask(5))
        expected = plain(query=x, key=x, value=x, mask=subsequent_mask(5))
    (own, _) = [c for c in choices if c.operation == 'attention']
    assert own.chosen == 'reference' and 'get_scores' in dict(own.refused)['composite']
    assert_same_function(ours, expected)


@pytest.mark.parametrize('impl', ['auto', 'reference'])
def test_relative_mha_weights_and_drop_in_interface(impl):
    mha = _mha(impl=impl)
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    with dispatch.recording() as choices:
        out, weights = mha(query=x, key=x, value=x, mask=subsequent_mask(5), need_weights=True)
    assert _attention_paths(choices) == ['composite' if impl == 'auto' else 'reference']
    # Rule 1: float64 both
    assert_same_function(out, naive_relative_mha(mha, x, x, x, subsequent_mask(5)))
    assert out.shape == (5, 3, 8) and weights.shape == (5, 5, 3, 2)
    assert_same_function(weights.sum(1), torch.ones(5, 3, 2, dtype=torch.float64))
    # causal: no weight on the future
    assert (weights.permute(2, 3, 0, 1).triu(1) == 0).all()


def test_relative_mha_is_the_configs_drop_in():
    """Same constructor and forward keywords as MultiHeadAttention; same output shape for the same call."""
    x = torch.randn(4, 2, 8)
    for positions in (None, Relative()):
        m = MultiHeadAttention(heads=2, d_model=8, dropout_prob=0.1, bias=True, positions=positions)
        assert m(query=x, key=x, value=x, mask=subsequent_mask(4)).shape == (4, 2, 8)


@pytest.mark.parametrize('impl', ['auto', 'reference'])
def test_fully_masked_row_is_finite(impl):
    mha = _mha(impl=impl)
    x = torch.randn(3, 2, 8, dtype=torch.float64)
    mask = torch.ones(3, 3, 2, dtype=torch.bool)
    mask[1, :, 0] = False                     # query 1 of sequence 0 may attend to nothing
    out, weights = mha(query=x, key=x, value=x, mask=mask, need_weights=True)
    assert torch.isfinite(out).all()
    assert (weights[1, :, 0] == 0).all()      # attends to nothing ...
    assert_same_function(out[1, 0], mha.output.bias.detach())   # ... so only the output bias is left
    # Without the weights, where SDPA would serve but for that row: the composite, the same numbers
    with torch.no_grad(), dispatch.recording() as choices:
        fused = mha(query=x, key=x, value=x, mask=mask)
    (choice,) = [c for c in choices if c.operation == 'attention']
    if impl == 'auto':
        assert choice.chosen == 'composite' and 'every key masked' in dict(choice.refused)['sdpa']
    assert_same_function(fused, out.detach())
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        scores = torch.randn(3, 4, 2, 2).to(dtype)
        masked = torch.zeros(3, 4, 2, dtype=torch.bool)
        masked[0] = True
        probs = masked_softmax(scores, masked[..., None])
        assert probs.dtype == dtype and torch.isfinite(probs).all()
        assert (probs[0] == 0).all()
        # Rule 2: a float32 softmax over 4 keys and the 4 weights added here in float32 (depth 4 + 4), each weight
        # rounded to `dtype` after it (relative, and they add up to 1: depth 1 in `dtype`)
        bound = rounding_bound(dtype, 1) + rounding_bound(torch.float32, 4 + 4)
        torch.testing.assert_close(probs[1:].float().sum(1), torch.ones(2, 2, 2), atol=bound, rtol=0)


def test_masked_softmax_without_the_second_fill_is_the_originals_fill_and_softmax():
    """`rows_may_be_empty=False` (the decoder's masks, which leave every query a key): the original's masked fill
    and softmax, the same numbers as with the second fill; only a fully masked row tells the two apart. Over the
    last axis (`dim=-1`, head-major scores) alike."""
    torch.manual_seed(8)
    # (in float64: rule 1 below)
    scores = torch.randn(5, 7, 2, 3, dtype=torch.float64)
    causal = torch.ones(5, 7, dtype=torch.bool).triu_(3)[:, :, None, None]
    original = F.softmax(scores.masked_fill(causal, -float('inf')), dim=1)
    assert torch.equal(masked_softmax(scores, causal, rows_may_be_empty=False), original)
    assert torch.equal(masked_softmax(scores, causal), original)
    everything = torch.ones(5, 7, 1, 1, dtype=torch.bool)
    assert (masked_softmax(scores, everything) == 0).all()
    # Without the fill a fully masked row spreads its weight evenly (finite, no NaN)
    assert_same_function(masked_softmax(scores, everything, rows_may_be_empty=False), torch.full_like(scores, 1 / 7))
    # Head-major `[batch, heads, qlen, klen]`, the mask `[qlen, klen]`; in place on a copy, the same weights
    heads = scores.permute(2, 3, 0, 1).contiguous()
    causal_2d = causal[:, :, 0, 0]
    expected = original.permute(2, 3, 0, 1)
    # (to float rounding: the sums run along another axis of memory; rule 1)
    assert_same_function(masked_softmax(heads, causal_2d, dim=-1), expected)
    copy = heads.clone()
    assert_same_function(masked_softmax(copy, causal_2d, dim=-1, inplace=True), expected)
    assert not torch.equal(copy, heads)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_masked_softmax_half_precision_large_scores(dtype):
    """Scores near the dtype's limits with a causal mask: no overflow, no NaN, masked keys get zero."""
    big = torch.finfo(dtype).max / 2
    scores = torch.tensor([[big, -big, big / 4], [big, big, 0.0]], dtype=dtype)[:, :, None, None]
    masked = torch.tensor([[False, True, True], [False, False, True]])[:, :, None, None]
    probs = masked_softmax(scores, masked)
    assert torch.isfinite(probs).all()
    assert probs[0, 0].item() == 1 and probs[0, 1:].eq(0).all() and probs[1, 2].item() == 0
    # Rule 2: a float32 softmax over 2 keys, each weight then rounded to `dtype` once
    bound = rounding_bound(dtype, 1, 0.5) + rounding_bound(torch.float32, 2, 0.5)
    torch.testing.assert_close(probs[1, :2].float().flatten(), torch.tensor([0.5, 0.5]), atol=bound, rtol=0)


@pytest.mark.parametrize('impl', ['auto', 'reference'])
def test_relative_mha_bf16_forward_is_finite(impl):
    torch.manual_seed(7)
    mha = MultiHeadAttention(4, 32, dropout_prob=0.0, impl=impl, positions=Relative()).to(torch.bfloat16)
    x = (torch.randn(16, 2, 32) * 30).to(torch.bfloat16)
    out = mha(query=x, key=x, value=x, mask=subsequent_mask(16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
