r"""
# Linear layers on the CPU through oneDNN, with prepacked weights

$y = x W^\top + b$ computes the same whichever kernel runs it; how fast depends on the kernel. `F.linear` on the
CPU calls MKL's `sgemm`, which repacks $W$ on every call and, on the AMD CPU this project measures on, ran the
Transformer-XL benchmark's products at 130 to 190 GFLOP/s. PyTorch also ships oneDNN, the library behind
`torch.compile`'s CPU freezing pass: its `mkldnn::_reorder_linear_weight` packs $W$ once into the blocked layout
its kernels read, and `mkldnn::_linear_pointwise` multiplies by the packed weight (about 200 GFLOP/s on the same
shapes; `docs/performance.md`).

`prepacked_linear` uses it in float32 on the CPU, outside autocast and `torch.compile`, with at least two rows (a
single row is a matrix-vector product, which `F.linear` does faster). A packed weight is kept per weight tensor
while its version counter is unchanged, so it is packed once per evaluation, or once per optimizer step in
training (the step bumps the version), not once per call; it costs one more copy of the weight while the weight
lives. With gradients, the backward pass is

$$\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} W, \qquad
  \frac{\partial L}{\partial W} = \Bigl(\frac{\partial L}{\partial y}\Bigr)^\top x, \qquad
  \frac{\partial L}{\partial b} = \sum_{rows} \frac{\partial L}{\partial y}$$

with the first product through oneDNN too ($W^\top$ packed as the weight of a linear layer) and the second by
`torch.mm`. Results differ from `F.linear`'s by float rounding only (sums in another order). Where the ops are
missing (a PyTorch built without oneDNN) or fail their first check, `F.linear` runs.
"""
import warnings
from typing import Optional

import torch
from torch.autograd.function import once_differentiable
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary

from .parameter_versions import track_fused_optimizer_steps

# The caches here trust parameter versions, which fused optimizer steps do not bump by themselves
track_fused_optimizer_steps()

# Per weight tensor (by identity): `{transposed: (version packed at, packed weight)}`; entries go with their weight
_packed = WeakIdKeyDictionary()
# Whether oneDNN's linear ops work in this PyTorch (checked on first use)
_available: Optional[bool] = None


def _check_available() -> bool:
    """Run the two ops once on a small input and compare with `F.linear`."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*shape, generator=generator) for shape in ((4, 16), (8, 16), (8,)))
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, b, 'none', [], '')
        works = torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-5)
    except (AttributeError, RuntimeError) as error:
        warnings.warn(f"oneDNN's prepacked linear is not usable in this PyTorch ({error}); F.linear runs instead")
        return False
    if not works:
        warnings.warn("oneDNN's prepacked linear gave other results than F.linear; F.linear runs instead")
    return works


def _usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    global _available
    if (x.device.type != 'cpu' or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() < 2
            or x.numel() < 2 * x.shape[-1] or torch.is_autocast_enabled('cpu') or torch.compiler.is_compiling()):
        return False
    if _available is None:
        _available = _check_available()
    return _available


def _packed_weight(weight: torch.Tensor, rows: int, transposed: bool = False) -> torch.Tensor:
    """`weight` (or $W^\\top$) packed for oneDNN, packed again only when `weight` has changed in place."""
    versions = _packed.get(weight)
    if versions is None:
        versions = _packed[weight] = {}
    entry = versions.get(transposed)
    if entry is None or entry[0] != weight._version:
        source = weight.detach()
        source = source.t() if transposed else source
        # `rows` only guides the choice of layout; the packed weight serves any number of rows
        entry = versions[transposed] = (weight._version,
                                        torch.ops.mkldnn._reorder_linear_weight(source.contiguous(), rows))
    return entry[1]


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, 'none', [], '')


class _PrepackedLinear(torch.autograd.Function):
    """$x W^\\top + b$ on `[rows, in_features]` with the backward in the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, _packed_weight(weight, x.shape[0]), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # $\frac{\partial L}{\partial y} W$: a linear layer whose weight is $W^\top$
            grad_x = _onednn_linear(grad, _packed_weight(weight, grad.shape[0], transposed=True), None)
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t().mm(x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


def prepacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""
    $x W^\top + b$ as `F.linear`; on the CPU in float32, through oneDNN with `weight` prepacked (gradients included).

    Shape:
        `x` `[..., in_features]`, `weight` `[out_features, in_features]`, `bias` `[out_features]` or None;
        returns `[..., out_features]`.
    """
    if not _usable(x, weight):
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1]
    x2d = x.reshape(rows, x.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        y = _PrepackedLinear.apply(x2d, weight, bias)
    else:
        y = _onednn_linear(x2d, _packed_weight(weight, rows), bias)
    return y.view(*x.shape[:-1], weight.shape[0])
