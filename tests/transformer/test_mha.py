"""MultiHeadAttention: the paths the dispatcher runs it by (SDPA, the composite, the reference) against each other and
against a per-head loop."""
import math

import pytest
import torch

from labml_txl.fast import dispatch
from labml_txl.attention.masks import subsequent_mask
from labml_txl.positions.rotary import Rotary
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.xl.attention import XLAttention

from tolerance import assert_close_rounding, assert_same_function


def _attention_choices(choices):
    return [c for c in choices if c.operation == 'attention']


def _attention_paths(choices):
    return [c.chosen for c in _attention_choices(choices)]


def naive_attention(mha: MultiHeadAttention, query, key, value, mask):
    """Each batch element and head on its own, softmax over allowed keys only."""
    seq_q, batch, d_model = query.shape
    out = torch.zeros(seq_q, batch, d_model, dtype=query.dtype)
    for b in range(batch):
        q = mha.query(query[:, b])
        k = mha.key(key[:, b])
        v = mha.value(value[:, b])
        heads = []
        for h in range(mha.heads):
            cols = slice(h * mha.d_k, (h + 1) * mha.d_k)
            scores = q[:, cols] @ k[:, cols].T / math.sqrt(mha.d_k)
            if mask is not None:
                allowed = mask[:, :, min(b, mask.shape[2] - 1)].expand(seq_q, -1)
                scores = scores.masked_fill(~allowed, float('-inf'))
            heads.append(torch.softmax(scores, dim=-1) @ v[:, cols])
        out[:, b] = mha.output(torch.cat(heads, dim=-1))
    return out


def padding_and_causal_mask(seq_len, lengths):
    """Causal, and keys past each sequence's length masked: `[seq, seq, batch]`."""
    keys_present = torch.arange(seq_len)[:, None] < torch.tensor(lengths)[None, :]
    return subsequent_mask(seq_len) & keys_present[None, :, :]


@pytest.mark.parametrize('mask_kind', ['none', 'causal', 'padding'])
def test_every_path_matches_a_naive_loop(mask_kind):
    """SDPA (no weights asked for), the composite (the weights asked for) and the reference (`impl='reference'`),
    in float64, where each of them serves as in float32."""
    mha = MultiHeadAttention(4, 32, dropout_prob=0.0).double().eval()
    x = torch.randn(7, 3, 32, dtype=torch.float64)
    mask = {'none': None, 'causal': subsequent_mask(7), 'padding': padding_and_causal_mask(7, [7, 5, 2])}[mask_kind]
    expected = naive_attention(mha, x, x, x, mask)
    with dispatch.recording() as choices:
        fused = mha(query=x, key=x, value=x, mask=mask)
        explicit, weights = mha(query=x, key=x, value=x, mask=mask, need_weights=True)
    assert _attention_paths(choices) == ['sdpa', 'composite']
    assert 'need_weights' in dict(_attention_choices(choices)[-1].refused)['sdpa']
    mha.impl = 'reference'
    with dispatch.recording() as choices:
        reference, reference_weights = mha(query=x, key=x, value=x, mask=mask, need_weights=True)
    assert _attention_paths(choices) == ['reference']
    # Rule 1: float64 throughout
    assert_same_function(fused, expected)
    assert_same_function(explicit, expected)
    assert_same_function(reference, expected)
    assert_same_function(fused, explicit)
    assert_same_function(weights, reference_weights)
    # Weights `[seq_q, seq_k, batch, heads]` are distributions over the keys, zero where masked
    assert weights.shape == (7, 7, 3, 4)
    assert_same_function(weights.sum(dim=1), torch.ones(7, 3, 4, dtype=torch.float64))
    if mask is not None:
        assert (weights[~mask.expand(7, 7, 3)] == 0).all()


def test_cross_attention_with_key_padding_broadcast_over_queries():
    mha = MultiHeadAttention(2, 8, dropout_prob=0.0).double().eval()
    query, memory = torch.randn(3, 2, 8, dtype=torch.float64), torch.randn(5, 2, 8, dtype=torch.float64)
    mask = (torch.arange(5)[:, None] < torch.tensor([5, 3])[None, :]).unsqueeze(0)  # [1, seq_k, batch]
    # Rule 1: float64 both
    assert_same_function(mha(query=query, key=memory, value=memory, mask=mask),
                         naive_attention(mha, query, memory, memory, mask))


def test_d_model_not_divisible_by_heads_names_both_and_the_accepted_heads():
    with pytest.raises(ValueError, match=r"d_model=30 is not divisible by heads=4.*\[1, 2, 3, 5, 6, 10, 15, 30\]"):
        MultiHeadAttention(4, 30)


@pytest.mark.parametrize('shape', [(5, 5, 2), (5, 4, 1), (5, 5)])
def test_mask_of_the_wrong_shape_is_rejected_with_the_expected_shape(shape):
    mha = MultiHeadAttention(2, 8)
    x = torch.randn(5, 3, 8)
    with pytest.raises(ValueError, match=r"mask of shape .* is not accepted: expected .*\[5 or 1, 5, 3 or 1\]"):
        mha(query=x, key=x, value=x, mask=torch.ones(shape, dtype=torch.bool))


def test_mask_of_the_wrong_dtype_is_rejected():
    mha = MultiHeadAttention(2, 8)
    x = torch.randn(5, 3, 8)
    with pytest.raises(TypeError, match='must be torch.bool'):
        mha(query=x, key=x, value=x, mask=torch.ones(5, 5, 1))


@pytest.mark.parametrize('impl', ['auto', 'reference'])
def test_a_fully_masked_row_attends_to_nothing_on_every_path(impl):
    """A query with no key it may attend to gets all-zero weights (not NaN) with `need_weights=True`: its output is
    the output projection's bias alone, with the weights and without (where SDPA, which would give NaN there, is
    refused for it)."""
    torch.manual_seed(0)
    # (in float64, where the same implementations serve as in float32: rule 1 below)
    mha = MultiHeadAttention(heads=2, d_model=8, dropout_prob=0.0, impl=impl).double().eval()
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    mask = subsequent_mask(4).expand(4, 4, 3).clone()
    mask[2, :, 1] = False
    with dispatch.recording() as choices:
        out, weights = mha(query=x, key=x, value=x, mask=mask, need_weights=True)
        fused = mha(query=x, key=x, value=x, mask=mask)
    if impl == 'auto':
        assert _attention_paths(choices) == ['composite', 'composite']
        assert 'every key masked' in dict(_attention_choices(choices)[-1].refused)['sdpa']
    else:
        assert _attention_paths(choices) == ['reference', 'reference']
    assert not torch.isnan(weights).any() and not torch.isnan(out).any()
    assert torch.equal(weights[2, :, 1], torch.zeros(4, 2, dtype=torch.float64))
    assert_same_function(out[2, 1], mha.output.bias.detach())
    assert_same_function(out, fused)
    # every other row is still a distribution over its allowed keys
    sums = weights.sum(dim=1)
    sums[2, 1] = 1
    assert_same_function(sums, torch.ones(4, 3, 2, dtype=torch.float64))


@pytest.mark.parametrize('argument, value', [('dropout_prob', 1.5), ('dropout_prob', -0.1), ('bias', 'False')])
def test_constructor_arguments_are_checked(argument, value):
    error = TypeError if argument == 'bias' else ValueError
    with pytest.raises(error, match=rf"{argument}={value!r} is not accepted"):
        MultiHeadAttention(heads=2, d_model=8, **{argument: value})


def test_impl_is_checked_with_a_message():
    with pytest.raises(ValueError, match=r"impl='fast' is not accepted: 'auto' .* or 'reference'"):
        MultiHeadAttention(heads=2, d_model=8, impl='fast')


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_attention_dropout_in_training_draws_the_same_masks_on_both_paths(dtype):
    """Training with attention dropout: the composite (SDPA would draw masks of its own) and the reference drop the
    same weights from the same seed. In float32 (the masks drawn by our dropout kernel) and in float64 (by PyTorch's
    16-bit integers), which compares the functions to rule 1."""
    torch.manual_seed(1)
    x = torch.randn(6, 2, 16).to(dtype)
    outputs = []
    for impl in ('auto', 'reference'):
        torch.manual_seed(2)
        mha = MultiHeadAttention(heads=4, d_model=16, dropout_prob=0.3, impl=impl).to(dtype).train()
        torch.manual_seed(3)
        with dispatch.recording() as choices:
            outputs.append(mha(query=x, key=x, value=x, mask=subsequent_mask(6)))
        assert _attention_paths(choices) == ['composite' if impl == 'auto' else 'reference']
    if dtype == torch.float64:
        assert_same_function(outputs[0], outputs[1])
    else:
        # Rule 2: the projections over d_model 16, q.k over d_k 4, the softmax and the weighted sum over 6 keys,
        # the output projection over 16
        assert_close_rounding(outputs[0], outputs[1], depth=16 + 4 + 6 + 6 + 16)
    # (the dropout changes the output: another seed gives another one, by far more than 1e-3, itself far above the
    # rounding bound above, ~1e-5)
    torch.manual_seed(4)
    assert not torch.allclose(mha(query=x, key=x, value=x, mask=subsequent_mask(6)), outputs[1], atol=1e-3)


@pytest.mark.parametrize('build', [
    lambda positions: MultiHeadAttention(2, 8, positions=positions),
    lambda positions: XLAttention(2, 8, 4, 0.0, positions=positions),
], ids=['MultiHeadAttention', 'XLAttention'])
def test_a_scheme_class_instead_of_an_object_is_refused_naming_what_is_accepted(build):
    # (the mistake is the class, `positions=Rotary`: a scheme is built per attention)
    with pytest.raises(TypeError, match=r"positions=<class .*Rotary'> is not accepted: a PositionScheme object"):
        build(Rotary)
    assert isinstance(build(Rotary()).positions, Rotary)
