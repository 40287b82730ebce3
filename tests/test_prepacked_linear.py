"""
`inference_linear` (oneDNN with prepacked weights) against `F.linear`: the same numbers up to float rounding where
it runs, exactly `F.linear` where it must not run, and a weight changed in place is packed again.
"""
import gc

import pytest
import torch
from torch.nn import functional as F

from labml_txl import prepacked_linear
from labml_txl.prepacked_linear import inference_linear

requires_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                     reason='this PyTorch is built without oneDNN')


@pytest.fixture(autouse=True)
def _checked():
    """The first use checks oneDNN's ops once (one call of each): done here, before any test counts calls."""
    with torch.no_grad():
        inference_linear(torch.randn(2, 4), torch.randn(3, 4))


@requires_onednn
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('shape', [(7, 32), (5, 3, 32), (3, 5, 32)], ids=['2d', '3d', '3d-transposed'])
def test_equals_f_linear_without_gradients(count_calls, shape, with_bias):
    weight, bias = torch.randn(48, 32), torch.randn(48) if with_bias else None
    x = torch.randn(*shape)
    if shape == (3, 5, 32):
        x = torch.randn(5, 3, 32).transpose(0, 1)  # not contiguous
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    with torch.no_grad():
        y = inference_linear(x, weight, bias)
    assert calls == {'_linear_pointwise': 1}
    assert y.shape == shape[:-1] + (48,)
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@requires_onednn
def test_a_weight_changed_in_place_is_packed_again(count_calls):
    weight, x = torch.randn(16, 8), torch.randn(4, 8)
    calls = count_calls(torch.ops.mkldnn, ['_reorder_linear_weight'])
    with torch.no_grad():
        first = inference_linear(x, weight)
        assert torch.equal(inference_linear(x, weight), first)
        assert calls['_reorder_linear_weight'] == 1  # packed once for both calls
        weight.mul_(2)  # as an optimizer step does
        torch.testing.assert_close(inference_linear(x, weight), 2 * first, rtol=1e-6, atol=1e-6)
    assert calls['_reorder_linear_weight'] == 2


@requires_onednn
def test_a_packed_weight_goes_with_its_weight():
    weight = torch.randn(16, 8)
    with torch.no_grad():
        inference_linear(torch.randn(4, 8), weight)
    assert weight in prepacked_linear._packed
    gc.collect()  # entries of weights other tests left behind go first
    count = len(prepacked_linear._packed)
    del weight
    gc.collect()
    assert len(prepacked_linear._packed) == count - 1


@pytest.mark.parametrize('case', ['grad', 'float64', 'one-row', 'autocast'])
def test_f_linear_runs_where_the_packed_weight_must_not(count_calls, case):
    weight, bias, x = torch.randn(16, 8), torch.randn(16), torch.randn(4, 8)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    if case == 'grad':
        weight.requires_grad_()
        y = inference_linear(x, weight, bias)
        y.sum().backward()
        assert weight.grad is not None
    else:
        if case == 'float64':
            weight, bias, x = weight.double(), bias.double(), x.double()
        if case == 'one-row':
            x = x[:1]
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=case == 'autocast'):
            y = inference_linear(x, weight, bias)
            assert torch.equal(y, F.linear(x, weight, bias))
    assert calls == {}


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64], ids=['onednn', 'f-linear'])
def test_relu_is_applied_by_the_product(count_calls, dtype):
    """`relu=True`: $\\max(0, x W^\\top + b)$, by oneDNN's product itself where it runs (one call, no other pass),
    by `F.linear` and an in-place ReLU where it does not."""
    weight, bias, x = (torch.randn(*shape, dtype=dtype) for shape in ((48, 32), (48,), (9, 32)))
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    with torch.no_grad():
        y = inference_linear(x, weight, bias, relu=True)
    expected = torch.relu(F.linear(x, weight, bias))
    assert (y == 0).any() and (y > 0).any()
    if dtype == torch.float32 and torch.backends.mkldnn.is_available():
        assert calls == {'_linear_pointwise': 1}
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    else:
        assert calls == {} and torch.equal(y, expected)
