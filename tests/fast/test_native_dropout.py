"""
The dropout kernel (`labml_txl/fast/native/dropout.py`): its generator against SplitMix64's published outputs, its masks
against the same generator written in PyTorch, the same mask for any number of threads and in the backward pass,
and the PyTorch path where it does not serve. (`tests/fast/test_dropout.py` checks the masks' distribution, scaling and
gradient through `Dropout`, which runs the kernel on float32 CPU tensors.)
"""
import pytest
import torch

from labml_txl.fast import dispatch, native
from labml_txl.fast.dropout import Dropout, relu_dropout_
from labml_txl.fast.native import dropout as native_dropout

from tolerance import assert_close_rounding


def test_reference_generator_is_splitmix64():
    """The first five outputs of SplitMix64 seeded with 1234567, as published with its reference implementation,
    are the 16-bit draws of elements 0 .. 19 reassembled four at a time."""
    expected = [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
                16408922859458223821]
    draws = native_dropout.reference_draws(20, 1234567).tolist()
    assert [sum(draws[4 * c + k] << (16 * k) for k in range(4)) for c in range(5)] == expected


@pytest.mark.parametrize('numel', [1, 3, 4, 5, 255, 256, 257, 16383, 16385, 100_003])
def test_kernel_masks_equal_the_generator_written_in_pytorch(numel):
    """Sizes that end inside a 64-bit number, a block of 256 elements and a thread's run of blocks."""
    x = torch.randn(numel)
    seed, threshold, scale = 0x1234_5678_9ABC_DEF, 6554, 1.1
    expected = torch.where(native_dropout.reference_draws(numel, seed) < threshold, 0.0, x * scale)
    assert torch.equal(native_dropout.dropout(x, seed, threshold, scale), expected)
    h = x.clone()
    native_dropout.relu_dropout_(h, seed, threshold, scale)
    assert torch.equal(h, torch.where(expected == 0, 0.0, expected.clamp(min=0)))


def test_relu_dropout_keeps_a_nan_as_relu_does():
    """A diverging model shows NaN: where the mask keeps it, a NaN stays NaN (ReLU's `max` passes it on)."""
    x = torch.tensor([float('nan'), -1.0, 2.0, 0.5] * 64)
    kept = native_dropout.reference_draws(x.numel(), 7) >= 30000
    expected = torch.where(kept, torch.relu(x) * 1.5, 0.0)
    # (one multiplication, correctly rounded in both: the same numbers)
    torch.testing.assert_close(native_dropout.relu_dropout_(x.clone(), 7, 30000, 1.5), expected, rtol=0, atol=0,
                               equal_nan=True)
    assert expected.isnan().any()


def test_the_mask_does_not_depend_on_the_number_of_threads():
    x = torch.randn(1 << 20)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_dropout.dropout(x, 42, 30000, 2.0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(native_dropout.dropout(x, 42, 30000, 2.0), one)


def test_dropout_draws_its_mask_by_the_kernel_and_again_in_the_backward_pass(count_calls):
    calls = count_calls(native_dropout, ['dropout', 'relu_dropout_', 'relu_dropout_backward'])
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(0)
    with dispatch.recording() as choices:
        out = Dropout(0.3).train()(x)
    assert [c.chosen for c in choices] == ['kernel']
    grad = torch.randn_like(x)
    out.backward(grad)
    # Forward and backward (the kernel again, from the seed: no mask kept): the gradient passes exactly where the
    # output kept the input, scaled alike: by the scale 1 / (1 - p') in float32, p' = round(0.3 * 2^16) / 2^16,
    # which the output shows to its rounding (the product's and the quotient's that recovers it: rule 2's depth 2)
    assert calls == {'dropout': 2}
    kept = out != 0
    scale = torch.tensor(1 / (1 - round(0.3 * 2 ** 16) / 2 ** 16), dtype=torch.float32)
    assert_close_rounding(out[kept] / x.detach()[kept], scale.expand(int(kept.sum())), depth=2)
    torch.testing.assert_close(x.grad, torch.where(kept, grad * scale, 0.0), rtol=0, atol=0)
    # The fused ReLU and dropout, and its backward from the output
    h = torch.randn(64, 33, requires_grad=True)
    relu_dropout_(h * 1.0, Dropout(0.3).train()).sum().backward()
    assert calls == {'dropout': 2, 'relu_dropout_': 1, 'relu_dropout_backward': 1}


def test_where_the_kernel_does_not_serve_pytorch_draws_the_mask(count_calls):
    """float64, a `native.disabled()` block: PyTorch's 16-bit integers (another mask from the same seed)."""
    calls = count_calls(native_dropout, ['dropout'])
    x = torch.ones(4096)
    drop = Dropout(0.5).train()
    torch.manual_seed(1)
    with dispatch.recording() as choices:
        by_kernel = drop(x)
        with native.disabled():
            torch.manual_seed(1)
            by_pytorch = drop(x)
    assert calls == {'dropout': 1}
    with dispatch.recording() as float64_choices:
        assert drop(x.double()).dtype == torch.float64 and calls == {'dropout': 1}
    by_kernel_choice, disabled_choice, float64_choice = choices + float64_choices
    assert by_kernel_choice == dispatch.Choice('dropout', 'kernel')
    assert disabled_choice.chosen == '16-bit' and 'disabled' in dict(disabled_choice.refused)['kernel']
    assert float64_choice.chosen == '16-bit' and 'float32' in dict(float64_choice.refused)['kernel']
    assert not torch.equal(by_kernel, by_pytorch)
    # Both drop about half
    for out in (by_kernel, by_pytorch):
        assert 0.45 < (out == 0).double().mean() < 0.55


def test_kernel_refuses_other_tensors_with_a_message():
    module = native.load_kernel('dropout')
    with pytest.raises(RuntimeError, match='contiguous float32 CPU tensor'):
        module.dropout(torch.randn(4, 4).double(), 1, 100, 1.0)
    with pytest.raises(RuntimeError, match='contiguous float32 CPU tensor'):
        module.dropout(torch.randn(4, 4).t(), 1, 100, 1.0)
    with pytest.raises(RuntimeError, match='threshold must be in 1 .. 65535'):
        module.dropout(torch.randn(4), 1, 0, 1.0)


def test_second_derivatives_through_masks_drawn_by_the_kernel():
    """With `create_graph` the backward pass stays differentiable in the incoming gradient: d/dv of the gradient
    `v * m / (1 - p')` is the scaled mask itself, for dropout and for the fused ReLU and dropout."""
    x = torch.randn(64, 33, requires_grad=True)
    v = torch.randn(64, 33, requires_grad=True)
    for step in (lambda h: Dropout(0.3).train()(h), lambda h: relu_dropout_(h * 1.0, Dropout(0.3).train())):
        torch.manual_seed(2)
        out = step(x)
        (grad_x,) = torch.autograd.grad(out, x, v, create_graph=True)
        (grad_v,) = torch.autograd.grad(grad_x.sum(), v)
        # The scaled mask where the output kept a positive or nonzero input, else 0
        passed = (out != 0).detach()
        scale = (out[passed] / x[passed]).detach()
        # (the scale that the output shows, to its rounding: the product's and the quotient's, rule 2's depth 2)
        assert_close_rounding(grad_v[passed], scale, depth=2)
        assert 0 < passed.sum() < passed.numel() and not grad_v[~passed].any()
