r"""
# A value kept across calls, where the call may keep it

Some values a module computes depend only on shapes (sinusoids of distances) or on parameters and shapes (the
projected relative table $W_{k,R} R$): computed once, they serve every later call with the same inputs. Whether a call
may keep one is its plan's (`dispatch.Plan`): values of shapes outside `torch.compile` (which folds them) and the
reference (which recomputes, as the original); values of parameters also only without gradients (nothing to
differentiate through a kept value). A module holds a `KeptValue` and asks it, with the tensors and numbers the value
is made of; it never tests the run's state itself.
"""
from typing import Callable, Generic, Optional, Tuple, TypeVar

import torch

from .dispatch import Plan
from .parameter_versions import track_fused_optimizer_steps

T = TypeVar('T')


def last_rows_of(view: torch.Tensor) -> Optional[torch.Tensor]:
    """The tensor whose last rows `view` is (a slice `[n - k:]` of the first axis of the tensor it views, as
    `xl.memory.ModelMemory.last_rows` gives), or None. A value computed row by row from that whole tensor, kept,
    serves `view` with its last `k` rows."""
    whole = view._base
    if whole is None or whole.shape[1:] != view.shape[1:] or whole.stride() != view.stride():
        return None
    skipped = whole.shape[0] - view.shape[0]
    return whole if view.storage_offset() == whole.storage_offset() + skipped * whole.stride(0) else None


def _same_source(kept, given) -> bool:
    if isinstance(given, torch.Tensor):
        # The same tensor, not changed in place since
        return kept[0] is given and kept[1] == given._version
    return kept == given


class KeptValue(Generic[T]):
    """
    The last value made, with what it was made of.

    Args:
        of_parameters: the value is made from parameters (kept where `Plan.keeps_caches`), else from shapes alone
            (kept where `Plan.keeps_shapes`).
    """

    def __init__(self, of_parameters: bool):
        self.of_parameters = of_parameters
        self._kept: Optional[Tuple[tuple, T]] = None

    def get(self, plan: Plan, make: Callable[[], T], *sources) -> T:
        """`make()`, or the value kept from a call with the same `sources` (tensors by identity and version, other
        values by equality) where the plan keeps such values."""
        if not (plan.keeps_caches if self.of_parameters else plan.keeps_shapes):
            self._kept = None
            return make()
        if self._kept is None or len(self._kept[0]) != len(sources) or not all(
                _same_source(kept, given) for kept, given in zip(self._kept[0], sources)):
            if self.of_parameters:
                # The kept value trusts version counters, which fused optimizer steps do not bump by themselves
                track_fused_optimizer_steps()
            key = tuple((s, s._version) if isinstance(s, torch.Tensor) else s for s in sources)
            self._kept = (key, make())
        return self._kept[1]
