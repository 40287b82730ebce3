"""
The dispatcher (`labml_txl.fast.dispatch`): which implementation of attention it picks for each kind of call, with the
reasons it gives for the ones it refuses, and that each implementation (`kernel`, `sdpa`, `composite`, `reference`)
computes the same attention, forward and backward, as a pair-by-pair computation in float64 and as the reference
(`relative_attention.py`).
"""
import math

import pytest
import torch

from labml_txl.fast import dispatch
from labml_txl.attention.masks import decoder_causal_mask, decoder_window_mask
from labml_txl.fast.dispatch import Plan, RelativeTerms
from labml_txl.fast.dropout import Dropout
from labml_txl.attention.reference import dot_product_scores
from labml_txl.positions.relative import Relative
from labml_txl.xl import MemTransformerLM
from labml_txl.xl.attention import XLAttention
from labml_txl.transformer.mha import MultiHeadAttention

from tolerance import assert_close_rounding, assert_same_function, rounding_bound, xl_depths
from xl.helpers import small_config


def _rotated(x, positions, d_rotary):
    """RoFormer's rotation written pair by pair: features `f` and `f + d/2` at position `m` turned by
    `m * 10000 ** (-2 f / d)`. Head-major `x`, one position per row of axis -2."""
    out = x.clone()
    for row, m in enumerate(positions):
        for f in range(d_rotary // 2):
            angle = m * 10000 ** (-2 * f / d_rotary)
            a, b = x[..., row, f], x[..., row, f + d_rotary // 2]
            out[..., row, f] = a * math.cos(angle) - b * math.sin(angle)
            out[..., row, f + d_rotary // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


def _naive(q, k, values, scale, masked=None, terms=None, score_factor=1.0):
    r"""Attention written pair by pair in float64: the queries and keys rotated first where the terms say (keys at
    positions `0 .. klen - 1`, the queries the last `qlen`), then $A_{i,j} = (q_i + u)^\top k_j + (q_i + v)^\top r_s +
    b_s$ at table entry $s = j + q - 1 - i$ (each term only where the terms have it; none past the table, where a
    decoder masks), times `score_factor`, the softmax of $\mathit{scale} \cdot A$ over the keys not masked (none: zero
    weights), the weighted values. Head-major inputs; returns `[qlen, batch, heads * d]` and the weights `[qlen, klen,
    batch, heads]`."""
    q, k, values = (t.double() for t in (q, k, values))
    batch, heads, qlen, d = q.shape
    klen = k.shape[-2]
    if terms is not None:
        table, u, v, b = (None if t is None else t.double() for t in (terms.table, terms.content_bias,
                                                                      terms.position_bias, terms.entry_bias))
        if terms.rotary_features:
            q = _rotated(q, range(klen - qlen, klen), terms.rotary_features)
            k = _rotated(k, range(klen), terms.rotary_features)
    rows = []
    for i in range(qlen):
        row = []
        for j in range(klen):
            q_i = q[:, :, i]
            content = q_i if terms is None or u is None else q_i + u
            score = (content * k[:, :, j]).sum(-1)
            s = j + qlen - 1 - i
            if terms is not None and table is not None and s < table.shape[1]:
                score = score + ((q_i if v is None else q_i + v) * table[:, s]).sum(-1)
            if terms is not None and b is not None and s < b.shape[1]:
                score = score + b[:, s]
            row.append(score)
        rows.append(torch.stack(row, dim=-1))
    scores = torch.stack(rows, dim=-2) * score_factor * scale
    if masked is not None:
        # `[batch or 1, 1, qlen or 1, klen]`
        masked = masked[None, None] if masked.dim() == 2 else masked.permute(2, 0, 1)[:, None]
        scores = scores.masked_fill(masked, float('-inf'))
        nothing = masked.all(-1, keepdim=True)
        weights = torch.where(nothing, 0.0, torch.softmax(scores.masked_fill(nothing, 0.0), dim=-1))
    else:
        weights = torch.softmax(scores, dim=-1)
    out = weights @ values
    return out.permute(2, 0, 1, 3).reshape(qlen, batch, heads * d), weights.permute(2, 3, 0, 1)


def _inputs(batch, heads, qlen, klen, d, rlen, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)

    q, k, values = randn(batch, heads, qlen, d), randn(batch, heads, klen, d), randn(batch, heads, klen, d)
    return [q, k, values, randn(heads, rlen, d), randn(heads, d), randn(heads, d), randn(heads, rlen)]


def _padding_mask(qlen, klen, batch, causal):
    """Keys past each sequence's length masked (`[1 or qlen, klen, batch]`), with the causal mask if asked; every
    query keeps a key."""
    lengths = torch.tensor([klen - 2 * b for b in range(batch)])
    padded = (torch.arange(klen)[:, None] >= lengths[None, :])[None]
    return padded | decoder_causal_mask(qlen, klen)[:, :, None] if causal else padded


def _row_masked_mask(qlen, klen, batch):
    """Causal, and one query of the last sequence with every key masked."""
    masked = decoder_causal_mask(qlen, klen)[:, :, None].repeat(1, 1, batch)
    masked[1, :, -1] = True
    return masked


# Each case: the inputs' dtype, gradients or not, the relative terms (a decoder's table of `klen` entries, an
# encoder's of `klen + qlen - 1`, a decoder's bias per entry without a table, a rotation of `D - 1` features, or
# none), the mask, what else the call asks for, and the implementation that
# must take it, with a fragment of each refused implementation's reason
CASES = {
    'kernel': dict(dtype=torch.float32, grad=False, terms='decoder', mask='causal', memory=True,
                   chosen='kernel', refused={}),
    'kernel-same-length': dict(dtype=torch.float32, grad=False, terms='decoder', mask='window',
                               chosen='kernel', refused={}),
    'kernel-training': dict(dtype=torch.float32, grad=True, terms='decoder', mask='causal', memory=True,
                            chosen='kernel', refused={}),
    'sdpa-relative': dict(dtype=torch.float32, grad=False, terms='encoder', mask=None,
                          chosen='sdpa', refused={'kernel': 'window'}),
    'sdpa-relative-float64': dict(dtype=torch.float64, grad=False, terms='decoder', mask='causal', memory=True,
                                  chosen='sdpa', refused={'kernel': 'float32'}),
    'sdpa-plain-training': dict(dtype=torch.float64, grad=True, terms=None, mask='padding',
                                chosen='sdpa', refused={'kernel': 'no relative table'}),
    'composite-training': dict(dtype=torch.float64, grad=True, terms='encoder', mask='padding',
                               chosen='composite', refused={'kernel': 'float32', 'sdpa': 'gradients'}),
    'composite-training-float32': dict(dtype=torch.float32, grad=True, terms='decoder', mask='padding-causal',
                                       memory=True, chosen='composite',
                                       refused={'kernel': 'window', 'sdpa': 'gradients'}),
    'composite-masked-row': dict(dtype=torch.float64, grad=False, terms='decoder', mask='row',
                                 chosen='composite', refused={'kernel': 'float32', 'sdpa': 'every key masked'}),
    'composite-plain-masked-row': dict(dtype=torch.float32, grad=True, terms=None, mask='row',
                                       chosen='composite', refused={'kernel': 'no relative table',
                                                                    'sdpa': 'every key masked'}),
    'composite-weights': dict(dtype=torch.float32, grad=True, terms='decoder', mask='causal', need_weights=True,
                              chosen='composite', refused={'kernel': 'need_weights', 'sdpa': 'need_weights'}),
    # The schemes with positions in the attention: a bias per distance alone (ALiBi's, T5's), a rotation
    'sdpa-bias': dict(dtype=torch.float32, grad=False, terms='bias', mask='causal', memory=True,
                      chosen='sdpa', refused={'kernel': 'no relative table'}),
    'sdpa-fixed-bias-training': dict(dtype=torch.float64, grad=True, terms='bias', fixed_terms=True, mask='causal',
                                     chosen='sdpa', refused={'kernel': 'no relative table'}),
    'composite-learned-bias-training': dict(dtype=torch.float64, grad=True, terms='bias', mask='padding-causal',
                                            memory=True, chosen='composite',
                                            refused={'kernel': 'no relative table',
                                                     'sdpa': 'gradients are recorded through the position terms'}),
    'sdpa-rotary-training': dict(dtype=torch.float64, grad=True, terms='rotary', mask='causal', memory=True,
                                 chosen='sdpa', refused={'kernel': 'no relative table'}),
    'composite-rotary-masked-row': dict(dtype=torch.float32, grad=False, terms='rotary', mask='row', memory=True,
                                        chosen='composite', refused={'sdpa': 'every key masked'}),
    'reference': dict(dtype=torch.float64, grad=True, terms='decoder', mask='causal', impl='reference',
                      memory=True, chosen='reference',
                      refused={name: "impl='reference'" for name in ('kernel', 'sdpa', 'composite')}),
    'reference-weights': dict(dtype=torch.float32, grad=False, terms=None, mask='row', impl='reference',
                              need_weights=True, chosen='reference',
                              refused={name: "impl='reference'" for name in ('kernel', 'sdpa', 'composite')}),
    # The original's float32 rounding of the scores changes float64 scores only (`original_numerics`)
    'kernel-rounded-float32': dict(dtype=torch.float32, grad=True, terms='decoder', mask='causal', round=True,
                                   chosen='kernel', refused={}),
    'reference-rounded': dict(dtype=torch.float64, grad=True, terms='decoder', mask='causal', round=True,
                              chosen='reference',
                              refused={name: 'rounded' for name in ('kernel', 'sdpa', 'composite')}),
    'reference-get-scores': dict(dtype=torch.float64, grad=True, terms=None, mask='causal', get_scores=True,
                                 chosen='reference',
                                 refused={name: 'get_scores' for name in ('kernel', 'sdpa', 'composite')}),
}

BATCH, HEADS, QLEN, MLEN, D = 2, 3, 6, 4, 5


def _case_inputs(case):
    klen = QLEN + MLEN
    rlen = klen + QLEN - 1 if case['terms'] == 'encoder' else klen
    q, k, values, table, u, v, b = _inputs(BATCH, HEADS, QLEN, klen, D, rlen, case['dtype'])
    terms = {None: None, 'decoder': RelativeTerms(table, u, v, b), 'encoder': RelativeTerms(table, u, v, b),
             'bias': RelativeTerms(entry_bias=b), 'rotary': RelativeTerms(rotary_features=D - 1)}[case['terms']]
    masked = {None: None, 'causal': decoder_causal_mask(QLEN, klen), 'window': decoder_window_mask(QLEN, klen, 5),
              'padding': _padding_mask(QLEN, klen, BATCH, causal=False),
              'padding-causal': _padding_mask(QLEN, klen, BATCH, causal=True),
              'row': _row_masked_mask(QLEN, klen, BATCH)}[case['mask']]
    return q, k, values, terms, masked


def _run(case, q, k, values, terms, masked, impl=None):
    """`dispatch.attend` on the case's inputs (keys and values in two parts where the case says), recording the
    choice: `(out, weights, choice)`."""
    memory = {}
    if case.get('memory'):
        memory = dict(k_memory=k[:, :, :MLEN], values_memory=values[:, :, :MLEN])
        k, values = k[:, :, MLEN:], values[:, :, MLEN:]
    get_scores = (lambda q_, k_: 2 * dot_product_scores(q_, k_)) if case.get('get_scores') else None
    with dispatch.recording() as choices:
        out, weights = dispatch.attend(Plan.now(q.device, impl or case.get('impl', 'auto')), q, k, values, scale=0.4,
                                       masked=masked, terms=terms, get_scores=get_scores,
                                       need_weights=case.get('need_weights', False),
                                       round_scores_to_float32=case.get('round', False), **memory)
    (choice,) = choices
    return out, weights, choice


def _leaves(q, k, values, terms, case):
    """The inputs that get gradients: queries, keys, values and the relative terms (unless the case fixes them)."""
    return [q, k, values] + ([] if terms is None or case.get('fixed_terms') else terms.tensors())


def _assert_close_to(actual, expected, dtype, depth):
    """In float64 the same function (rule 1, `tolerance.py`); where `dtype` is float32 (the inputs', or the scores'
    rounding), within float32's rounding of `depth` additions (rule 2)."""
    if dtype == torch.float64:
        assert_same_function(actual, expected)
    else:
        assert_close_rounding(actual, expected, depth=depth, dtype=dtype)


def _depths(case, d=D, qlen=QLEN, klen=QLEN + MLEN, batch=BATCH):
    """Rule 2's depths of the attention's output (and weights) and of the gradients. Forward: a score's `d`
    products and its terms' two additions, the softmax's normaliser and the weighted values over `klen` keys, and
    the rotation's three roundings (cos and sin, the two products, their sum) where the terms rotate. Backward: the
    weights' gradient dO V^T (`d`) and the softmax's sum over the keys, then the longest of the inputs' own sums,
    a bias's (over the batch's queries, each query's a sum over the keys and two products added), and the
    rotation's again."""
    rotation = 3 if case['terms'] == 'rotary' else 0
    forward = d + 2 + 2 * klen + rotation
    return forward, forward + d + klen + klen + 1 + batch * qlen + rotation


@pytest.mark.parametrize('case', CASES.values(), ids=CASES.keys())
def test_each_implementation_is_chosen_for_its_calls_with_the_reasons(case):
    q, k, values, terms, masked = _case_inputs(case)
    for t in _leaves(q, k, values, terms, case):
        t.requires_grad_(case['grad'])
    with torch.set_grad_enabled(case['grad']):
        choice = _run(case, q, k, values, terms, masked)[2]
    assert choice.operation == 'attention' and choice.chosen == case['chosen']
    refused = dict(choice.refused)
    # Every implementation tried before the chosen one is refused, each with its reason
    order = ['kernel', 'sdpa', 'composite', 'reference']
    assert list(refused) == order[:order.index(case['chosen'])]
    for name, fragment in case['refused'].items():
        assert fragment in refused[name], (name, refused[name])


@pytest.mark.parametrize('case', CASES.values(), ids=CASES.keys())
def test_each_implementation_equals_the_pairwise_computation_and_the_reference(case):
    """The output (and the weights where asked for) against `_naive` in float64 and against the reference path on the
    same inputs; with gradients, the gradients of queries, keys, values and every relative term too."""
    q, k, values, terms, masked = _case_inputs(case)
    # Against the unrounded computation, scores rounded to float32 are as close as float32 allows
    precision = torch.float32 if case.get('round') else case['dtype']
    leaves = _leaves(q, k, values, terms, case)
    for t in leaves:
        t.requires_grad_(case['grad'])
    with torch.set_grad_enabled(case['grad']):
        out, weights, choice = _run(case, q, k, values, terms, masked)
        reference_out, reference_weights, reference_choice = _run(case, q, k, values, terms, masked, 'reference')
    assert choice.chosen == case['chosen'] and reference_choice.chosen == 'reference'
    assert out.shape == (QLEN, BATCH, HEADS * D) and out.dtype == case['dtype']
    expected, expected_weights = _naive(q, k, values, 0.4, masked, terms, 2.0 if case.get('get_scores') else 1.0)
    depth, gradient_depth = _depths(case)
    _assert_close_to(out, expected, precision, depth)
    _assert_close_to(out, reference_out, case['dtype'], depth)
    if case.get('need_weights'):
        assert weights.shape == (QLEN, QLEN + MLEN, BATCH, HEADS)
        _assert_close_to(weights, expected_weights, precision, depth)
        _assert_close_to(weights, reference_weights, case['dtype'], depth)
    else:
        assert weights is None
    if not case['grad']:
        return
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    reference_grads = torch.autograd.grad(reference_out, leaves, grad_out)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out.double())
    for grad, reference_grad, expected_grad in zip(grads, reference_grads, expected_grads):
        _assert_close_to(grad, expected_grad, precision, gradient_depth)
        _assert_close_to(grad, reference_grad, case['dtype'], gradient_depth)


def test_sdpa_and_the_reference_agree_in_bfloat16():
    """bfloat16 inputs (without autocast): SDPA and the reference agree with the float64 computation to bfloat16
    rounding."""
    case = dict(CASES['sdpa-relative'], dtype=torch.bfloat16)
    q, k, values, terms, masked = _case_inputs(case)
    with torch.no_grad():
        out, _, choice = _run(case, q, k, values, terms, masked)
        reference_out, _, _ = _run(case, q, k, values, terms, masked, 'reference')
    assert choice.chosen == 'sdpa' and 'float32' in dict(choice.refused)['kernel']
    expected, _ = _naive(q, k, values, 0.4, masked, terms)
    # Rule 2 with bfloat16's epsilon (`tolerance.py`): the products accumulate in float32, and each step's output
    # rounds to bfloat16: the two biased queries, the content and the position products, the terms' two additions,
    # the scaling, the softmax and the weighted values (the longest path, the reference's: 9)
    bound = rounding_bound(torch.bfloat16, 9, max(1.0, expected.abs().max().item()))
    for result in (out, reference_out):
        assert result.dtype == torch.bfloat16
        assert (result.double() - expected).abs().max().item() <= bound


def test_attention_dropout_in_training_runs_the_composite_with_its_masks():
    """Attention dropout in training: the kernel and SDPA are refused, and the composite's weights are the softmax's
    with each weight dropped or scaled by 1 / (1 - p'), the output their product with the values."""
    q, k, values, terms, masked = _case_inputs(CASES['kernel'])
    dropout = Dropout(0.3).train()
    results = []
    with torch.no_grad():
        for need_weights in (False, True):
            # (the same seed: the same mask, whether the weights are asked for or not)
            torch.manual_seed(5)
            with dispatch.recording() as choices:
                results.append(dispatch.attend(Plan.now(q.device), q, k, values, scale=0.4, masked=masked,
                                               terms=terms, dropout=dropout, need_weights=need_weights))
            (choice,) = [c for c in choices if c.operation == 'attention']
            assert choice.chosen == 'composite'
            assert [c.chosen for c in choices if c.operation == 'dropout'] == ['kernel']
            if not need_weights:
                assert 'dropout' in dict(choice.refused)['kernel'] and 'dropout' in dict(choice.refused)['sdpa']
    (out, no_weights), (out_with_weights, weights) = results
    assert no_weights is None and torch.equal(out, out_with_weights)
    _, undropped = _naive(q, k, values, 0.4, masked, terms)
    dropped = (weights == 0) & (undropped != 0)
    assert 0 < dropped.sum() < (undropped != 0).sum()
    scale = 1 / (1 - round(0.3 * 2 ** 16) / 2 ** 16)
    kept = torch.where(dropped, 0.0, undropped * scale)
    # (the attention's depth and the dropout's scaling)
    depth = _depths(CASES['kernel'])[0] + 1
    _assert_close_to(weights, kept, torch.float32, depth)
    expected = torch.einsum('ijbn,bnjd->ibnd', kept, values.double()).reshape(QLEN, BATCH, HEADS * D)
    _assert_close_to(out, expected, torch.float32, depth)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64], ids=['kernel-masks', '16-bit-masks'])
@pytest.mark.parametrize('shape', [(2, 3, 5, 8, 4), (2, 3, 6, 10, 5), (1, 2, 7, 7, 3)], ids=str)
def test_attention_dropout_draws_the_same_masks_whichever_implementation_runs(shape, dtype):
    """The same seed, the same dropped weights and the same output, for `impl='auto'` (the composite) and
    `impl='reference'`, whatever the layout the reference's products come out in (which depends on the shapes)."""
    batch, heads, qlen, klen, d = shape
    q, k, values, table, u, v, b = _inputs(batch, heads, qlen, klen, d, klen, dtype)
    terms, masked = RelativeTerms(table, u, v, b), decoder_causal_mask(qlen, klen)
    dropout = Dropout(0.3).train()
    results = []
    with torch.no_grad():
        for impl in ('auto', 'reference'):
            torch.manual_seed(5)
            with dispatch.recording() as choices:
                results.append(dispatch.attend(Plan.now(q.device, impl), q, k, values, scale=0.4, masked=masked,
                                               terms=terms, dropout=dropout, need_weights=True))
            assert [c.chosen for c in choices if c.operation == 'attention'] == [
                'composite' if impl == 'auto' else 'reference']
    (out, weights), (reference_out, reference_weights) = results
    _, undropped = _naive(q, k, values, 0.4, masked, terms)
    dropped = (weights == 0) & (undropped != 0)
    assert dropped.any() and torch.equal(dropped, (reference_weights == 0) & (undropped != 0))
    # (the attention's depth and the dropout's scaling)
    _assert_close_to(out, reference_out, dtype, _depths(dict(terms='decoder'), d, qlen, klen, batch)[0] + 1)


def test_recording_collects_the_choices_made_inside_its_block():
    q, k, values, terms, masked = _case_inputs(CASES['kernel'])
    with torch.no_grad():
        plan = Plan.now(q.device)
        dispatch.attend(plan, q, k, values, scale=0.4, masked=masked, terms=terms)
        with dispatch.recording() as choices:
            for _ in range(2):
                dispatch.attend(plan, q, k, values, scale=0.4, masked=masked, terms=terms)
            dispatch.attend(plan, q, k, values, scale=0.4, masked=None, terms=terms)
        dispatch.attend(plan, q, k, values, scale=0.4, masked=masked, terms=terms)
    assert [c.chosen for c in choices] == ['kernel', 'kernel', 'sdpa']
    assert str(choices[0]) == 'attention: kernel'
    assert str(choices[2]).startswith("attention: sdpa; not kernel: the mask is not a decoder's")
    # The distinct choices, the most frequent first, with their counts
    lines = dispatch.summary(choices).splitlines()
    assert len(lines) == 2 and lines[0].split() == ['2', 'x', 'attention:', 'kernel']
    assert lines[1].split()[:4] == ['1', 'x', 'attention:', 'sdpa;']


def test_nested_recordings_each_collect_their_own_block():
    """An inner block collects what runs inside it; the outer one collects that and what runs after (each list is
    left by identity, though the two may hold equal choices)."""
    q, k, values, terms, masked = _case_inputs(CASES['kernel'])
    with torch.no_grad():
        plan = Plan.now(q.device)
        with dispatch.recording() as outer:
            with dispatch.recording() as inner:
                dispatch.attend(plan, q, k, values, scale=0.4, masked=masked, terms=terms)
            dispatch.attend(plan, q, k, values, scale=0.4, masked=masked, terms=terms)
    assert [c.chosen for c in inner] == ['kernel']
    assert [c.chosen for c in outer] == ['kernel', 'kernel']


def test_plan_takes_the_state_of_the_call():
    with torch.no_grad():
        plan = Plan.now(torch.device('cpu'))
    assert (plan.impl, plan.device_type, plan.grad, plan.autocast, plan.compiling) == ('auto', 'cpu', False, None,
                                                                                        False)
    assert plan.keeps_caches and plan.keeps_shapes
    with torch.autocast('cpu', dtype=torch.bfloat16):
        plan = Plan.now(torch.device('cpu'), 'reference')
    assert plan.impl == 'reference' and plan.grad and plan.autocast == torch.bfloat16
    assert not plan.keeps_caches and not plan.keeps_shapes
    # The reference keeps nothing across calls, as the original, with or without gradients
    with torch.no_grad():
        plan = Plan.now(torch.device('cpu'), 'reference')
    assert not plan.keeps_caches and not plan.keeps_shapes
    compiling = Plan('auto', 'cpu', grad=False, autocast=None, compiling=True)
    assert not compiling.keeps_caches and not compiling.keeps_shapes


def test_impl_is_checked_with_a_message_naming_what_is_accepted():
    with pytest.raises(ValueError, match=r"impl='fast' is not accepted: 'auto' .* or 'reference'"):
        Plan.now(torch.device('cpu'), 'fast')
    with pytest.raises(ValueError, match=r"impl='fast' is not accepted: 'auto' .* or 'reference'"):
        MemTransformerLM(**small_config(), impl='fast')
    with pytest.raises(ValueError, match=r"impl='fast' is not accepted: 'auto' .* or 'reference'"):
        MultiHeadAttention(2, 8, impl='fast', positions=Relative())
    model = MemTransformerLM(**small_config())
    assert model.impl == 'auto'
    model.impl = 'reference'
    assert model.impl == 'reference'
    with pytest.raises(ValueError, match=r"impl=True is not accepted: 'auto' .* or 'reference'"):
        model.impl = True


# Positions of the segment (batch 3) and what `impl='auto'` multiplies its rows by: 15 rows by the few-rows kernel
# (the layers of types 0 and 1 in the fused decoder layer, the others' and the softmax's by `dispatch.linear`), 21 by
# oneDNN's packed product
SEGMENTS = [(5, 'few rows'), (7, 'prepacked')]


@pytest.mark.parametrize('attn_type', [0, 1, 2])
@pytest.mark.parametrize('qlen, product', SEGMENTS)
def test_the_models_impl_chooses_the_reference_everywhere(attn_type, qlen, product):
    """`impl='reference'` runs the reference attention, `F.linear` and PyTorch's layer norm in every layer; the
    losses equal `impl='auto'`'s to float rounding."""
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(attn_type=attn_type)).eval()
    data = torch.randint(40, (qlen + 1, 3))
    losses, chosen = {}, {}
    for impl in ('auto', 'reference'):
        model.impl = impl
        with torch.no_grad(), dispatch.recording() as choices:
            losses[impl] = model(data[:-1], data[1:])[0]
        chosen[impl] = {(c.operation, c.chosen) for c in choices if c.operation != 'dropout'}
    assert chosen['reference'] == {('attention', 'reference'), ('linear', 'F.linear'),
                                   ('residual layer norm', 'PyTorch'), ('decoder layers', 'modules')}
    assert ('attention', 'reference') not in chosen['auto'] and ('linear', product) in chosen['auto']
    fused = product == 'few rows' and attn_type in (0, 1)
    assert ('decoder layers', 'fused' if fused else 'modules') in chosen['auto']
    # (two float32 paths; no memory: qlen keys)
    assert_close_rounding(losses['auto'], losses['reference'], depth=xl_depths(small_config(), qlen)[1])



class _DistancePenalisedXLAttention(XLAttention):
    r"""Transformer-XL's relative attention with one more term through the score hook: $- m\,|i - j|$."""
    slope = 0.0

    def get_scores(self, query, key, terms):
        scores = super().get_scores(query, key, terms)
        qlen, klen = query.shape[0], key.shape[0]
        i = torch.arange(klen - qlen, klen)[:, None]
        distance = (i - torch.arange(klen)[None, :]).abs().to(scores.dtype)
        return scores - self.slope * distance[:, :, None, None]


def _with_penalised_attention(model: MemTransformerLM, slope: float) -> MemTransformerLM:
    for layer in model.layers:
        layer.dec_attn.__class__ = _DistancePenalisedXLAttention
        layer.dec_attn.slope = slope
    return model


def test_the_xl_attentions_have_the_score_hook_too():
    """An override of `get_scores` in a Transformer-XL attention runs by the reference path, with memories: the same
    numbers as the variant itself when it adds nothing, other numbers (in the direction of its term) when it does."""
    torch.manual_seed(0)
    plain = MemTransformerLM(**small_config()).double().eval()
    hooked = MemTransformerLM(**small_config()).double().eval()
    hooked.load_state_dict(plain.state_dict())
    _with_penalised_attention(hooked, 0.0)
    data = torch.randint(40, (5, 2))
    with torch.no_grad(), dispatch.recording() as choices:
        (expected, *mems), (got, *hooked_mems) = plain(data, data), hooked(data, data)
        assert_same_function(hooked(data, data, *hooked_mems)[0], plain(data, data, *mems)[0])
    assert_same_function(got, expected)
    attention = [c for c in choices if c.operation == 'attention']
    # Each call of the hooked layers (2 layers, 2 segments) by the reference, saying why; the plain ones not
    hooked_choices = [c for c in attention if c.chosen == 'reference']
    assert len(hooked_choices) == 4
    assert all('overridden get_scores' in reason for c in hooked_choices for _, reason in c.refused)
    # With a penalty on distance the hook changes the numbers: the override is what runs
    _with_penalised_attention(hooked, 5.0)
    with torch.no_grad():
        assert not torch.allclose(hooked(data, data)[0], expected)
