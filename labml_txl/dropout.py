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
(`labml_txl/native/dropout.py`): $u_e$ from SplitMix64, a counter-based generator, seeded by one draw of the
default generator per mask, dropped where $u_e < t$ (the same $p'$ and scale). Nothing is kept for the backward
pass, which draws the mask again from the seed. Where the kernel does not serve
(other dtypes, a machine without a compiler, `LABML_TXL_NATIVE=0`) PyTorch draws them as above; the two draw
different masks from the same seed.

With `fast = False`, on other devices (CUDA's fused dropout is faster) and under `torch.compile` (Inductor has its
own random numbers) this is `nn.Dropout`.

`relu_dropout_` is $\mathop{dropout}(\max(0, h))$ in place on a fresh product $h$, for a feed-forward layer: the
same mask from the same draws, no mask kept for the backward pass (the output says where the gradient passes:
$\partial / \partial h_i = \frac{1}{1-p'}$ where the output is positive, else 0) and no tensor allocated.
"""
import torch
from torch import nn

from .native import dropout as native_dropout


class Dropout(nn.Dropout):
    """
    `nn.Dropout` with the mask drawn from 16-bit integers on the CPU (see the module docstring).

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
        """Whether `forward(x)` draws the 16-bit mask (else it is `nn.Dropout`'s `forward`)."""
        return (self.training and 0 < _threshold(self.p) < 2 ** 16 and self.fast and x.device.type == 'cpu'
                and x.is_floating_point() and not torch.compiler.is_compiling())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.draws_own_mask(x):
            return super().forward(x)
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
    r"""$\frac{m\,x}{1 - p'}$; the backward pass is the same step on the gradient. By the kernel (`native/dropout.py`)
    where it serves: the mask drawn from a seed, and drawn again from it in the backward pass; else $m$ drawn by
    PyTorch (`_dropped`) and kept as booleans."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        scale = _scale(p, x.dtype)
        ctx.scale, ctx.threshold = scale, _threshold(p)
        if native_dropout.serves(x):
            ctx.seed = native_dropout.draw_seed()
            return native_dropout.dropout(x, ctx.seed, ctx.threshold, scale)
        ctx.seed = None
        dropped = _dropped(x.shape, p)
        ctx.save_for_backward(dropped)
        # (`where` rather than `masked_fill`: about a fifth faster on the CPU)
        return torch.where(dropped, 0.0, x).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.seed is not None:
            if torch.is_grad_enabled():
                # A second derivative is asked for (`create_graph`): the same product, differentiable in `grad`
                return grad * native_dropout.dropout(torch.ones_like(grad), ctx.seed, ctx.threshold, ctx.scale), None
            return native_dropout.dropout(grad, ctx.seed, ctx.threshold, ctx.scale), None
        dropped, = ctx.saved_tensors
        return torch.where(dropped, 0.0, grad).mul_(ctx.scale), None


class _ReLUDropoutInPlace(torch.autograd.Function):
    r"""$\mathop{dropout}(\max(0, h))$ written over `h`; backward from the output alone. By the kernel where it serves
    (the same mask as `_Dropout`'s from the same generator state), else by PyTorch's ops."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, p: float) -> torch.Tensor:
        scale = _scale(p, h.dtype)
        ctx.native = native_dropout.serves(h) and h.is_contiguous()
        if ctx.native:
            native_dropout.relu_dropout_(h, native_dropout.draw_seed(), _threshold(p), scale)
        else:
            torch.where(_dropped(h.shape, p), h.new_zeros(()), h.relu_(), out=h).mul_(scale)
        ctx.mark_dirty(h)
        ctx.save_for_backward(h)
        ctx.scale = scale
        return h

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, = ctx.saved_tensors
        # $\frac{1}{1-p'}$ where the output is positive (kept and $h_i > 0$), else 0
        if ctx.native and not torch.is_grad_enabled():
            return native_dropout.relu_dropout_backward(grad, out, ctx.scale), None
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
