r"""
Linear layers for a few rows (`labml_txl/fast/native/few_rows_linear.py`) against the product computed in float64,
where the dispatcher (`dispatch.linear`) runs them, and against `F.linear` where it does not, with its reasons.
"""
import contextlib

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from labml_txl.fast import native
from labml_txl.fast.native import few_rows_linear as module_under_test

from dispatch_helpers import dispatched_linear
from tolerance import assert_close_rounding, rounding_bound


@pytest.fixture
def kernel_calls(count_kernel_calls):
    """The rows of each of the kernel's calls."""
    return count_kernel_calls(module_under_test, 'few_rows_linear', lambda x, *rest: x.shape[0])


def _weights(out_features, in_features, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (nn.Parameter(torch.randn(out_features, in_features, generator=generator)),
            torch.randn(out_features, generator=generator))


def _exact(x, weight, bias, relu):
    """$x W^\\top + b$ (and its ReLU) in float64."""
    y = x.double() @ weight.double().t() + (0 if bias is None else bias.double())
    return torch.relu(y) if relu else y


def _assert_the_product(y, x, weight, bias=None):
    """`y` (float32) within float32's rounding of the exact product (rule 2, `tolerance.py`): a sum of in_features
    products, and the bias's addition; the terms' size the largest |x| |W|^T + |b|."""
    assert_close_rounding(y, _exact(x, weight, bias, False), depth=weight.shape[1] + (bias is not None),
                          magnitude=_magnitude(x, weight, bias))


def _magnitude(x, weight, bias):
    """The largest sum of the absolute terms of an output: |x| |W|^T + |b|."""
    return _exact(x.abs(), weight.abs(), None if bias is None else bias.abs(), False).max().item()


# (rows' shape, out_features, in_features): a one-token step at the benchmark's sizes; tails of output features
# beyond the blocks of four and of inputs beyond a vector's width; a 3-d step of batch 5; the most rows; a single
# input feature; a single row given as a vector
SHAPES = [((1, 256), 768, 256), ((1, 1024), 256, 1024), ((3, 37), 10, 37), ((1, 5, 33), 7, 33),
          ((16, 64), 130, 64), ((2, 1), 5, 1), ((4,), 3, 4)]


@pytest.mark.parametrize('relu', [False, True])
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('rows, out_features, in_features', SHAPES, ids=str)
def test_kernel_equals_the_exact_product(kernel_calls, rows, out_features, in_features, with_bias, relu):
    weight, bias = _weights(out_features, in_features)
    bias = bias if with_bias else None
    x = torch.randn(*rows, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, choice = dispatched_linear(x, weight, bias, relu)
        expected = _exact(x, weight, bias, relu)
        f_linear = F.linear(x, weight, bias)
    assert choice.chosen == 'few rows', choice
    assert kernel_calls == [x.numel() // in_features]
    assert y.shape == x.shape[:-1] + (out_features,) and y.dtype == torch.float32
    if relu:
        assert (y == 0).any() and (y > 0).any()
    # As close to the exact product as F.linear's float32 sums are (within twice their largest error); and since
    # F.linear's may happen to be exact where the kernel's are not, beyond that the roundings of one product and the
    # bias's addition at the output's size (rule 2, `tolerance.py`: all there is with one input feature)
    f_linear_error = (_exact(x, weight, bias, relu) - (torch.relu(f_linear) if relu else f_linear)).abs().max()
    floor = rounding_bound(torch.float32, 1 + with_bias, max(1.0, expected.abs().max().item()))
    assert (y.double() - expected).abs().max() <= 2 * f_linear_error + floor


def test_rows_that_are_not_contiguous_are_read_as_they_are(kernel_calls):
    weight, bias = _weights(24, 16)
    x = torch.randn(16, 3).t()  # three rows, not contiguous
    with torch.no_grad():
        y, choice = dispatched_linear(x, weight, bias)
    assert choice.chosen == 'few rows' and kernel_calls == [3]
    _assert_the_product(y, x, weight, bias)


def test_a_weight_changed_in_place_is_read_as_it_is_now(kernel_calls):
    """The kernel keeps no copy of the weight: an optimizer step between two calls is seen by the second."""
    weight, bias = _weights(16, 8)
    x = torch.randn(1, 8)
    with torch.no_grad():
        first = dispatched_linear(x, weight, bias)[0]
        weight.mul_(2)
        bias.mul_(2)
        # (doubling is exact in floating point: the same kernel on the doubled weight gives exactly twice)
        assert torch.equal(dispatched_linear(x, weight, bias)[0], 2 * first)
    assert kernel_calls == [1, 1]


def test_more_rows_than_the_kernel_takes_go_to_the_libraries(kernel_calls):
    weight, bias = _weights(16, 8)
    x = torch.randn(module_under_test.MOST_ROWS + 1, 8)
    with torch.no_grad():
        y, choice = dispatched_linear(x, weight, bias)
    assert choice.chosen in ('prepacked', 'F.linear') and 'rows' in dict(choice.refused)['few rows'], choice
    assert kernel_calls == []
    _assert_the_product(y, x, weight, bias)


# Each case and a fragment of the reason the dispatcher gives for not running the kernel
REFUSALS = {'grad': 'gradients', 'float64': 'float32', 'autocast': 'autocast', 'reference': "impl='reference'",
            'disabled': 'disabled', 'weight-not-contiguous': 'contiguous'}


@pytest.mark.parametrize('case', REFUSALS)
def test_another_product_runs_where_the_kernel_does_not_serve(kernel_calls, case):
    weight, bias = _weights(16, 8)
    x = torch.randn(1, 8)
    if case == 'grad':
        y, choice = dispatched_linear(x, weight, bias)
        y.sum().backward()
        assert weight.grad is not None
        expected = F.linear(x, weight, bias)
    else:
        if case == 'float64':
            weight, bias, x = nn.Parameter(weight.detach().double()), bias.double(), x.double()
        if case == 'weight-not-contiguous':
            weight = torch.randn(8, 16).t()
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=case == 'autocast'), \
                native.disabled() if case == 'disabled' else contextlib.nullcontext():
            y, choice = dispatched_linear(x, weight, bias, impl='reference' if case == 'reference' else 'auto')
            expected = F.linear(x, weight, bias)
    assert choice.chosen == 'F.linear' and REFUSALS[case] in dict(choice.refused)['few rows'], choice
    assert torch.equal(y, expected)
    assert kernel_calls == []


def test_a_weight_made_per_call_is_served_too(kernel_calls):
    """The kernel reads the weight where it lies: a weight made per call (a slice of a joint weight, as the
    memory's $[W_k; W_v]$) costs no copy, unlike oneDNN's packing."""
    joint, _ = _weights(24, 8)
    x = torch.randn(2, 8)
    with torch.no_grad():
        y, choice = dispatched_linear(x, joint[8:])
    assert choice.chosen == 'few rows' and kernel_calls == [2]
    _assert_the_product(y, x, joint[8:])
