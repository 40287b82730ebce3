r"""
# Linear layers for no-grad CPU inference, with weights kept in the layout oneDNN reads

$y = x W^\top + b$ computes the same whichever kernel runs it; how fast depends on the kernel. `F.linear` on the
CPU calls MKL's `sgemm`, which repacks $W$ on every call. PyTorch also ships oneDNN, the library behind
`torch.compile`'s CPU freezing pass: its `mkldnn::_reorder_linear_weight` packs $W$ once into the blocked layout
its kernels read, and `mkldnn::_linear_pointwise` multiplies by the packed weight, faster at the Transformer-XL
benchmark's shapes (`docs/performance.md` has the figures).

`dispatch.linear` uses it where that is safe and pays: without gradients (the op has no backward), float32 on
the CPU, outside autocast and `torch.compile`, with more rows than our few-rows kernel takes
(`native/few_rows_linear.py`: a handful of rows is a matrix-vector product, which both libraries do slowly).

The packed weight is kept per weight tensor while its version counter is unchanged (an optimizer step or
`load_state_dict` bumps it; `parameter_versions.py` for fused optimizers), so it is made once per evaluation, not
per call; it costs one more copy of the weight while the weight lives.

Not in training: there the weights change at every step, and packing them anew each step (and $W^\top$ for the
input's gradient) cost more than oneDNN saved (measured: `docs/performance.md`). Results differ from `F.linear`'s
by float rounding only (a sum in another order).
Where the ops are missing (a PyTorch built without oneDNN) or fail their first check, `F.linear` runs.
"""
import warnings
from typing import Optional

import torch
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary

from .parameter_versions import track_fused_optimizer_steps

# Per weight tensor (by identity): the version it was packed at and the packed weight; entries go with their weight
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


def _packed(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` packed by oneDNN, kept for `weight` and packed again only when the weight has changed in place."""
    entry = _kept.get(weight)
    if entry is None or entry[0] != weight._version:
        # The cache trusts version counters, which fused optimizer steps do not bump by themselves
        track_fused_optimizer_steps()
        # (`rows` only guides the choice of layout; the packed weight serves any number of rows)
        entry = _kept[weight] = (weight._version,
                                 torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows))
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
    packed = _packed(weight, rows)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]).contiguous(), packed, bias,
                                           'relu' if relu else 'none', [], '')
    return y.view(*x.shape[:-1], weight.shape[0])
