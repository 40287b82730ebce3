r"""
# Dropout with its mask drawn where it is applied (float32 on the CPU)

`labml_txl.fast.dropout` drops an element when a uniform 16-bit integer $u_e$ falls below $t = \mathop{round}(p \cdot
2^{16})$. Drawn by PyTorch, the integers cost a pass of the generator over memory, a comparison pass that writes a
boolean mask, and the mask is kept for the backward pass, which reads it again. The kernel (`dropout.cpp`) draws
$u_e$ inside the pass that applies it, from a counter-based generator: element $e$ (flat index of the contiguous
tensor) takes the 16-bit piece $e \bmod 4$ of

$$\mathop{mix}(\mathit{seed} + (\lfloor e / 4 \rfloor + 1)\,\gamma)$$

with $\mathop{mix}$ SplitMix64's output function and $\gamma = \lfloor 2^{64} / \varphi \rfloor$ its increment (the
64-bit numbers are SplitMix64's sequence from `seed`; Steele, Lea and Flood, 2014). A mask is a function of the
seed and the index alone, so nothing is kept for the backward pass (it draws the same mask again), and the threads
give the same mask whatever their number. Each call takes one 63-bit seed from PyTorch's default generator: masks
follow `torch.manual_seed` and the generator state a checkpoint saves, as before.

The probability $p' = t / 2^{16}$ and the scale $\frac{1}{1 - p'}$ are the module's; only the generator differs, so
the kernel and PyTorch's path draw different masks from the same seed (as both differ from `nn.Dropout`'s).
"""

import torch

from .build import checked_kernel, first_result_matches

# SplitMix64's constants (unsigned 64-bit), as the kernel has them
_GOLDEN, _MIX_1, _MIX_2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _int64(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical (unsigned) right shift of int64 bits."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def reference_draws(numel: int, seed: int) -> torch.Tensor:
    """$u_e$ for the first `numel` elements, `[numel]` int64 in $[0, 2^{16})$, computed in PyTorch's int64
    arithmetic (which wraps as unsigned arithmetic does): the kernel's first check, and the tests'."""
    counters = torch.arange(1, (numel + 3) // 4 + 1, dtype=torch.int64)
    z = seed + counters * _int64(_GOLDEN)
    z = (z ^ _shift_right(z, 30)) * _int64(_MIX_1)
    z = (z ^ _shift_right(z, 27)) * _int64(_MIX_2)
    z = z ^ _shift_right(z, 31)
    # The four 16-bit pieces of each number in memory order (little-endian: the lowest first)
    pieces = torch.stack([_shift_right(z, 16 * k) & 0xFFFF for k in range(4)], dim=1)
    return pieces.flatten()[:numel]


def _check(module) -> bool:
    """The kernel's masks against `reference_draws` on a size that ends inside a block and inside a number."""
    x = torch.randn(3, 1031, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    seed, threshold, scale = 0x5DEECE66D, 20000, 1.25
    expected = torch.where(reference_draws(x.numel(), seed).view_as(x) < threshold, 0.0, x * scale)
    return first_result_matches('dropout', lambda: module.dropout(x, seed, threshold, scale), lambda: expected)


def kernel_available() -> bool:
    """Whether the kernel is built (compiling it on the first call) and passed its first check."""
    return checked_kernel('dropout', _check) is not None


def draw_seed() -> int:
    """A seed for one mask from PyTorch's default generator (63 bits)."""
    return int(torch.empty((), dtype=torch.int64).random_())


def dropout(x: torch.Tensor, seed: int, threshold: int, scale: float) -> torch.Tensor:
    """0 where $u_e < t$ (`threshold`), else $x_e \\cdot$ `scale`: a new tensor (where `dispatch.dropout_path` chooses the kernel)."""
    return checked_kernel('dropout', _check).dropout(x.contiguous(), seed, threshold, scale)


def relu_dropout_(h: torch.Tensor, seed: int, threshold: int, scale: float) -> torch.Tensor:
    """$\\max(h_e, 0) \\cdot$ `scale`, 0 where $u_e < t$, in place on the contiguous `h` (the same mask as `dropout`
    with the same seed)."""
    return checked_kernel('dropout', _check).relu_dropout_(h, seed, threshold, scale)


def relu_dropout_backward(grad: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    """The gradient of `relu_dropout_` from its output `out`: `grad * scale` where `out > 0`, else 0."""
    return checked_kernel('dropout', _check).relu_dropout_backward(grad.contiguous(), out, scale)


__all__ = ['kernel_available', 'draw_seed', 'dropout', 'relu_dropout_', 'relu_dropout_backward',
           'reference_draws']
