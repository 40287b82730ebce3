"""
`dispatch.linear` with oneDNN's prepacked weights (`prepacked_linear.py`) against `F.linear`: the same numbers up to
float rounding where the dispatcher runs them (more rows than the few-rows kernel takes,
`test_native_few_rows_linear.py`), exactly `F.linear` (with the reasons it gives) where they must not run, and a
weight changed in place is packed again.
"""
import gc

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from labml_txl.fast import native, prepacked_linear
from labml_txl.fast.native.few_rows_linear import MOST_ROWS

from dispatch_helpers import dispatched_linear
from tolerance import assert_close_rounding

# More rows than the few-rows kernel takes
ROWS = MOST_ROWS + 4

requires_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                     reason='this PyTorch is built without oneDNN')


@pytest.fixture(autouse=True)
def _checked():
    """The first use checks oneDNN's ops once (one call of each): done here, before any test counts calls."""
    prepacked_linear.available()


def _assert_the_product(y, x, weight, bias=None, relu=False):
    """`y` (float32) within float32's rounding of the product in float64 (rule 2, `tolerance.py`): a sum of
    in_features products and the bias's addition, of terms as large as the largest |x| |W|^T + |b|."""
    with torch.no_grad():
        x, weight, bias = x.double(), weight.double(), None if bias is None else bias.double()
        expected = F.linear(x, weight, bias)
        magnitude = F.linear(x.abs(), weight.abs(), None if bias is None else bias.abs()).max().item()
    assert_close_rounding(y, torch.relu(expected) if relu else expected, depth=weight.shape[1] + (bias is not None),
                          magnitude=magnitude)


def _parameter(*shape, dtype=torch.float32):
    """A weight as a model holds it (the dispatcher packs only parameters: a weight made per call is not worth it)."""
    return nn.Parameter(torch.randn(*shape, dtype=dtype))


@requires_onednn
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('shape', [(ROWS, 32), (5, ROWS, 32), (ROWS, 5, 32)], ids=['2d', '3d', '3d-transposed'])
def test_equals_f_linear_without_gradients(count_calls, shape, with_bias):
    weight, bias = _parameter(48, 32), torch.randn(48) if with_bias else None
    x = torch.randn(*shape)
    if shape == (ROWS, 5, 32):
        x = torch.randn(5, ROWS, 32).transpose(0, 1)  # not contiguous
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    with torch.no_grad():
        y, choice = dispatched_linear(x, weight, bias)
    assert choice.chosen == 'prepacked' and [name for name, _ in choice.refused] == ['few rows'], choice
    assert calls == {'_linear_pointwise': 1}
    assert y.shape == shape[:-1] + (48,)
    _assert_the_product(y, x, weight, bias)


@requires_onednn
def test_a_weight_changed_in_place_is_packed_again(count_calls):
    weight, x = _parameter(16, 8), torch.randn(ROWS, 8)
    calls = count_calls(torch.ops.mkldnn, ['_reorder_linear_weight'])
    with torch.no_grad():
        first, choice = dispatched_linear(x, weight)
        assert choice.chosen == 'prepacked'
        assert torch.equal(dispatched_linear(x, weight)[0], first)
        assert calls['_reorder_linear_weight'] == 1  # packed once for both calls
        weight.mul_(2)  # as an optimizer step does
        # (doubling is exact in floating point: the same product of the doubled weight gives exactly twice)
        assert torch.equal(dispatched_linear(x, weight)[0], 2 * first)
    assert calls['_reorder_linear_weight'] == 2


@requires_onednn
def test_a_packed_weight_goes_with_its_weight():
    weight = _parameter(16, 8)
    with torch.no_grad():
        assert dispatched_linear(torch.randn(ROWS, 8), weight)[1].chosen == 'prepacked'
    assert weight in prepacked_linear._kept
    gc.collect()  # entries of weights other tests left behind go first
    count = len(prepacked_linear._kept)
    del weight
    gc.collect()
    assert len(prepacked_linear._kept) == count - 1


# Each case and a fragment of the reason the dispatcher gives for not packing
REFUSALS = {'grad': 'gradients', 'float64': 'float32', 'autocast': 'autocast',
            'weight-made-per-call': 'made per call', 'reference': "impl='reference'"}


@pytest.mark.parametrize('case', REFUSALS)
def test_f_linear_runs_where_the_packed_weights_must_not(count_calls, case):
    weight, bias, x = _parameter(16, 8), torch.randn(16), torch.randn(ROWS, 8)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    if case == 'grad':
        y, choice = dispatched_linear(x, weight, bias)
        y.sum().backward()
        assert weight.grad is not None
        torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=0, atol=0)
    else:
        if case == 'float64':
            weight, bias, x = nn.Parameter(weight.detach().double()), bias.double(), x.double()
        if case == 'weight-made-per-call':
            weight = weight.detach() * 1.0
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=case == 'autocast'):
            y, choice = dispatched_linear(x, weight, bias, impl='reference' if case == 'reference' else 'auto')
            assert torch.equal(y, F.linear(x, weight, bias))
    assert choice.chosen == 'F.linear' and REFUSALS[case] in dict(choice.refused)['prepacked'], choice
    assert calls == {}


@requires_onednn
def test_one_row_is_not_packed_where_the_few_rows_kernel_is_off(count_calls):
    """oneDNN is slower than `F.linear` at a matrix-vector product: without our kernel, one row goes to
    `F.linear`."""
    weight, x = _parameter(48, 32), torch.randn(1, 32)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    with torch.no_grad(), native.disabled():
        y, choice = dispatched_linear(x, weight)
        assert torch.equal(y, F.linear(x, weight))
    assert choice.chosen == 'F.linear' and 'single row' in dict(choice.refused)['prepacked'], choice
    assert calls == {}


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64], ids=['onednn', 'f-linear'])
def test_relu_is_applied_by_the_product(count_calls, dtype):
    """`relu=True`: $\\max(0, x W^\\top + b)$, by oneDNN's product itself where it runs (one call, no other pass),
    by `F.linear` and an in-place ReLU where it does not."""
    weight, bias, x = _parameter(48, 32, dtype=dtype), torch.randn(48, dtype=dtype), torch.randn(ROWS, 32, dtype=dtype)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    with torch.no_grad():
        y, choice = dispatched_linear(x, weight, bias, relu=True)
        expected = torch.relu(F.linear(x, weight, bias))
    assert (y == 0).any() and (y > 0).any()
    if dtype == torch.float32 and torch.backends.mkldnn.is_available():
        assert choice.chosen == 'prepacked' and calls == {'_linear_pointwise': 1}
        _assert_the_product(y, x, weight, bias, relu=True)
    else:
        assert choice.chosen == 'F.linear' and calls == {} and torch.equal(y, expected)


@requires_onednn
def test_the_first_check_holds_under_the_callers_autocast(monkeypatch):
    """oneDNN's ops are checked once per process, in float32: a first caller under bf16 autocast (where a float32
    product would not match) does not turn them off for the rest of the process."""
    monkeypatch.setattr(prepacked_linear, '_available', None)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert prepacked_linear.available()
