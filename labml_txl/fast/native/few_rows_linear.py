r"""
# Linear layers for a few rows: matrix-vector products at the speed of reading the weight

A one-token step of generation multiplies each weight by one row per sequence: $y = x W^\top + b$ with $x$ of
a handful of rows is a matrix-vector product, whose time is that of reading $W$ once. The GEMM libraries PyTorch
calls are tuned for many rows and read $W$ slower than the memory allows (MKL's `sgemm` behind `F.linear`;
oneDNN's packed product, slower still for one row). `few_rows_linear.cpp` takes each output feature as the dot
product of $W$'s row with the input, in $W$'s own layout (no copy is kept), four rows of $W$ at a time, shared
among the threads so that every core reads $W$ at once. It is faster than either library for a few rows only
(`docs/performance.md` has the measurements), so `dispatch.linear` gives it at most `MOST_ROWS` rows.

The results agree with `F.linear` to float rounding (sums in another order; tested at 1e-5). With gradients, in
other dtypes, under autocast or `torch.compile`, or where the kernel is not available (`build.py`), the dispatcher
runs another product.
"""
from typing import Optional

import torch
from torch.nn import functional as F

from .build import checked_kernel, first_result_matches

# The most rows the dispatcher gives the kernel: from about 32 the GEMM libraries are as fast or faster
MOST_ROWS = 16


def _check(module) -> bool:
    """Run the kernel once on a small input (with a tail of output features beyond the blocks of four) and compare
    with `F.linear` and a ReLU."""
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(*shape, generator=generator, dtype=torch.float32) for shape in ((3, 37), (10, 37), (10,)))
    return first_result_matches('few-rows linear', lambda: module.few_rows_linear(x, weight, bias, True),
                                lambda: torch.relu(F.linear(x, weight, bias)))


def kernel_available() -> bool:
    """Whether the kernel is built (compiling it on the first call) and passed its first check."""
    return checked_kernel('few_rows_linear', _check) is not None


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                    relu: bool = False) -> torch.Tensor:
    r"""
    $x W^\top + b$ (and $\max(0, \cdot)$ of it with `relu`) by the kernel, where `dispatch.linear` chooses it: no
    gradient, float32 CPU tensors, a contiguous weight, at most `MOST_ROWS` rows.

    Shape:
        `x` `[..., in_features]`, `weight` `[out_features, in_features]`, `bias` `[out_features]` or None; returns
        `[..., out_features]`.
    """
    module = checked_kernel('few_rows_linear', _check)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return module.few_rows_linear(rows, weight, bias, relu).view(*x.shape[:-1], weight.shape[0])
