"""
# The states of the mechanisms as one flat list

`model(data, target, *mems)`, the original's calling convention, takes and returns every state as one list of
tensors: each mechanism that is on, in the registry's order; each of its state names in its `state_layout`'s order;
one tensor per layer that keeps it. With Transformer-XL's memory alone that is the original's `n_layer + 1` memories;
with the compressed memory its `n_layer` compressed memories follow. `StateLayout` turns one form into the other and
checks a list given by a caller, naming the tensor by its place (`mems[i]`) and what it should have been.
"""
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from .mechanism import MemoryMechanism, State


class StateLayout:
    """
    Where each mechanism's state lies in the flat list of memories.

    Args:
        mechanisms: the mechanisms that are on, in the registry's order.
    """

    def __init__(self, mechanisms: Sequence[MemoryMechanism]):
        # (mechanism, state name, first index, count) of every state
        self.slots: List[Tuple[MemoryMechanism, str, int, int]] = []
        first = 0
        for mechanism in mechanisms:
            for name, count in mechanism.state_layout().items():
                self.slots.append((mechanism, name, first, count))
                first += count
        self.length = first

    def flatten(self, states: Dict[MemoryMechanism, State]) -> List[torch.Tensor]:
        """Every tensor of `states`, in the flat list's order."""
        return [tensor for mechanism, name, _, _ in self.slots for tensor in states[mechanism][name]]

    def unflatten(self, flat: Sequence[torch.Tensor]) -> Dict[MemoryMechanism, State]:
        """Each mechanism's state from the flat list."""
        states: Dict[MemoryMechanism, State] = {}
        for mechanism, name, first, count in self.slots:
            states.setdefault(mechanism, {})[name] = list(flat[first:first + count])
        return states

    def initial(self, bsz: Optional[int], like: torch.Tensor) -> List[torch.Tensor]:
        """The flat list of a new stream (`MemoryMechanism.init_state`)."""
        return self.flatten({mechanism: mechanism.init_state(bsz, like) for mechanism, _, _, _ in self.slots})

    def check(self, flat: Sequence, bsz: int, weight: torch.Tensor, dtypes: Set[torch.dtype]) -> None:
        """
        An exception naming what is wrong with the flat list `flat` given for a batch of `bsz` (its tensors of one of
        `dtypes`, on the device of the model's parameter `weight`): its length, a tensor's type, dtype, device,
        features or batch size, or lengths that differ within one state.
        """
        if len(flat) != self.length:
            expected = ', then '.join(mechanism.describe_state(name) for mechanism, name, _, _ in self.slots)
            expected = (f"expected {expected}, as returned by the previous segment, or none" if self.slots else
                        "this model keeps no memory now (mem_len=0 and no memory mechanism on): expected none")
            raise ValueError(f"{len(flat)} memories are not accepted: {expected}")
        for mechanism, name, first, count in self.slots:
            features = mechanism.state_features(name)
            shape = f"[length, {bsz}, {', '.join(map(str, features))}]"
            length = None
            for i in range(first, first + count):
                rows = _checked_rows(i, flat[i], features, shape, bsz, weight, dtypes)
                if length is None:
                    length = rows
                elif rows != length:
                    raise ValueError(f"mems[{i}] has length {rows} but mems[{first}] has {length}: all "
                                     f"{mechanism.state_title(name)} must have the same length")


def _checked_rows(i: int, m, features: Tuple[int, ...], shape: str, bsz: int, weight: torch.Tensor,
                  dtypes: Set[torch.dtype]) -> int:
    """The rows of `m`, the flat list's `mems[i]`, or an exception naming what is wrong with it."""
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"mems[{i}] must be a tensor {shape}, got {type(m).__name__}")
    if m.dtype not in dtypes or m.device != weight.device:
        accepted = ' or '.join(sorted(str(d) for d in dtypes))
        raise TypeError(f"mems[{i}] is a {m.dtype} tensor on {m.device}, but the model's parameters are "
                        f"{weight.dtype} on {weight.device}: memories are states of this model (as it returns "
                        f"them), so they must be {accepted} on {weight.device}")
    if m.dim() == 1 and m.numel() == 0:
        # The original's empty memory, `[0]`
        return 0
    if m.dim() != 2 + len(features) or tuple(m.shape[2:]) != features:
        raise ValueError(f"mems[{i}] of shape {list(m.shape)} is not accepted: expected {shape} "
                         f"({_features_named(features)})")
    if m.shape[1] != bsz:
        raise ValueError(f"mems[{i}] has batch size {m.shape[1]} but data has batch size {bsz}: memories must come "
                         f"from a batch of the same size; accepted: {shape}, or no memories (a new stream)")
    return m.shape[0]


def _features_named(features: Tuple[int, ...]) -> str:
    return f"d_model={features[0]}" if len(features) == 1 else f"features {list(features)}"
