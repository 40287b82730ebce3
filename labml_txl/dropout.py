r"""
# Dropout with a cheaper mask on the CPU

Dropout (Srivastava et al., 2014) keeps each element with probability $1 - p$ and scales what it keeps, so the
expectation is unchanged:

$$\mathop{dropout}(x)_i = \frac{m_i\, x_i}{1 - p}, \qquad m_i \sim \mathop{Bernoulli}(1 - p)$$

`nn.Dropout` draws $m$ with `bernoulli_`. On this project's CPUs (AMD) PyTorch's `bernoulli_` runs serially at
about 7 ns an element: each element costs a 64-bit uniform double from the Mersenne Twister (the vectorised MKL
kernel is taken on Intel CPUs only). A Transformer-XL training step drops about 7 million elements, so the masks
were a sixth of the step (`docs/performance.md`).

`Dropout` here draws a uniform 31-bit integer $r_i$ per element instead and keeps the element when

$$r_i \ge t, \qquad t = \mathop{round}(p \cdot 2^{31}),$$

so $P(m_i = 1) = 1 - t / 2^{31}$, within $2^{-32}$ of $1 - p$. The integers come two to a 64-bit draw of the same
generator: `random_()` on `int64` is uniform on $[0, 2^{63})$, so the two 32-bit halves of a draw, each with its top
bit cleared, are two independent uniform 31-bit integers (whatever the byte order). That is less than half the
time of `bernoulli_`. The mask is kept as booleans (one byte an element, as `nn.Dropout`'s); forward and backward
are each a fill of the dropped elements and a product by $\frac{1}{1-p}$, with no float copy of the mask.
The masks come from the default generator, so `torch.manual_seed` and saved RNG states reproduce them; they are
not the masks `nn.Dropout` draws from the same seed.

With `fast = False`, on other devices (CUDA's fused dropout is faster) and under `torch.compile` (Inductor has its
own random numbers) this is `nn.Dropout`.

`relu_dropout_` is $\mathop{dropout}(\max(0, h))$ in place on a fresh product $h$, for a feed-forward layer: the
same mask from the same draws, no mask kept for the backward pass (the output says where the gradient passes:
$\partial / \partial h_i = \frac{1}{1-p}$ where the output is positive, else 0) and no tensor allocated.
"""
import torch
from torch import nn


class Dropout(nn.Dropout):
    """
    `nn.Dropout` with the mask drawn from 31-bit integers on the CPU (see the module docstring).

    Args:
        p: probability that an element is zeroed, in [0, 1].

    Shape:
        any; output the same.
    """

    def __init__(self, p: float = 0.5):
        super().__init__(p)
        # False: `nn.Dropout`'s `bernoulli_` mask (the original's computation)
        self.fast = True

    def draws_own_mask(self, x: torch.Tensor) -> bool:
        """Whether `forward(x)` draws the 31-bit mask (else it is `nn.Dropout`'s `forward`)."""
        return (self.training and 0 < self.p < 1 and self.fast and x.device.type == 'cpu' and x.is_floating_point()
                and not torch.compiler.is_compiling())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.draws_own_mask(x):
            return super().forward(x)
        return _Dropout.apply(x, self.p)


def _dropped(shape: torch.Size, p: float) -> torch.Tensor:
    """$1 - m$: True where an element is dropped, with probability $p$ (to within $2^{-32}$)."""
    n = shape.numel()
    # $r_i$ uniform on $[0, 2^{31})$: the halves of 63-bit draws without their top bits; dropped where $r_i < t$
    halves = torch.empty((n + 1) // 2, dtype=torch.int64).random_().view(torch.int32)[:n]
    return halves.bitwise_and_(0x7FFFFFFF).view(shape) < round(p * 2 ** 31)


def _scale(p: float, dtype: torch.dtype) -> float:
    """$\frac{1}{1-p}$ rounded to `dtype` first, as `nn.Dropout`'s mask holds it."""
    return torch.tensor(1 / (1 - p), dtype=dtype).item()


class _Dropout(torch.autograd.Function):
    r"""$\frac{m\,x}{1 - p}$ with $m$ kept as booleans; the backward pass is the same step on the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        dropped, scale = _dropped(x.shape, p), _scale(p, x.dtype)
        ctx.save_for_backward(dropped)
        ctx.scale = scale
        return x.masked_fill(dropped, 0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dropped, = ctx.saved_tensors
        return grad.masked_fill(dropped, 0).mul_(ctx.scale), None


class _ReLUDropoutInPlace(torch.autograd.Function):
    r"""$\mathop{dropout}(\max(0, h))$ written over `h`; backward from the output alone."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, p: float) -> torch.Tensor:
        scale = _scale(p, h.dtype)
        h.relu_().masked_fill_(_dropped(h.shape, p), 0).mul_(scale)
        ctx.mark_dirty(h)
        ctx.save_for_backward(h)
        ctx.scale = scale
        return h

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, = ctx.saved_tensors
        # $\frac{1}{1-p}$ where the output is positive (kept and $h_i > 0$), else 0
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(ctx.scale), None


def relu_dropout_(h: torch.Tensor, dropout: Dropout) -> torch.Tensor:
    """
    `dropout(relu(h))` in place on `h`, which must be a fresh product that nothing else reads (a `Linear`'s output
    qualifies: its backward does not read it). Where `dropout` would not draw its own mask, ReLU runs in place and
    `dropout` as it is.

    Shape:
        any; returns `h`.
    """
    if not dropout.draws_own_mask(h):
        return dropout(torch.relu_(h))
    return _ReLUDropoutInPlace.apply(h, dropout.p)
