r"""
# Parameter version counters after fused optimizer steps

Every in-place change of a tensor bumps its version counter (`tensor._version`), and this package's caches of
values derived from parameters trust it: the keys and values kept for a memory (`xl/kv_memo.py`), the projected
relative table (`fast.kept.KeptValue`) and the prepacked weights
(`prepacked_linear.py`) are used only while the parameters' versions are those they were made at.

PyTorch's fused optimizers (`Adam(fused=True)`, `AdamW(fused=True)`, `SGD(fused=True)`, which the trainer's
`fused_adam` uses) write the parameters in one kernel that does **not** bump their version counters. Without
the hook below, a cache made before such a step would still be taken for valid after it, and a model would go on
computing with weights it no longer has. `track_fused_optimizer_steps()` registers, once per process, a hook for
every optimizer that bumps the versions of the parameters of fused parameter groups after each step
(`torch.autograd.graph.increment_version`, PyTorch's API for writes it cannot see). It is called by the code that
makes such a cache, when it makes one: importing the package registers nothing, and a process that never
evaluates on these paths never gets the hook.

Writes through `tensor.data` do not bump versions either (that is what `.data` is for); after such writes, call
`torch.autograd.graph.increment_version` on the parameters, as the hook does.

A `ParameterSnapshot` records a module tree's parameters and their versions once, and tells later whether they are
still the same tensors at the same versions without walking the tree again through `nn.Module.parameters()` (a
generator over `named_modules`, which a one-token step would otherwise pay per layer).
"""
import operator
from itertools import chain
from typing import List

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook


_registered = False


def _bump_fused_parameter_versions(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    params = [p for group in optimizer.param_groups if group.get('fused') for p in group['params']]
    if params:
        torch.autograd.graph.increment_version(params)


def track_fused_optimizer_steps() -> None:
    """Register the hook (once)."""
    global _registered
    if not _registered:
        register_optimizer_step_post_hook(_bump_fused_parameter_versions)
        _registered = True


class ParameterSnapshot:
    """
    The parameters of `module` and of every module under it, as they are now: each module's own parameter and
    submodule slots (a parameter or submodule replaced, added or removed is a change) and each parameter's version
    (a change in place).

    Args:
        module: the root of the tree.
    """

    def __init__(self, module: nn.Module):
        modules = list(module.modules())
        # Every module's parameter and submodule slot dictionaries, how many slots each has and what they all hold,
        # in order (held here, so that no new object takes one of their identities while the snapshot lives)
        self.slots: List[dict] = [slots for m in modules for slots in (m._parameters, m._modules)]
        self.sizes: List[int] = list(map(len, self.slots))
        self.held: List[object] = list(chain.from_iterable(slots.values() for slots in self.slots))
        self.parameters: List[torch.Tensor] = list(module.parameters())
        self.versions: List[int] = [p._version for p in self.parameters]

    def unchanged(self) -> bool:
        """Whether every slot holds what it held and every parameter is at the version it was at."""
        # (one pass over all slots in order, by identity: a one-token step asks this of every layer)
        return (list(map(len, self.slots)) == self.sizes
                and all(map(operator.is_, chain.from_iterable(slots.values() for slots in self.slots), self.held))
                and [p._version for p in self.parameters] == self.versions)
