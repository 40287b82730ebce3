"""
The residual connection and its layer normalisation in one pass (`labml_txl/fast/native/layer_norm.py`)
against PyTorch's `layer_norm(residual + x)`, where the dispatcher (`dispatch.residual_layer_norm`) runs it and where
it does not, with its reasons.
"""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from labml_txl.fast import dispatch, native
from labml_txl.fast.dispatch import Plan
from labml_txl.fast.native import layer_norm as module_under_test

from dispatch_helpers import one_choice
from tolerance import assert_close_rounding, rounding_bound, xl_depths
from xl.helpers import plain_and_fast, small_config


def _layer_norm(d, seed=0, eps=1e-5):
    generator = torch.Generator().manual_seed(seed)
    layer_norm = nn.LayerNorm(d, eps=eps)
    with torch.no_grad():
        layer_norm.weight.copy_(torch.randn(d, generator=generator))
        layer_norm.bias.copy_(torch.randn(d, generator=generator))
    return layer_norm


@pytest.fixture
def kernel_calls(count_kernel_calls):
    """The shapes of the kernel's calls."""
    return count_kernel_calls(module_under_test, 'residual_layer_norm', lambda x, *rest: x.shape)


def _residual_layer_norm(residual, x, layer_norm, impl='auto'):
    """`dispatch.residual_layer_norm` in the caller's state, with the `Choice` it records."""
    return one_choice('residual layer norm',
                      lambda: dispatch.residual_layer_norm(Plan.now(x.device, impl), residual, x, layer_norm))


# rows of features: the benchmark's, a single row, a short odd row, one feature
@pytest.mark.parametrize('shape', [(128, 8, 256), (1, 1, 64), (7, 3, 17), (5, 1)], ids=str)
@pytest.mark.parametrize('eps', [1e-5, 1e-3])
def test_kernel_equals_pytorchs_two_passes(kernel_calls, shape, eps):
    generator = torch.Generator().manual_seed(1)
    # Rows with a large common offset: the variance must come from the centred values
    x = torch.randn(*shape, generator=generator) + 30
    residual = torch.randn(*shape, generator=generator)
    layer_norm = _layer_norm(shape[-1], eps=eps)
    with torch.no_grad():
        out, choice = _residual_layer_norm(residual, x, layer_norm)
        assert choice == dispatch.Choice('residual layer norm', 'kernel')
        # (the kernel called directly: the same numbers)
        assert torch.equal(module_under_test.residual_layer_norm(residual, x, layer_norm), out)
        expected = F.layer_norm((residual + x).double(), (shape[-1],), layer_norm.weight.double(),
                                layer_norm.bias.double(), eps)
        pytorch = layer_norm(residual + x)
    assert kernel_calls == [shape, shape]
    assert out.dtype == torch.float32
    # As close to the exact normalisation as PyTorch's float32 `LayerNorm` is (the offset makes float32's
    # rounding of the sum show): within twice its largest error; and since PyTorch's may happen to be exact where
    # the kernel's is not, beyond that the roundings after the sums at the output's size (rule 2, `tolerance.py`):
    # the reciprocal square root's two, the scaling, the weight's and the bias's
    floor = rounding_bound(torch.float32, 5, max(1.0, expected.abs().max().item()))
    pytorch_error = (pytorch.double() - expected).abs().max().item()
    assert (out.double() - expected).abs().max().item() <= 2 * pytorch_error + floor


def test_pytorchs_passes_run_where_the_kernel_does_not_serve(kernel_calls):
    x, residual = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    layer_norm = _layer_norm(8)

    def refused(out, choice, because, expected):
        assert choice.chosen == 'PyTorch' and because in dict(choice.refused)['kernel'], choice
        assert torch.equal(out, expected)

    # With gradients: autograd's path, and a gradient comes back
    x.requires_grad_(True)
    out, choice = _residual_layer_norm(residual, x, layer_norm)
    refused(out, choice, 'gradients', layer_norm(residual + x))
    out.sum().backward()
    assert x.grad is not None
    with torch.no_grad():
        # float64, a view that is not contiguous, autocast, kernels disabled, impl='reference'
        refused(*_residual_layer_norm(residual.double(), x.double(), layer_norm.double()), 'float32',
                layer_norm(residual.double() + x.double()))
        layer_norm.float()
        strided = x.transpose(0, 1).contiguous().transpose(0, 1)
        refused(*_residual_layer_norm(residual, strided, layer_norm), 'contiguous', layer_norm(residual + strided))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out, choice = _residual_layer_norm(residual, x, layer_norm)
            refused(out, choice, 'autocast', layer_norm(residual + x))
        with native.disabled():
            refused(*_residual_layer_norm(residual, x, layer_norm), 'disabled', layer_norm(residual + x))
        refused(*_residual_layer_norm(residual, x, layer_norm, impl='reference'), "impl='reference'",
                layer_norm(residual + x))
    assert kernel_calls == []



@pytest.mark.parametrize('attn_type', [0, 1, 2])
def test_model_evaluation_normalises_each_residual_in_one_pass(kernel_calls, attn_type):
    """Post-LN layers: two residual layer norms a layer (attention and feed-forward), equal to the plain path (20
    rows: more than the fused decoder layer takes, so each norm is chosen), within float32's rounding of the plain
    path in float64."""
    config = small_config(attn_type=attn_type)
    plain, fast = (model.eval() for model in plain_and_fast(attn_type=attn_type))
    plain.double()
    data = torch.randint(40, (6, 4))
    with torch.no_grad():
        with dispatch.recording() as plain_choices:
            plain_loss = plain(data[:5], data[1:])[0]
        with dispatch.recording() as fast_choices:
            fast_loss = fast(data[:5], data[1:])[0]
        assert_close_rounding(fast_loss, plain_loss, depth=xl_depths(config, 5)[1])
    assert len(kernel_calls) == 2 * config['n_layer']

    def norms(choices):
        return [c.chosen for c in choices if c.operation == 'residual layer norm']

    assert norms(fast_choices) == ['kernel'] * (2 * config['n_layer'])
    assert norms(plain_choices) == ['PyTorch'] * (2 * config['n_layer'])
