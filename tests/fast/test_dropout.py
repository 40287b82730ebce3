"""
`labml_txl.fast.dropout.Dropout`: a Bernoulli(1 - p') mask from 16-bit integers, scaled by 1 / (1 - p'), checked against
the binomial distribution, the scaling and gradient it must have, and `nn.Dropout` where it stands in for it.
"""
import contextlib
import math

import pytest
import torch
from torch import nn

from labml_txl.fast import dispatch, native
from labml_txl.fast.dropout import Dropout, relu_dropout_
from labml_txl.transformer.feed_forward import FeedForward
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.transformer.models import TransformerLayer
from labml_txl.xl import MemTransformerLM

from tolerance import assert_close_rounding
from xl.helpers import plain_and_fast, small_config


def _dropout_paths(choices):
    """The mask drawer each recorded dropout chose."""
    return [c.chosen for c in choices if c.operation == 'dropout']


@pytest.mark.parametrize('p', [0.1, 0.5, 0.9])
def test_keeps_each_element_with_probability_one_minus_p(p):
    torch.manual_seed(0)
    n = 1 << 22
    out = Dropout(p).train()(torch.ones(n))
    kept = (out != 0).double().mean().item()
    # Six standard deviations of a binomial fraction (statistical, not rounding)
    assert abs(kept - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize('offset', [1, 2, 3, 4])
def test_neighbouring_elements_are_dropped_independently(offset):
    """Elements `offset` apart: the 16-bit pieces of one 64-bit draw (1 to 3) and of two draws (4)."""
    torch.manual_seed(1)
    p, n = 0.3, 1 << 22
    dropped = Dropout(p).train()(torch.ones(n)) == 0
    both = (dropped[:-offset] & dropped[offset:]).double().mean().item()
    # (statistical: six standard deviations)
    assert abs(both - p * p) < 6 * math.sqrt(p * p * (1 - p * p) / (n - offset))


def test_kept_values_are_scaled_and_the_gradient_is_the_mask():
    """What is kept is scaled by 1 / (1 - p'), p' = round(p 2^16) / 2^16 the probability the mask drops with: the
    expectation is unchanged exactly (for p = 0.1, 1 / (1 - p) would be 6.8e-6 too small, about 60 float32 ulps)."""
    torch.manual_seed(2)
    p = 0.1
    scale = torch.tensor(1 / (1 - 6554 / 2 ** 16))
    assert (scale - torch.tensor(1 / (1 - p))).abs() > 50 * torch.finfo(torch.float32).eps
    x = torch.randn(64, 33, requires_grad=True)
    out = Dropout(p).train()(x)
    kept = out != 0
    assert 0 < kept.sum() < x.numel()
    torch.testing.assert_close(out[kept], x.detach()[kept] * scale, rtol=0, atol=0)
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))
    grad = torch.randn_like(x)
    out.backward(grad)
    torch.testing.assert_close(x.grad, grad * kept * scale, rtol=0, atol=0)


def test_masks_follow_the_seed():
    x = torch.ones(1000)
    drop = Dropout(0.5).train()
    torch.manual_seed(3)
    first, second = drop(x), drop(x)
    torch.manual_seed(3)
    assert torch.equal(drop(x), first) and torch.equal(drop(x), second)
    assert not torch.equal(first, second)


def test_is_nn_dropout_where_it_does_not_draw_its_own_mask():
    x = torch.randn(50, 20)
    ours = Dropout(0.3)
    # Evaluation: the input itself
    with dispatch.recording() as choices:
        assert ours.eval()(x) is x
    (choice,) = choices
    assert choice.chosen == 'nn.Dropout' and 'not training' in dict(choice.refused)['kernel']
    # p = 1 drops everything
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    # p within 2^-17 of 0 or 1, where 16 bits cannot tell it from 0 or 1: `nn.Dropout`'s mask, the same for the seed
    for p in (1e-6, 1 - 1e-6):
        torch.manual_seed(6)
        expected = nn.Dropout(p).train()(x)
        torch.manual_seed(6)
        with dispatch.recording() as choices:
            assert torch.equal(Dropout(p).train()(x), expected)
        (choice,) = choices
        assert choice.chosen == 'nn.Dropout' and '2^-17' in dict(choice.refused)['16-bit']


def test_where_each_mask_is_drawn():
    """The kernel for float32 CPU tensors in training, PyTorch's 16-bit integers for other dtypes or with our kernels
    disabled (`dispatch.dropout_path`; it does not take `impl`, so a model draws the same masks whichever computes)."""
    drop = Dropout(0.3).train()
    with dispatch.recording() as choices:
        drop(torch.randn(8))
        drop(torch.randn(8, dtype=torch.float64))
        drop(torch.randn(8, dtype=torch.bfloat16))
        with native.disabled():
            drop(torch.randn(8))
    assert _dropout_paths(choices) == ['kernel', '16-bit', '16-bit', '16-bit']
    assert choices[0].refused == ()
    assert all('float32' in dict(c.refused)['kernel'] for c in choices[1:3])
    assert 'disabled' in dict(choices[3].refused)['kernel']


# Where the mask is drawn: the kernel (float32), PyTorch's 16-bit integers (bfloat16, or float32 with our kernels
# disabled), `nn.Dropout` (p within 2^-17 of 0: the fused step is then ReLU in place and the module)
RELU_DROPOUT_CASES = {'kernel': ('kernel', torch.float32, 0.1, False), '16-bit': ('16-bit', torch.bfloat16, 0.1, False),
                      '16-bit-disabled': ('16-bit', torch.float32, 0.1, True),
                      'nn.Dropout': ('nn.Dropout', torch.float32, 1e-6, False)}


@pytest.mark.parametrize('path, dtype, p, disabled', RELU_DROPOUT_CASES.values(), ids=RELU_DROPOUT_CASES.keys())
def test_relu_dropout_in_place_equals_relu_then_dropout(path, dtype, p, disabled):
    """The fused feed-forward step gives the same output and gradient as its two modules, from the same seed."""
    dropout = Dropout(p).train()
    x = torch.randn(37, 3, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(16, 16, dtype=dtype)
    grad = torch.randn(37, 3, 16, dtype=dtype)
    results, paths = [], []
    for step in (lambda h: relu_dropout_(h, dropout), lambda h: dropout(torch.relu(h))):
        torch.manual_seed(5)
        with native.disabled() if disabled else contextlib.nullcontext(), dispatch.recording() as choices:
            out = step(x @ weight)
        (x_grad,) = torch.autograd.grad(out, x, grad)
        results.append((out, x_grad))
        paths += _dropout_paths(choices)
    (fused, fused_grad), (modules, modules_grad) = results
    assert set(paths) == {path}
    assert ('ReLUDropoutInPlace' in type(fused.grad_fn).__name__) == (path != 'nn.Dropout')
    assert torch.equal(fused, modules) and torch.equal(fused_grad, modules_grad)
    assert 0 < (fused == 0).double().mean() < 1


def test_refuses_a_probability_outside_zero_to_one():
    with pytest.raises(ValueError, match='between 0 and 1'):
        Dropout(1.5)


def test_every_dropout_of_the_model_is_ours():
    model = MemTransformerLM(**small_config(dropout=0.1, dropatt=0.1))
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    # Every dropout of the model is ours: embedding, attention output, attention weights, feed-forward
    assert len(dropouts) == 1 + model.n_layer * 4 and all(isinstance(m, Dropout) for m in dropouts)
    data = torch.randint(40, (6, 3))
    with dispatch.recording() as choices:
        model(data[:5], data[1:])
    assert set(_dropout_paths(choices)) == {'kernel'}


@pytest.mark.parametrize('attn_type', [0, 1, 2])
def test_the_model_draws_the_same_masks_whichever_impl_computes(attn_type):
    """Training with dropout and attention dropout: from the same seed `impl='auto'` and `impl='reference'` drop the
    same elements, so their losses and gradients agree to float rounding."""
    plain, fast = plain_and_fast(dropout=0.1, dropatt=0.1, attn_type=attn_type)
    data = torch.randint(40, (6, 3))
    losses, paths = [], []
    for model in (plain, fast):
        torch.manual_seed(3)
        with dispatch.recording() as choices:
            loss = model(data[:5], data[1:])[0]
        loss.mean().backward()
        losses.append(loss)
        paths.append(_dropout_paths(choices))
    assert paths[0] == paths[1] and set(paths[0]) == {'kernel'}
    # Rule 2, float32 both, counted as `test_fast_paths._xl_depth` counts (2 layers of small_config, one segment of
    # 5 without memory: klen 5, batch 3). Forward: the table's angles (4 roundings of the angle's size, up to 5) and
    # sines, the embedding's scale; a layer: the projection to q, k, v (16), a score (8, and its sum 1), the
    # softmax and weighted sum (5 each), the output projection (16), a layer norm (2 x 16), the feed-forward (16,
    # 32), a layer norm (2 x 16), the 4 dropouts' scalings; the output projection (16) and log-softmax (40)
    layer = 16 + 8 + 1 + 2 * 5 + 16 + 2 * 16 + 16 + 32 + 2 * 16 + 4
    forward = 4 * 5 + 2 + 2 * layer + 16 + 40
    # Back: the log-softmax and output projection (40 each); a layer's reductions transposed (4 x 16 for its norms,
    # 16 + 32 the feed-forward, 16 the output projection, 8 + 5 + 5 the attention, 3 x 16 the projections); then
    # the parameter's own sum: over every score (3 x 5 x 5) for u and v, else the rows (3 x 5) and the table's 5
    backward = 2 * 40 + 2 * (4 * 16 + 16 + 32 + 16 + 8 + 5 + 5 + 3 * 16)
    assert_close_rounding(losses[1], losses[0], depth=forward)
    for (name, a), b in zip(fast.named_parameters(), plain.parameters()):
        own = 3 * 5 * 5 if name.endswith(('r_w_bias', 'r_r_bias')) else 3 * 5 + 5
        assert_close_rounding(a.grad, b.grad, depth=forward + backward + own, msg=name)
    # (another seed drops other elements: the agreement is not that of models that drop nothing; 1e-3 lies well
    # above the rounding bound of the losses above, ~2e-4)
    torch.manual_seed(4)
    assert not torch.allclose(fast(data[:5], data[1:])[0], losses[1], rtol=1e-3, atol=1e-3)


def test_the_vanilla_parts_draw_the_cheaper_masks_too():
    layer = TransformerLayer(d_model=16, self_attn=MultiHeadAttention(2, 16, dropout_prob=0.1),
                             src_attn=None, feed_forward=FeedForward(16, 32, dropout=0.1), dropout_prob=0.1)
    dropouts = [m for m in layer.modules() if isinstance(m, nn.Dropout)]
    assert len(dropouts) == 3 and all(isinstance(m, Dropout) for m in dropouts)
    with dispatch.recording() as choices:
        layer(x=torch.randn(5, 2, 16))
    # The attention weights', the feed-forward's and the residuals' masks, all drawn by the kernel
    assert len(_dropout_paths(choices)) >= 3 and set(_dropout_paths(choices)) == {'kernel'}
