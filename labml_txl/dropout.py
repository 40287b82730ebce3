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
time of `bernoulli_`. The mask is kept as $\frac{m}{1-p}$ in the input's dtype, so forward and backward are one
product each (the float mask takes 4 bytes an element where `nn.Dropout` keeps 1).
The masks come from the default generator, so `torch.manual_seed` and saved RNG states reproduce them; they are
not the masks `nn.Dropout` draws from the same seed.

With `fast = False`, on other devices (CUDA's fused dropout is faster) and under `torch.compile` (Inductor has its
own random numbers) this is `nn.Dropout`.
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (not self.training or self.p in (0, 1) or not self.fast or x.device.type != 'cpu'
                or not x.is_floating_point() or torch.compiler.is_compiling()):
            return super().forward(x)
        # $r_i$ uniform on $[0, 2^{31})$: the halves of 63-bit draws without their top bits; keep where $r_i \ge t$
        n = x.numel()
        halves = torch.empty((n + 1) // 2, dtype=torch.int64).random_().view(torch.int32)[:n]
        keep = halves.bitwise_and_(0x7FFFFFFF).view(x.shape) >= round(self.p * 2 ** 31)
        # $\frac{m}{1 - p}$
        mask = keep.to(x.dtype).mul_(1 / (1 - self.p))
        return x * mask
