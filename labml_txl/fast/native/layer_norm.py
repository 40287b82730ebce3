r"""
# The residual connection and its layer normalisation in one pass (no-grad float32 inference on the CPU)

Post-LN Transformer-XL layers end both their sublayers with $\mathop{LN}(h + f(h))$. PyTorch computes it in two
passes over memory, the sum into a new tensor and then `LayerNorm` of it; `residual_layer_norm.cpp` sums each row,
takes its mean and variance and normalises it while the row is in cache, one pass (each layer of the benchmark
does it twice over `[1024, 256]`). The results agree with `layer_norm(residual + x)` to float rounding (tested at
1e-5); with gradients, in other dtypes, under autocast or `torch.compile`, or where the kernel is not available
(`build.py`), PyTorch's two passes run.
"""
import torch
from torch import nn
from torch.nn import functional as F

from .build import checked_kernel, first_result_matches


def _check(module) -> bool:
    """Run the kernel once on a small input and compare with PyTorch's `layer_norm` of the sum."""
    generator = torch.Generator().manual_seed(0)
    x, residual = torch.randn(5, 3, 24, generator=generator, dtype=torch.float32), torch.randn(5, 3, 24, generator=generator, dtype=torch.float32)
    weight, bias = torch.randn(24, generator=generator, dtype=torch.float32), torch.randn(24, generator=generator, dtype=torch.float32)
    return first_result_matches('residual layer-norm',
                                lambda: module.residual_layer_norm(x, residual, weight, bias, 1e-5),
                                lambda: F.layer_norm(residual + x, (24,), weight, bias, 1e-5))


def kernel_available() -> bool:
    """Whether the kernel is built (compiling it on the first call) and passed its first check."""
    return checked_kernel('residual_layer_norm', _check) is not None


def residual_layer_norm(residual: torch.Tensor, x: torch.Tensor, layer_norm: nn.LayerNorm) -> torch.Tensor:
    r"""$\mathop{LN}(\mathit{residual} + x)$ with `layer_norm`'s parameters by the kernel (where `dispatch.py`
    chooses it: no gradient, float32 CPU tensors of one shape, contiguous, an affine `LayerNorm` over the last
    axis)."""
    module = checked_kernel('residual_layer_norm', _check)
    return module.residual_layer_norm(x, residual, layer_norm.weight, layer_norm.bias, layer_norm.eps)
