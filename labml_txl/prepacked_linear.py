r"""
# Linear layers for no-grad CPU inference, with weights kept in the layout their product reads fastest

$y = x W^\top + b$ computes the same whichever kernel runs it; how fast depends on the kernel. `F.linear` on the
CPU calls MKL's `sgemm`, which repacks $W$ on every call. PyTorch also ships oneDNN, the library behind
`torch.compile`'s CPU freezing pass: its `mkldnn::_reorder_linear_weight` packs $W$ once into the blocked layout
its kernels read, and `mkldnn::_linear_pointwise` multiplies by the packed weight, faster at the Transformer-XL
benchmark's shapes (`docs/performance.md` has the figures).

`dispatch.linear` uses it where that is safe and pays: without gradients (the op has no backward), float32 on
the CPU, outside autocast and `torch.compile`, with at least two rows.

A single row (a one-token step of generation) is a matrix-vector product: its time is that of reading $W$ once,
and oneDNN's packed product is slower at it than `F.linear`. `F.linear` hands MKL $W$ as the transpose of its
storage; with a copy of $W^\top$ stored as `[in_features, out_features]`, $x W^\top$ streams its rows in order and
ran faster here when the weights come from the cache a layer at a time (`docs/performance.md`). `one_row_linear`
multiplies by such a copy.

A weight in another layout is kept per weight tensor while its version counter is unchanged (an optimizer step or
`load_state_dict` bumps it; `parameter_versions.py` for fused optimizers), so it is made once per evaluation, not
per call; each layout costs one more copy of the weight while the weight lives.

Not in training: there the weights change at every step, and packing them anew each step (and $W^\top$ for the
input's gradient) cost more than oneDNN saved (measured: `docs/performance.md`). Results differ from `F.linear`'s
by float rounding only (a sum in another order).
Where the ops are missing (a PyTorch built without oneDNN) or fail their first check, `F.linear` runs.
"""
import warnings
from typing import Callable, Optional

import torch
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary

from .parameter_versions import track_fused_optimizer_steps

# Per weight tensor (by identity): per layout, the version it was made at and the weight in that layout; entries go
# with their weight
_kept = WeakIdKeyDictionary()
# Whether oneDNN's linear ops work in this PyTorch (checked on first use)
_available: Optional[bool] = None


def _check_available() -> bool:
    """Run the two ops once on a small input and compare with `F.linear`."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        # (in float32, whatever the first caller runs under: the answer is kept for the process)
        with torch.autocast('cpu', enabled=False), torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            x, w, b = (torch.randn(*shape, generator=generator) for shape in ((4, 16), (8, 16), (8,)))
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, b, 'none', [], '')
            works = torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-5)
    except (AttributeError, RuntimeError) as error:
        warnings.warn(f"oneDNN's prepacked linear is not usable in this PyTorch ({error}); "
                      f"evaluation uses F.linear")
        return False
    if not works:
        warnings.warn("oneDNN's prepacked linear gave other results than F.linear; evaluation uses F.linear")
    return works


def available() -> bool:
    """Whether oneDNN's linear ops work in this PyTorch (checked on the first call)."""
    global _available
    if _available is None:
        _available = _check_available()
    return _available


def _in_layout(weight: torch.Tensor, layout: str, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`make(weight)`, kept under `layout` for `weight` and made again only when the weight has changed in place."""
    layouts = _kept.get(weight)
    if layouts is None:
        layouts = _kept[weight] = {}
    entry = layouts.get(layout)
    if entry is None or entry[0] != weight._version:
        # The cache trusts version counters, which fused optimizer steps do not bump by themselves
        track_fused_optimizer_steps()
        entry = layouts[layout] = (weight._version, make(weight.detach()))
    return entry[1]


def prepacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     relu: bool = False) -> torch.Tensor:
    r"""
    $x W^\top + b$ (and $\max(0, \cdot)$ of it with `relu`) through oneDNN with `weight` prepacked, the bias and the
    ReLU applied by the product as it writes its output. No gradient: call where `dispatch.linear` chooses it.

    Shape:
        `x` `[..., in_features]`, `weight` `[out_features, in_features]`, `bias` `[out_features]` or None;
        returns `[..., out_features]`.
    """
    rows = x.numel() // x.shape[-1]
    # (`rows` only guides the choice of layout; the packed weight serves any number of rows)
    packed = _in_layout(weight, 'oneDNN', lambda w: torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), rows))
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]).contiguous(), packed, bias,
                                           'relu' if relu else 'none', [], '')
    return y.view(*x.shape[:-1], weight.shape[0])


def one_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                   relu: bool = False) -> torch.Tensor:
    r"""
    $x W^\top + b$ (and $\max(0, \cdot)$ of it with `relu`) for a single row $x$, as $x$ times a kept copy of
    $W^\top$ (`[in_features, out_features]`, contiguous). No gradient: call where `dispatch.linear` chooses it.

    Shape:
        `x` `[..., in_features]` with one row, `weight` `[out_features, in_features]`, `bias` `[out_features]` or
        None; returns `[..., out_features]`.
    """
    transposed = _in_layout(weight, 'transposed', lambda w: w.t().contiguous())
    row = x.reshape(1, x.shape[-1])
    # $x W^\top + b$
    y = row @ transposed if bias is None else torch.addmm(bias, row, transposed)
    y = y.view(*x.shape[:-1], weight.shape[0])
    return torch.relu_(y) if relu else y
