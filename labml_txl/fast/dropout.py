r"""
# Dropout with a cheaper mask on the CPU

Dropout (Srivastava et al., 2014) keeps each element with probability $1 - p$ and scales what it keeps, so the
expectation is unchanged:

$$\mathop{dropout}(x)_i = \frac{m_i\, x_i}{1 - p}, \qquad m_i \sim \mathop{Bernoulli}(1 - p)$$

`nn.Dropout` draws $m$ with `bernoulli_`, which on an AMD CPU runs serially: each element costs a 64-bit uniform
double from the Mersenne Twister (the vectorised MKL kernel is taken on Intel CPUs only), and a Transformer-XL
training step drops millions of elements (`docs/performance.md` has the figures).

`Dropout` here draws a uniform 16-bit integer $r_i$ per element instead, on $[-2^{15}, 2^{15})$, and drops the
element when

$$r_i < t - 2^{15}, \qquad t = \mathop{round}(p \cdot 2^{16}),$$

so it drops with probability $p' = t / 2^{16}$, within $2^{-17}$ of $p$ (0.1 becomes 0.10000610), and scales
what it keeps by $\frac{1}{1 - p'}$: the expectation is unchanged exactly. The integers come four to a draw of the
same generator: `random_(-2**63, None)` on `int64` is uniform over all 64 bits, and its four 16-bit pieces are four
independent uniform integers (whatever the byte order). A draw costs two 32-bit outputs of the Mersenne Twister,
so an element costs half of one. Where $t$ would be 0 or
$2^{16}$ ($p$ within $2^{-17}$ of 0 or 1) this is `nn.Dropout`. The mask is kept as booleans (one byte an element, as
`nn.Dropout`'s); forward and backward each zero the dropped elements (`torch.where`) and multiply by
$\frac{1}{1-p'}$, with no float copy of the mask.
The masks come from the default generator, so `torch.manual_seed` and saved RNG states reproduce them; they are
not the masks `nn.Dropout` draws from the same seed.

On float32 CPU tensors our kernel draws the same 16-bit integers inside the pass that applies them
(`labml_txl/fast/native/dropout.py`): $u_e$ from SplitMix64, a counter-based generator, seeded by one draw of the
default generator per mask, dropped where $u_e < t$ (the same $p'$ and scale). Nothing is kept for the backward
pass, which draws the mask again from the seed. Where the kernel does not serve
(other dtypes, a machine without a compiler, `LABML_TXL_NATIVE=0`) PyTorch draws them as above; the two draw
different masks from the same seed.

On other devices (CUDA's fused dropout is faster) and under `torch.compile` (Inductor has its own random numbers)
this is `nn.Dropout`; `dispatch.dropout_path` decides, the same whichever `impl` a model computes with.

`relu_dropout_` is $\mathop{dropout}(\max(0, h))$ in place on a fresh product $h$, for a feed-forward layer: the
same mask from the same draws, no mask kept for the backward pass (the output says where the gradient passes:
$\partial / \partial h_i = \frac{1}{1-p'}$ where the output is positive, else 0) and no tensor allocated.
"""
import torch
from torch import nn

from . import dispatch
from .native import dropout as native_dropout


class Dropout(nn.Dropout):
    """
    `nn.Dropout` with the mask drawn from 16-bit integers on the CPU (see the module docstring).

    Args:
        p: probability that an element is zeroed, in [0, 1].

    Shape:
        any; output the same.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = dispatch.dropout_path(self, x, _threshold(self.p))
        if path == 'nn.Dropout':
            return super().forward(x)
        if path == 'kernel':
            return _SeededDropout.apply(x, native_dropout.draw_seed(), _threshold(self.p), _scale(self.p, x.dtype))
        return _Dropout.apply(x, self.p)


def _threshold(p: float) -> int:
    r"""$t = \mathop{round}(p \cdot 2^{16})$: an element is dropped with probability $p' = t / 2^{16}$."""
    return round(p * 2 ** 16)


def _dropped(shape: torch.Size, p: float) -> torch.Tensor:
    """$1 - m$: True where an element is dropped, with probability $p'$ (within $2^{-17}$ of $p$)."""
    n = shape.numel()
    # $r_i$ uniform on $[-2^{15}, 2^{15})$: the four 16-bit pieces of 64-bit draws; dropped where $r_i < t - 2^{15}$
    draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-2 ** 63, None)
    return draws.view(torch.int16)[:n].view(shape) < _threshold(p) - 2 ** 15


def _scale(p: float, dtype: torch.dtype) -> float:
    r"""$\frac{1}{1-p'}$ rounded to `dtype` first, as `nn.Dropout`'s mask holds its $\frac{1}{1-p}$."""
    return torch.tensor(1 / (1 - _threshold(p) / 2 ** 16), dtype=dtype).item()


class _Dropout(torch.autograd.Function):
    r"""$\frac{m\,x}{1 - p'}$ with $m$ drawn by PyTorch (`_dropped`) and kept as booleans; the backward pass is the
    same step on the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        ctx.scale = _scale(p, x.dtype)
        dropped = _dropped(x.shape, p)
        ctx.save_for_backward(dropped)
        # (`where` rather than `masked_fill`: about a fifth faster on the CPU)
        return torch.where(dropped, 0.0, x).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dropped, = ctx.saved_tensors
        return torch.where(dropped, 0.0, grad).mul_(ctx.scale), None


class _SeededDropout(torch.autograd.Function):
    r"""$\frac{m\,x}{1 - p'}$ by the kernel (`native/dropout.py`), the mask drawn from `seed` inside the pass; the
    backward pass is this same function on the gradient (the mask drawn again from the seed), so it is
    differentiable again where a second derivative is asked for."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seed: int, threshold: int, scale: float) -> torch.Tensor:
        ctx.seed, ctx.threshold, ctx.scale = seed, threshold, scale
        return native_dropout.dropout(x, seed, threshold, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _SeededDropout.apply(grad, ctx.seed, ctx.threshold, ctx.scale), None, None, None


class _ReLUDropoutInPlace(torch.autograd.Function):
    r"""$\mathop{dropout}(\max(0, h))$ written over `h`; backward from the output alone. By the kernel with `native`
    (the same mask as `_SeededDropout`'s from the same generator state), else by PyTorch's ops (`_Dropout`'s)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, p: float, native: bool) -> torch.Tensor:
        scale = _scale(p, h.dtype)
        if native:
            native_dropout.relu_dropout_(h, native_dropout.draw_seed(), _threshold(p), scale)
        else:
            torch.where(_dropped(h.shape, p), h.new_zeros(()), h.relu_(), out=h).mul_(scale)
        ctx.mark_dirty(h)
        ctx.save_for_backward(h)
        ctx.scale, ctx.native = scale, native
        return h

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, = ctx.saved_tensors
        # $\frac{1}{1-p'}$ where the output is positive (kept and $h_i > 0$), else 0
        return _KeptPositive.apply(grad, out, ctx.scale, ctx.native), None, None


class _KeptPositive(torch.autograd.Function):
    r"""`grad * scale` where `out > 0`, else 0 (by the kernel with `native`); linear in `grad`, so its own backward
    is the same function: a second derivative comes out right."""

    @staticmethod
    def forward(ctx, grad: torch.Tensor, out: torch.Tensor, scale: float, native: bool) -> torch.Tensor:
        ctx.save_for_backward(out)
        ctx.scale, ctx.native = scale, native
        if native:
            return native_dropout.relu_dropout_backward(grad, out, scale)
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(scale)

    @staticmethod
    def backward(ctx, grad_grad: torch.Tensor):
        out, = ctx.saved_tensors
        return _KeptPositive.apply(grad_grad, out, ctx.scale, ctx.native), None, None, None


def relu_dropout_(h: torch.Tensor, dropout: Dropout) -> torch.Tensor:
    """
    `dropout(relu(h))` in place on `h`, which must be a fresh product that nothing else reads (a `Linear`'s output
    qualifies: its backward does not read it). Where `dropout` would not draw its own mask, ReLU runs in place and
    `dropout` as it is.

    Shape:
        any; returns `h`.
    """
    path = dispatch.dropout_path(dropout, h, _threshold(dropout.p))
    if path == 'nn.Dropout':
        return dropout(torch.relu_(h))
    return _ReLUDropoutInPlace.apply(h, dropout.p, path == 'kernel' and h.is_contiguous())
