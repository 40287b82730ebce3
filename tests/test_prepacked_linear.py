"""
`prepacked_linear` (oneDNN with prepacked weights) against `F.linear`: the same outputs and gradients up to float
rounding where it runs, exactly `F.linear` where it must not run, and a weight changed in place is packed again.
"""
import gc

import pytest
import torch
from torch.nn import functional as F

import labml_txl.prepacked_linear as module
from labml_txl.prepacked_linear import prepacked_linear

requires_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                     reason='this PyTorch is built without oneDNN')


@pytest.fixture(autouse=True)
def _checked():
    """The first use checks oneDNN's ops once (one call of each): done here, before any test counts calls."""
    with torch.no_grad():
        prepacked_linear(torch.randn(2, 4), torch.randn(3, 4))


def _input(shape):
    if shape == (3, 5, 32):
        return torch.randn(5, 3, 32).transpose(0, 1)  # not contiguous
    return torch.randn(*shape)


@requires_onednn
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('shape', [(7, 32), (5, 3, 32), (3, 5, 32)], ids=['2d', '3d', '3d-transposed'])
def test_equals_f_linear_without_gradients(count_calls, shape, with_bias):
    weight, bias, x = torch.randn(48, 32), torch.randn(48) if with_bias else None, _input(shape)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    with torch.no_grad():
        y = prepacked_linear(x, weight, bias)
    assert calls == {'_linear_pointwise': 1}
    assert y.shape == shape[:-1] + (48,)
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@requires_onednn
@pytest.mark.parametrize('needs', ['all', 'input', 'weight'])
@pytest.mark.parametrize('shape', [(7, 32), (3, 5, 32)], ids=['2d', '3d-transposed'])
def test_gradients_equal_f_linear(count_calls, shape, needs):
    weight, bias, x = torch.randn(48, 32), torch.randn(48), _input(shape)
    x.requires_grad_(needs in ('all', 'input'))
    weight.requires_grad_(needs in ('all', 'weight'))
    bias.requires_grad_(needs in ('all', 'weight'))
    grad = torch.randn(shape[:-1] + (48,))
    expected = torch.autograd.grad(F.linear(x, weight, bias), [t for t in (x, weight, bias) if t.requires_grad], grad)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    y = prepacked_linear(x, weight, bias)
    got = torch.autograd.grad(y, [t for t in (x, weight, bias) if t.requires_grad], grad)
    # The forward product, and the input's gradient where one is asked for
    assert calls == {'_linear_pointwise': 1 + x.requires_grad}
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@requires_onednn
def test_a_weight_changed_in_place_is_packed_again(count_calls):
    weight, x = torch.randn(16, 8), torch.randn(4, 8)
    calls = count_calls(torch.ops.mkldnn, ['_reorder_linear_weight'])
    with torch.no_grad():
        first = prepacked_linear(x, weight)
        assert torch.equal(prepacked_linear(x, weight), first)
        assert calls['_reorder_linear_weight'] == 1  # packed once for both calls
        weight.mul_(2)  # as an optimizer step does
        torch.testing.assert_close(prepacked_linear(x, weight), 2 * first, rtol=1e-6, atol=1e-6)
    assert calls['_reorder_linear_weight'] == 2


@requires_onednn
def test_a_packed_weight_goes_with_its_weight():
    weight = torch.randn(16, 8)
    with torch.no_grad():
        prepacked_linear(torch.randn(4, 8), weight)
    assert weight in module._packed
    gc.collect()  # entries of weights other tests left behind go first
    count = len(module._packed)
    del weight
    gc.collect()
    assert len(module._packed) == count - 1


@pytest.mark.parametrize('case', ['float64', 'one-row', 'autocast'])
def test_f_linear_runs_where_the_packed_weight_must_not(count_calls, case):
    weight, bias, x = torch.randn(16, 8), torch.randn(16), torch.randn(4, 8)
    calls = count_calls(torch.ops.mkldnn, ['_linear_pointwise'])
    if case == 'float64':
        weight, bias, x = weight.double(), bias.double(), x.double()
    if case == 'one-row':
        x = x[:1]
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=case == 'autocast'):
        y = prepacked_linear(x, weight, bias)
        assert torch.equal(y, F.linear(x, weight, bias))
    assert calls == {}
