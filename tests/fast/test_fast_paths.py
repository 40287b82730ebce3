"""
The fast implementations of Transformer-XL (`docs/performance.md`) against the readable specification
(`impl='reference'`, `relative_attention.py`): the shift as a view, head-major scores, the composite and SDPA
implementations of `dispatch.attend`, our kernel, cached positions and masks, `torch.compile` and one-token
generation (bf16 autocast: `xl/test_bf16_reference.py`; the benchmark: `experiments/test_benchmark.py`). No test
looks at wall-clock time.
"""
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labml_txl.fast import dispatch, native
from labml_txl.attention.composite import composite_attention, pad_table, relative_shift_view, shifted_position_scores
from labml_txl.attention.masks import decoder_causal_mask, decoder_window_mask, subsequent_mask
from labml_txl.fast.dispatch import Plan, RelativeTerms
from labml_txl.fast.dropout import Dropout
from labml_txl.xl.generation import generate
from labml_txl.fast.native import few_rows_linear as native_few_rows
from labml_txl.attention.reference import masked_softmax, relative_attention_scores, relative_shift
from labml_txl.positions.relative import Relative
from labml_txl.xl import MemTransformerLM
from labml_txl.xl.memory import MOST_KEPT
from labml_txl.transformer.mha import MultiHeadAttention

from tolerance import assert_close_rounding, assert_same_function, xl_depths
from xl.helpers import plain_and_fast, reference_files, small_config

CPU = torch.device('cpu')
# (Rule 2 in bf16, under autocast: the products add in float32, 2^16 finer than bf16, so a depth in bf16 counts the
# roundings to bf16 on the path: each product's inputs (1) and output (1), each elementwise step in bf16 (1))


def _chosen(choices, operation='attention'):
    """The implementations recorded for `operation`, in call order."""
    return [c.chosen for c in choices if c.operation == operation]


def _refusals(choice):
    """`{implementation: reason}` of one recorded `Choice`."""
    return dict(choice.refused)


def _masks_drawn(choices):
    """The recorded paths of the dropouts that drew a mask (not those that were the identity: not training, p 0)."""
    return [c.chosen for c in choices if c.operation == 'dropout'
            and not any(reason.startswith('not training') for _, reason in c.refused)]


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
    randn = lambda *shape: torch.randn(*shape, dtype=torch.float64)  # noqa: E731
    q, k = randn(qlen, bsz, heads, d), randn(klen, bsz, heads, d)
    r = randn(klen + qlen - 1 if bidirectional else klen, heads, d)
    u, v = randn(heads, d), randn(heads, d)
    expected = relative_attention_scores(q, k, r, u, v).permute(2, 3, 0, 1)
    causal = torch.ones(qlen, klen, dtype=torch.bool).tril(klen - qlen)
    keep = torch.ones_like(causal) if bidirectional else causal
    # The composite's weights are the softmax of its scores: against the softmax of the einsums' scaled scores
    values = randn(bsz, heads, klen, d)
    _, weights = composite_attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), values, 0.5, ~keep,
                                     RelativeTerms(r.transpose(0, 1), content_bias=u, position_bias=v), None)
    expected_weights = torch.softmax((0.5 * expected).masked_fill(~keep, float('-inf')), dim=-1)
    # Rule 1: float64 both
    assert_same_function(weights, expected_weights)


# -- the composite and SDPA implementations of `dispatch.attend` against the reference --

def _attention_inputs(qlen=4, klen=7, batch=2, heads=3, d=5, with_v=True, with_bias=False, dtype=torch.float64,
                      requires_grad=True):
    """Head-major `q, k, values` and the relative terms `table, u, v, entry_bias` (v or entry_bias None)."""
    torch.manual_seed(0)
    make = lambda *shape: torch.randn(*shape, dtype=dtype, requires_grad=requires_grad)  # noqa: E731
    return (make(batch, heads, qlen, d), make(batch, heads, klen, d), make(batch, heads, klen, d),
            make(heads, klen, d), make(heads, d), make(heads, d) if with_v else None,
            make(heads, klen) if with_bias else None)


def _first_row_masked(mask):
    mask[0] = True
    return mask


# Inner masks (True = masked) as `attend` takes them: `[qlen, klen]` or `[qlen, klen, batch]`
MASKS = {
    'none': lambda q, k: None,
    'causal': lambda q, k: decoder_causal_mask(q, k),
    # Per batch element, with one row of the second element fully masked
    'per-batch': lambda q, k: torch.stack([decoder_causal_mask(q, k),
                                           _first_row_masked(torch.ones(q, k, dtype=torch.bool).triu(1))], dim=-1),
}


def _attend(impl, q, k, values, table, u, v, entry_bias, masked, scale, mlen=0, **kwargs):
    """`dispatch.attend` with the keys and values in one part (`mlen = 0`) or as `mlen` of memory and the rest."""
    memory = {}
    if mlen > 0:
        memory = dict(k_memory=k[:, :, :mlen], values_memory=values[:, :, :mlen])
        k, values = k[:, :, mlen:], values[:, :, mlen:]
    terms = RelativeTerms(table, content_bias=u, position_bias=v, entry_bias=entry_bias)
    return dispatch.attend(Plan.now(q.device, impl), q, k, values, scale=scale, masked=masked, terms=terms,
                           **memory, **kwargs)


@pytest.mark.parametrize('mlen', [0, 3], ids=['one-part', 'memory-in-two-parts'])
@pytest.mark.parametrize('mask', MASKS)
@pytest.mark.parametrize('with_v,with_bias', [(True, False), (False, True)], ids=['type0', 'type1'])
def test_composite_attention_and_its_gradients_equal_the_reference(mask, with_v, with_bias, mlen):
    """The composite (`attention_heads.py`, autograd through it) against the reference, output, weights and the
    gradients of every input: in float64 with gradients it is what `impl='auto'` runs (the kernel takes float32, SDPA
    has no backward for the position bias)."""
    q, k, values, r, u, v, entry_bias = inputs = _attention_inputs(with_v=with_v, with_bias=with_bias)
    masked = MASKS[mask](4, 7)
    leaves = [t for t in inputs if t is not None]
    grad_out, grad_weights = torch.randn(4, 2, 15, dtype=torch.float64), torch.randn(4, 7, 2, 3, dtype=torch.float64)
    results = []
    for impl in ('auto', 'reference'):
        with dispatch.recording() as choices:
            out, weights = _attend(impl, *inputs, masked, 0.3, mlen=mlen, need_weights=True)
        results.append((out, weights, torch.autograd.grad([out, weights], leaves, [grad_out, grad_weights])))
        assert _chosen(choices) == ['composite' if impl == 'auto' else 'reference']
    (out, weights, grads), (ref_out, ref_weights, ref_grads) = results
    # Rule 1: float64 both
    assert_same_function(out, ref_out)
    assert_same_function(weights, ref_weights)
    for a, b in zip(grads, ref_grads):
        assert_same_function(a, b)
    if mask == 'per-batch':
        # The fully masked row attends to nothing
        assert torch.equal(weights[0, :, 1], torch.zeros_like(weights[0, :, 1]))
        assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))


def test_composite_is_chosen_in_float64_with_gradients_for_the_reasons_given():
    inputs = _attention_inputs()
    with dispatch.recording() as choices:
        _attend('auto', *inputs, MASKS['causal'](4, 7), 0.3)
    choice, = choices
    assert choice.operation == 'attention' and choice.chosen == 'composite'
    reasons = _refusals(choice)
    assert list(reasons) == ['kernel', 'sdpa']
    assert 'an input is torch.float64' in reasons['kernel'] and 'gradients are recorded' in reasons['sdpa']


def test_composite_attention_under_bf16_autocast_equals_the_reference():
    """Under autocast the products run in bf16 and the softmax in float32, in both: weights and output in bf16,
    equal to bf16's rounding (the two round at other steps: the composite scales the queries before its products,
    the reference the scores after them), and so are the gradients."""
    q, k, values, r, u, v, _ = inputs = _attention_inputs(dtype=torch.float32)
    masked = MASKS['causal'](4, 7)
    grad = torch.randn(4, 7, 2, 3).bfloat16()
    results = []
    for impl in ('auto', 'reference'):
        with torch.autocast('cpu', dtype=torch.bfloat16), dispatch.recording() as choices:
            _, weights = _attend(impl, *inputs, masked, 0.3, need_weights=True)
        assert _chosen(choices) == ['composite' if impl == 'auto' else 'reference']
        results.append((weights, torch.autograd.grad(weights, (q, k, r, u, v), grad)))
    (composite, composite_grads), (reference, reference_grads) = results
    assert composite.dtype == reference.dtype == torch.bfloat16
    # Rule 2 in bf16, weights at most 1: a score's product (its inputs, its output), the sum of the two terms and
    # the scale, the weights' own rounding after the float32 softmax: depth 2 + 1 + 1 + 1
    assert_close_rounding(composite, reference, depth=5)
    for a, b in zip(composite_grads, reference_grads):
        # ... and back: the gradient of the scores in bf16 (1), the scale's (1), the product's backward (its
        # output, 1; its inputs are those of the forward): depth 5 + 3
        assert_close_rounding(a, b, depth=5 + 3, dtype=torch.bfloat16)


def test_composite_attention_passes_gradcheck():
    q, k, values, r, u, v, entry_bias = _attention_inputs(qlen=3, klen=5, batch=2, heads=2, d=3, with_bias=True)
    masked = MASKS['causal'](3, 5)
    with dispatch.recording() as choices:
        torch.autograd.gradcheck(lambda *t: _attend('auto', *t, masked, 0.7, need_weights=True),
                                 (q, k, values, r, u, v, entry_bias))
    assert set(_chosen(choices)) == {'composite'}


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
def test_sdpa_position_bias_equals_the_naive_masked_shifted_product(qlen, mlen, padded):
    """The position terms SDPA takes as its bias (`composite.shifted_position_scores`) against the naive product on the
    causal part, and SDPA's attention with them against the reference (float64, no gradients: SDPA runs)."""
    batch, heads, d_head, klen = 2, 3, 4, mlen + qlen
    # The queries in the projection's layout (`[qlen, batch, heads, d_head]` in memory), as the model passes them
    q = torch.randn(qlen, batch, heads, d_head, dtype=torch.float64).permute(1, 2, 0, 3)
    k, values = (torch.randn(batch, heads, klen, d_head, dtype=torch.float64) for _ in range(2))
    r = torch.randn(heads, klen, d_head, dtype=torch.float64)
    u, v = torch.randn(heads, d_head, dtype=torch.float64), torch.randn(heads, d_head, dtype=torch.float64)
    table = pad_table(r, klen) if padded else r
    causal = decoder_causal_mask(qlen, klen)
    bias = shifted_position_scores(q, table, v, None, klen, 0.5).masked_fill(causal, float('-inf'))
    naive = _naive_causal_bias(q, r, v, 0.5, mlen)
    # -inf at the same places; rule 1 (float64 both) on the rest
    assert torch.equal(bias.isinf(), naive.isinf())
    assert_same_function(bias[~naive.isinf()], naive[~naive.isinf()])
    results = []
    with torch.no_grad():
        for impl in ('auto', 'reference'):
            with dispatch.recording() as choices:
                results.append(_attend(impl, q, k, values, table, u, v, None, causal, 0.5, mlen=mlen)[0])
            assert _chosen(choices) == ['sdpa' if impl == 'auto' else 'reference']
    assert_same_function(results[0], results[1])


SDPA_MASKS = {
    'none': lambda q, k, b: None,
    'causal': lambda q, k, b: decoder_causal_mask(q, k),
    'same_length': lambda q, k, b: decoder_window_mask(q, k, 4)[:, :, None],
    # Key padding per batch element (every query keeps a key)
    'padding': lambda q, k, b: torch.stack([torch.zeros(k, dtype=torch.bool), torch.arange(k) >= k - 2],
                                           dim=-1)[None].expand(q, k, b),
}


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('mlen', [0, 6])
@pytest.mark.parametrize('mask', SDPA_MASKS)
@pytest.mark.parametrize('with_v,with_bias', [(True, False), (False, True)], ids=['type0', 'type1'])
def test_sdpa_attention_equals_the_reference(mlen, mask, with_v, with_bias, dtype):
    """SDPA with the position terms as its bias (our kernels disabled, no gradients) against the reference, with the
    memory's keys and values given apart: in float64, the same function; in float32, both within float32's rounding
    of the reference in float64."""
    qlen = 5
    klen = mlen + qlen
    inputs = _attention_inputs(qlen=qlen, klen=klen, batch=2, heads=3, d=8, with_v=with_v, with_bias=with_bias,
                               dtype=dtype, requires_grad=False)
    q = inputs[0].permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    masked = SDPA_MASKS[mask](qlen, klen, 2)
    results = []
    with torch.no_grad(), native.disabled():
        for impl in ('auto', 'reference'):
            with dispatch.recording() as choices:
                results.append(_attend(impl, q, *inputs[1:], masked, 0.125, mlen=mlen)[0])
            assert _chosen(choices) == ['sdpa' if impl == 'auto' else 'reference']
    if dtype == torch.float64:
        assert_same_function(results[0], results[1])
    else:
        with torch.no_grad():
            expected = _attend('reference', *(None if t is None else t.double() for t in (q, *inputs[1:])), masked,
                               0.125, mlen=mlen)[0]
        for result in results:
            # Rule 2: a score's product over d_head 8 and its elementwise steps (q + u or q + v, the scale, the
            # entry bias, the sum of the terms: 4), the softmax and the weighted sum over klen
            assert_close_rounding(result, expected, depth=8 + 4 + 2 * klen)


def test_kernel_serves_only_a_decoder_window_mask_in_float32():
    """Which implementation `attend` picks, and why the ones before it were refused, for the inputs that decide;
    whatever runs gives the reference's numbers."""
    qlen, mlen, klen = 3, 4, 7
    base = _attention_inputs(qlen=qlen, klen=klen, dtype=torch.float32, requires_grad=False)
    d_head = base[0].shape[-1]
    causal = decoder_causal_mask(qlen, klen)
    dropout = Dropout(0.5).train()
    cases = {
        'causal': (dict(masked=causal), 'kernel', {}),
        'causal [q, k, 1]': (dict(masked=causal[:, :, None]), 'kernel', {}),
        'same_length': (dict(masked=decoder_window_mask(qlen, klen, mlen)), 'kernel', {}),
        'no mask': (dict(masked=None), 'sdpa', {'kernel': "the mask is not a decoder's"}),
        'per-batch mask': (dict(masked=causal[:, :, None].expand(qlen, klen, 2)), 'sdpa',
                           {'kernel': "the mask is not a decoder's"}),
        'float64': (dict(masked=causal, dtype=torch.float64), 'sdpa', {'kernel': 'an input is torch.float64'}),
        'bf16 autocast': (dict(masked=causal, autocast=True), 'sdpa', {'kernel': 'under autocast'}),
        'short table': (dict(masked=causal, rlen=klen - 1), 'sdpa', {'kernel': 'a table of 6 entries for 7 keys'}),
        'a fully masked row': (dict(masked=_first_row_masked(causal.clone())), 'composite',
                               {'kernel': "the mask is not a decoder's", 'sdpa': 'a query has every key masked'}),
        'need_weights': (dict(masked=causal, need_weights=True), 'composite',
                         {'kernel': 'need_weights', 'sdpa': 'need_weights'}),
        'attention dropout': (dict(masked=causal, dropout=dropout), 'composite',
                              {'kernel': 'attention dropout in training', 'sdpa': 'attention dropout in training'}),
        'gradients': (dict(masked=causal, grad=True), 'kernel', {}),
    }
    for name, (case, expected, reasons) in cases.items():
        dtype = case.get('dtype', torch.float32)
        q, k, values, table, u, v = (t.detach().to(dtype).requires_grad_(case.get('grad', False)) for t in base[:6])
        if 'rlen' in case:
            table = table[:, klen - case['rlen']:]
        kwargs = dict(need_weights=case.get('need_weights', False), dropout=case.get('dropout'))
        with torch.set_grad_enabled(case.get('grad', False)), \
                torch.autocast('cpu', dtype=torch.bfloat16, enabled=case.get('autocast', False)):
            with dispatch.recording() as choices:
                torch.manual_seed(1)
                out, _ = _attend('auto', q, k, values, table, u, v, None, case['masked'], 0.3, **kwargs)
        if 'rlen' not in case:
            # The reference in float64 on the same inputs (with attention dropout, not compared below);
            # (it takes tables of at least `klen` entries, as `RelativeTerms` asks)
            torch.manual_seed(1)
            expected_out, _ = _attend('reference', *(t.detach().double() for t in (q, k, values, table, u, v)), None,
                                      case['masked'], 0.3, **kwargs)
        choice, = [c for c in choices if c.operation == 'attention']
        assert choice.chosen == expected, (name, str(choice))
        refused = _refusals(choice)
        assert set(refused) == set(reasons), (name, str(choice))
        for implementation, fragment in reasons.items():
            assert fragment in refused[implementation], (name, str(choice))
        if name not in ('attention dropout', 'short table'):
            message = lambda m: f'{name}: {m}'  # noqa: E731
            if dtype == torch.float64:
                # Rule 1
                assert_same_function(out, expected_out, msg=message)
            elif case.get('autocast'):
                # Rule 2 in bf16 (SDPA under autocast): the position terms' product (its inputs, its output), the
                # bias rounded into SDPA, SDPA's inputs, its output: depth 2 + 1 + 1 + 1
                assert_close_rounding(out, expected_out, depth=5, dtype=torch.bfloat16, msg=message)
            else:
                # Rule 2: a score's product over d_head and its elementwise steps (q + u or q + v, the scale, the
                # sum of the terms: 3), the softmax and the weighted sum over klen
                assert_close_rounding(out, expected_out, depth=d_head + 3 + 2 * klen, msg=message)


# -- the model: impl='auto' against impl='reference' --

def _pair(**overrides):
    plain, fast = plain_and_fast(**overrides)
    assert (plain.impl, fast.impl) == ('reference', 'auto')
    return plain, fast


def _segments(model, data, n=3, grad=True, tgt_len=5, seed=None):
    """Losses and memories of `n` consecutive segments; the gradients of the last segment's mean loss. With `seed`,
    the generator is seeded before the first segment (the dropout masks are drawn from it)."""
    model.zero_grad()
    if seed is not None:
        torch.manual_seed(seed)
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


def _xl_depth(klen, batch, qlen=5, parameter=None, n_layer=2, adaptive=False, dropout=False, d_model=16, n_head=2,
              d_head=8, d_inner=32, n_token=40):
    """Rule 2's depth of a `MemTransformerLM` (`small_config`'s sizes by default) over `klen` keys: the reductions
    on the longest path to a loss or a memory, or with the name of a `parameter` to its gradient
    (`tests/tolerance.py`)."""
    config = dict(n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_head, d_inner=d_inner, n_token=n_token)
    forward = xl_depths(config, klen, adaptive=adaptive, dropout=dropout)[1]
    if parameter is None:
        return forward
    # Back: the log-softmax and the output projection (n_token each); per layer the same reductions transposed:
    # the layer norms (2 x 2 d_model), the feed-forward (d_model, d_inner), the output projection (d_model), the
    # weighted sum (d_head), the softmax and the scores (klen each), the projections to q, k, v (3 n_head d_head);
    # then the parameter's own sum: over every score for the biases u and v (batch * qlen * klen), else over the
    # rows (batch * qlen) and, for the table's projection, its klen entries
    backward = 2 * n_token + n_layer * (4 * d_model + d_model + d_inner + d_model + d_head + 2 * klen
                                        + 3 * n_head * d_head)
    own = batch * qlen * klen if parameter.endswith(('r_w_bias', 'r_r_bias')) else batch * qlen + klen
    return forward + backward + own


def _assert_same_segments(plain_run, fast_run, depth):
    """Rule 2, float32 both: losses, memories and each parameter's gradient within `depth(parameter name or None)`
    (`_xl_depth`)."""
    (pl, pm, pg), (fl, fm, fg) = plain_run, fast_run
    for a, b in zip(pl + pm, fl + fm):
        assert_close_rounding(b, a, depth=depth(None))
    assert pg.keys() == fg.keys()
    for name in pg:
        assert_close_rounding(fg[name], pg[name], depth=depth(name), msg=lambda m: f'{name}: {m}')


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
    # Segments of 5 over a memory of 5: klen 10, batch 3
    adaptive = 'cutoffs' in overrides
    _assert_same_segments(_segments(plain, data, grad=grad), _segments(fast, data, grad=grad),
                          lambda name: _xl_depth(10, 3, parameter=name, adaptive=adaptive))


@pytest.mark.parametrize('dropout', ['dropout', 'dropatt'])
@pytest.mark.parametrize('attn_type', [0, 1, 2])
def test_both_impls_draw_the_same_dropout_masks(attn_type, dropout):
    """Dropout is not a matter of `impl`: from the same seed, training with dropout (on the layers' outputs, or on
    the attention weights) gives the same losses, memories and gradients either way, by the same dropout paths."""
    plain, fast = _pair(attn_type=attn_type, **{dropout: 0.2})
    data = torch.randint(40, (16, 3))
    runs, paths = [], []
    for model in (plain, fast):
        with dispatch.recording() as choices:
            runs.append(_segments(model, data, seed=7))
        paths.append(_masks_drawn(choices))
    assert paths[0] == paths[1] and paths[0]
    # Dropout did drop: another seed gives other losses
    other = _segments(plain, data, seed=8)[0]
    assert not all(torch.equal(a, b) for a, b in zip(runs[0][0], other))
    _assert_same_segments(*runs, lambda name: _xl_depth(10, 3, parameter=name, dropout=True))


REFERENCE_FILES = [p for p in reference_files() if p is not None][:13]


def _reference_segment_losses(path, dtype):
    """`(our loss, the reference segment)` for every segment of a reference file, evaluated without gradients in
    `dtype` with `impl='auto'` (under whatever autocast the caller has on)."""
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
    """The evaluation path (SDPA with the positions as a bias: float64 is not the kernel's) against the original's
    float64 losses."""
    # Rule 2 as `xl/test_reference.py` has it for the default numerics: the original's float64 losses carry one
    # float32 rounding of the scores a layer (its `attn_score.float()`, which the fast path does not copy)
    n_layer = torch.load(path, weights_only=True)['config']['model']['n_layer']
    with dispatch.recording() as choices:
        for loss, seg in _reference_segment_losses(path, torch.float64):
            assert_close_rounding(loss, seg['loss'], depth=n_layer, dtype=torch.float32)
    assert set(_chosen(choices)) == {'sdpa'}


def test_switching_impl_gives_the_same_numbers():
    plain, model = _pair()
    model.eval()
    data = torch.randint(40, (6, 2))
    fast_loss = model(data[:5], data[1:6])[0]
    model.impl = 'reference'
    with dispatch.recording() as choices:
        # Rule 2, float32 both: one segment of 5, no memory, batch 2
        assert_close_rounding(model(data[:5], data[1:6])[0], fast_loss, depth=_xl_depth(5, 2))
    assert set(_chosen(choices)) == {'reference'}
    model.impl = 'auto'
    with dispatch.recording() as choices:
        torch.testing.assert_close(model(data[:5], data[1:6])[0], fast_loss, atol=0, rtol=0)
    assert 'reference' not in _chosen(choices)


def test_impl_takes_only_auto_or_reference():
    model = MemTransformerLM(**small_config())
    for bad in ('fast', 'Reference', True, None):
        with pytest.raises(ValueError, match=r"impl=.* is not accepted: 'auto' .* or 'reference'"):
            MemTransformerLM(**small_config(), impl=bad)
        with pytest.raises(ValueError, match=r"'auto' .* or 'reference'"):
            model.impl = bad
        assert model.impl == 'auto'
        with pytest.raises(ValueError, match=r"'auto' .* or 'reference'"):
            MultiHeadAttention(2, 8, impl=bad, positions=Relative())


@pytest.mark.parametrize('attn_type', [0, 1, 2])
@pytest.mark.parametrize('grad', [True, False], ids=['train-grad', 'no-grad'])
def test_impl_reference_makes_every_choice_the_specification(attn_type, grad):
    """`impl='reference'` reaches every part with a choice (attention, the linear layers of the attention, the
    feed-forward network and the adaptive softmax, the residual layer norms): each runs its specification, where
    `impl='auto'` takes a faster implementation for some of each. Dropout takes the same paths either way."""
    plain, fast = _pair(attn_type=attn_type, dropout=0.1, cutoffs=[10, 20], div_val=2)
    data = torch.randint(40, (11, 2))
    recorded = []
    for model in (plain, fast):
        model.train(grad)
        with dispatch.recording() as choices:
            _segments(model, data, n=2, grad=grad, seed=3)
        recorded.append(choices)
    reference, auto = recorded
    specification = {'attention': 'reference', 'linear': 'F.linear', 'residual layer norm': 'PyTorch',
                     'decoder layers': 'modules', 'memory projection': 'with the segment'}
    # (dropout takes the same paths either way; the adaptive softmax's choice is torch.compile's, not impl's)
    assert {c.operation for c in reference} == set(specification) | {'dropout', 'adaptive softmax'}
    for operation, chosen in specification.items():
        assert set(_chosen(reference, operation)) == {chosen}, operation
        for choice in reference:
            if choice.operation == operation:
                assert all("impl='reference'" in reason for _, reason in choice.refused), str(choice)
    # Without gradients the layers of types 0 and 1 (these segments are a few rows, and their memories' keys and
    # values are kept) run as one call each, the decoder-layer kernel; everything else chooses each operation as
    # the reference does
    fused = not grad and attn_type in (0, 1)
    assert set(_chosen(auto, 'decoder layers')) == {'fused' if fused else 'modules'}
    if not fused:
        for operation in ('attention', 'residual layer norm'):
            assert len(_chosen(auto, operation)) == len(_chosen(reference, operation)), operation
        # The reference projects `[memory, segment]` in one product per layer, as the original; `auto` projects the
        # memory's keys and values apart (2 segments, the second with a memory, 2 layers)
        assert len(_chosen(auto, 'linear')) == len(_chosen(reference, 'linear')) + 2
        assert set(_chosen(auto, 'memory projection')) == {'apart'}
    assert set(_chosen(auto, 'adaptive softmax')) == set(_chosen(reference, 'adaptive softmax')) == {'target clusters'}
    assert _masks_drawn(reference) == _masks_drawn(auto)
    assert 'reference' not in _chosen(auto)
    if not grad:
        # (with gradients none serves: our kernels and the packed product are for inference; these segments are
        # short enough for the few-rows kernel, which the adaptive softmax's products take)
        assert 'few rows' in _chosen(auto, 'linear')
        assert fused or 'kernel' in _chosen(auto, 'residual layer norm')


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
    # Rule 2, float32 both (the prepacked weights are float32's): a segment of 5 over a memory of 5, batch 2 (stale
    # keys and values would be off by the step's change, lr 0.1)
    assert_close_rounding(after, expected, depth=_xl_depth(10, 2))


def test_positions_and_masks_are_cached_per_shape_and_dropped_when_lengths_change():
    _, model = _pair(same_length=True)
    model.eval()
    data = torch.randint(40, (12, 2))
    loss, *mems = model(data[:5], data[1:6])
    model(data[5:10], data[6:11], *mems)
    keys = set(model._memory.shapes)
    assert {k[0] for k in keys} == {'mask'} and len(keys) == 2, 'one mask per (qlen, mlen)'
    # One table of positions for both, as long as a segment over a full memory (mem_len 5, tgt_len 5)
    (table,) = model._memory.tables.values()
    assert table.shape[0] == 10
    mask_key = next(k for k in keys if k[0] == 'mask' and k[2] == 5)
    model(data[5:10], data[6:11], *mems)
    assert set(model._memory.shapes) == keys, 'the same shapes reuse the cache'
    assert next(iter(model._memory.tables.values())) is table, 'the same table serves again'
    model.reset_length(5, 0, 3)
    assert model._memory.shapes == {} and model._memory.tables == {}, 'new lengths start a fresh cache'
    # `same_length` masks depend on mem_len: the cached mask of the old mem_len is not reused
    expected = model._attn_mask(5, 5, data.device)
    model(data[5:10], data[6:11], *mems)
    assert torch.equal(model._memory.shapes[('mask', 5, 5, 3) + mask_key[4:]], expected)
    model.double()
    assert model._memory.shapes == {}, 'a new dtype starts a fresh cache'
    model(data[:5], data[1:6])
    assert all(v.dtype in (torch.float64, torch.bool) for v in model._memory.shapes.values())
    assert [v.dtype for v in model._memory.tables.values()] == [torch.float64]


def test_cached_positions_see_loaded_frequencies():
    _, model = _pair()
    # (in float64, where positions are cached as in float32: rule 1 below)
    model.double().eval()
    data = torch.randint(40, (6, 2))
    before = model(data[:5], data[1:6])[0]
    with torch.no_grad():
        model.pos_emb.inv_freq.mul_(2)
    after = model(data[:5], data[1:6])[0]
    model.impl = 'reference'
    assert_same_function(after, model(data[:5], data[1:6])[0])
    assert not torch.equal(before, after)


def test_tables_of_frequencies_loaded_again_and_again_are_not_all_kept():
    """Each load of the frequencies keys a new table of positions; the old ones are never read again, so no more than
    `MOST_KEPT` are held (evaluating checkpoint after checkpoint on one model would otherwise grow without bound)."""
    _, model = _pair()
    model.eval()
    data = torch.randint(40, (6, 2))
    for _ in range(3 * MOST_KEPT):
        model.load_state_dict(model.state_dict())
        model(data[:5], data[1:6])
    assert 1 <= len(model._memory.tables) <= MOST_KEPT


@pytest.mark.parametrize('kernel', [True, False], ids=['kernel', 'no-kernel'])
def test_model_evaluation_takes_the_causal_kernel_else_sdpa(kernel):
    """Without `same_length`, every evaluation segment's mask is the decoder's causal mask: our kernel runs each
    layer's attention, or, where our kernels are disabled, SDPA with the position terms as its bias; the reference
    runs neither. (Segments of 20 rows: more than the fused decoder layer takes, so each attention is chosen.)"""
    plain, fast = _pair()
    data = torch.randint(40, (16, 4))
    for model in (plain, fast):
        model.eval()
    with dispatch.recording() as plain_choices:
        plain_run = _segments(plain, data, grad=False)
    with native.disabled() if not kernel else contextlib.nullcontext(), dispatch.recording() as fast_choices:
        fast_run = _segments(fast, data, grad=False)
    # 3 segments of 2 layers
    assert _chosen(plain_choices) == ['reference'] * 6
    assert _chosen(fast_choices) == ['kernel' if kernel else 'sdpa'] * 6
    if not kernel:
        for choice in fast_choices:
            if choice.operation == 'attention':
                assert list(_refusals(choice)) == ['kernel'] and 'disabled' in _refusals(choice)['kernel']
    (pl, pm, _), (fl, fm, _) = plain_run, fast_run
    for a, b in zip(pl + pm, fl + fm):
        # Rule 2, float32 both: segments of 5 over a memory of 5, batch 4
        assert_close_rounding(b, a, depth=_xl_depth(10, 4))


# -- MultiHeadAttention with the 'relative' scheme --

def _relative_mha_pair(d_model, dtype=torch.float32, training=False):
    """`MultiHeadAttention(positions=Relative())` with `impl='auto'` and with `impl='reference'`, the same weights."""
    torch.manual_seed(0)
    fast = MultiHeadAttention(2, d_model, dropout_prob=0.0, positions=Relative()).to(dtype).train(training)
    with torch.no_grad():
        fast.r_w_bias.normal_()
        fast.r_r_bias.normal_()
    plain = MultiHeadAttention(2, d_model, dropout_prob=0.0, positions=Relative(),
                               impl='reference').to(dtype).train(training)
    plain.load_state_dict(fast.state_dict())
    return fast, plain


def _graph_has(tensor, name):
    """Whether autograd's graph of `tensor` has a node named `name`."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == name:
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


@pytest.mark.parametrize('mask_kind', ['none', 'causal', 'padding'])
def test_relative_mha_fast_equals_plain(mask_kind):
    attn, plain = _relative_mha_pair(8, torch.float64)
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    mask = None
    if mask_kind == 'causal':
        mask = subsequent_mask(5)
    elif mask_kind == 'padding':
        mask = torch.ones(1, 5, 3, dtype=torch.bool)
        mask[0, 3:, 1] = False
        mask = mask.expand(5, 5, 3).clone()
        mask[2, :, 2] = False  # a query with every key masked attends to nothing
    with dispatch.recording() as choices:
        out, weights = attn(query=x, key=x, value=x, mask=mask, need_weights=True)
        out_plain, weights_plain = plain(query=x, key=x, value=x, mask=mask, need_weights=True)
    assert _chosen(choices) == ['composite', 'reference']
    # Rule 1: float64 both
    assert_same_function(out, out_plain)
    assert_same_function(weights, weights_plain)
    if mask_kind == 'padding':
        assert torch.equal(weights[2, :, 2], torch.zeros_like(weights[2, :, 2]))


@pytest.mark.parametrize('training', [False, True], ids=['eval', 'train'])
def test_relative_mha_under_a_causal_mask_runs_the_kernel_and_equals_plain(training):
    """float32 under the decoder's causal mask: `impl='auto'` runs our kernel (forward, and its backward in training)
    and matches the reference's output and gradients; with `need_weights` it does not (the kernel keeps no weights to
    return)."""
    attn, plain = _relative_mha_pair(16, training=training)
    x = torch.randn(37, 3, 16)

    def output_and_gradients(module):
        source = x.clone().requires_grad_()
        with torch.set_grad_enabled(training):
            out = module(query=source, key=source, value=source, mask=subsequent_mask(37))
        if not training:
            return [out]
        assert _graph_has(out, '_CausalRelativeAttentionBackward') == (module is attn)
        parameters = [source] + list(module.parameters())
        return [out] + list(torch.autograd.grad(out, parameters, torch.ones_like(out)))

    with dispatch.recording() as choices:
        fast = output_and_gradients(attn)
    assert _chosen(choices) == ['kernel']
    # Rule 2, float32 both (they share the float32 table of positions, whose angles up to 72 the float64 computation
    # would round otherwise: the comparison is of the attentions). Forward: the projections over d_model 16 (of
    # the table too), a score's product over d_head 8 and the sum of its terms, the softmax and the weighted sum over
    # 37 keys, the output projection over 16. Back: the output projection (16), the weighted sum (8), the softmax
    # and the scores (37 each), the projections (3 x 16); then the parameter's own sum: over every score for u and
    # v (3 x 37 x 37), else over the rows (3 x 37) and for the table's projection its 73 entries
    forward = 16 + 8 + 1 + 2 * 37 + 16
    backward = forward + 16 + 8 + 2 * 37 + 3 * 16
    own = [3 * 37 * 37 if name in ('r_w_bias', 'r_r_bias') else 3 * 37 + 73 for name, _ in attn.named_parameters()]
    # (the output, the input's gradient, the parameters')
    for a, b, depth in zip(fast, output_and_gradients(plain), [forward, backward] + [backward + n for n in own]):
        assert_close_rounding(a, b, depth=depth)
    with torch.set_grad_enabled(training), dispatch.recording() as choices:
        attn(query=x, key=x, value=x, mask=subsequent_mask(37), need_weights=True)
    choice, = [c for c in choices if c.operation == 'attention']
    assert choice.chosen != 'kernel' and 'need_weights' in _refusals(choice)['kernel']


# -- torch.compile --

def test_whole_model_compiles_without_graph_breaks(monkeypatch):
    """`fullgraph=True` fails on any graph break; training step with memories, and with clusters."""
    # Inductor's caches are not keyed by the vector ISA that ATEN_CPU_CAPABILITY sets: code generated for AVX-512
    # (16 lanes) and built again for AVX2 reads out of bounds. One cache per ISA.
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', f'{cache_dir()}-{torch.backends.cpu.get_cpu_capability()}')
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(n_layer=1, cutoffs=[10, 20], div_val=2))
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    data = torch.randint(40, (6, 2))
    loss, *mems = compiled(data[:5], data[1:6])
    loss.mean().backward()
    expected, *expected_mems = model(data[:5], data[1:6])
    # Rule 2, float32 both (the compiled model is the one users train, in float32): one layer, one segment of 5,
    # batch 2, the adaptive softmax
    depth = _xl_depth(5, 2, n_layer=1, adaptive=True)
    assert_close_rounding(loss, expected, depth=depth)
    for a, b in zip(mems, expected_mems):
        assert_close_rounding(a, b, depth=depth)


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


def test_generation_steps_project_nothing_of_the_past(monkeypatch):
    """With a full memory, every product of a step has one row: the memory's keys and values and the projected
    distance table are kept from the step before (no-grad evaluation), not recomputed."""
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(tgt_len=8, mem_len=8))
    events = []
    # The kernels a linear layer reaches: MKL's (`F.linear`), oneDNN's (`prepacked_linear`) and our few-rows kernel
    linear_kernels = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                      torch.ops.mkldnn._linear_pointwise.default)

    class RowsOfProducts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in linear_kernels:
                # Positions in the product: its rows are `[seq * bsz]` with bsz = 2
                events.append(args[1 if func is torch.ops.aten.addmm.default else 0].shape[0] // 2)
            return func(*args, **(kwargs or {}))

    few_rows_linear = native_few_rows.few_rows_linear

    def counted_few_rows_linear(x, *args):
        events.append(x.numel() // x.shape[-1] // 2)
        return few_rows_linear(x, *args)

    monkeypatch.setattr(native_few_rows, 'few_rows_linear', counted_few_rows_linear)

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


def test_masked_softmax_over_the_last_axis_leaves_its_input_alone_unless_asked():
    scores = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    masked = torch.ones(4, 6, dtype=torch.bool).triu(3)
    masked[1] = True  # a fully masked row: zero weights, as over axis 1
    before = scores.clone()
    probs = masked_softmax(scores, masked, dim=-1)
    assert torch.equal(scores, before)
    expected = masked_softmax(scores.permute(2, 3, 0, 1), masked[:, :, None, None], dim=1).permute(2, 3, 0, 1)
    # Rule 1: float64 both
    assert_same_function(probs, expected)
    assert torch.equal(probs[:, :, 1], torch.zeros(2, 3, 6, dtype=torch.float64))
    # Asked (a fresh product nothing else reads): the masked scores are filled in place, the weights the same
    in_place = masked_softmax(scores, masked, dim=-1, inplace=True)
    assert torch.equal(in_place, probs)
    assert torch.equal(scores[..., ~masked], before[..., ~masked])
    assert (scores[..., masked] == torch.finfo(scores.dtype).min).all()
