r"""
# The mechanisms one model carries, and what a segment reads of their states

`MemTransformerLM` builds every registered mechanism that is on (`BuiltMechanisms`) and, at each segment, reads their
states through `SegmentStates`: the rows each layer attends to before its segment, the rows placed around it, each
layer's second attention, and the next states with the auxiliary losses once the layers have run. The recurrence
itself (the layers, masks, positions, fast paths) stays in the model; what is of the mechanisms is here, the same for
every mechanism.
"""
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from . import registry
from .mechanism import AttentionBranch, MemoryMechanism, ModelSizes, Segment, State
from .state import StateLayout


def _held(rows: torch.Tensor) -> bool:
    """Whether `rows` holds rows (not empty, nor the original's empty `[0]`)."""
    return rows.dim() == 3 and rows.shape[0] > 0


class BuiltMechanisms:
    """
    Every registered mechanism that is on (its size above 0), or always built, each a module of `model` at its
    `attribute` (so a checkpoint's names are `compressed_memory.functions.0.conv.weight`); None at the attribute of one
    not built.

    Args:
        model: the module that owns them.
        sizes: the model's sizes.
        mem_len: the model's `mem_len`, the size of Transformer-XL's memory.
        settings: every mechanism's settings (`registry.with_defaults`).
    """

    def __init__(self, model: nn.Module, sizes: ModelSizes, mem_len: int, settings: Mapping[str, Any]):
        self.built: List[MemoryMechanism] = []
        for cls in registry.MEMORIES.values():
            size = mem_len if cls.size == 'mem_len' else settings[cls.size]
            if size > 0 or cls.always_built:
                mechanism = cls(sizes, {name: settings[name] for name in cls.settings})
                model.add_module(cls.attribute, mechanism)
                self.built.append(mechanism)
            else:
                setattr(model, cls.attribute, None)

    def on(self, mem_len: int) -> List[MemoryMechanism]:
        """The mechanisms the recurrence carries with `mem_len`, in the registry's order."""
        return [mechanism for mechanism in self.built if mechanism.is_on(mem_len)]

    def added_rows(self, mem_len: int) -> int:
        """The most rows the mechanisms on add to a layer's keys beyond the segment's tokens and Transformer-XL's
        memory: those they join before the memory and those they place around the segment."""
        return sum(mechanism.joined_length() + mechanism.placed_length() for mechanism in self.on(mem_len))

    def resets(self, memory_sizes: Mapping[str, Any], mem_len: int) -> Dict[MemoryMechanism, Dict[str, Any]]:
        """`memory_sizes` (given to `reset_length`, with its `mem_len`) by the built mechanism they change, each checked
        by its mechanism (`check_reset`); an exception naming one that no mechanism has, or whose mechanism is not built
        (a size of 0, its value there, is no change)."""
        known = registry.settings()
        unknown = sorted(set(memory_sizes) - set(known))
        if unknown:
            raise TypeError(f"reset_length got unexpected keyword arguments {unknown}: the memory mechanisms' "
                            f"settings are {', '.join(known)}")
        resets: Dict[MemoryMechanism, Dict[str, Any]] = {}
        for name, value in memory_sizes.items():
            cls = next(cls for cls in registry.MEMORIES.values() if name in cls.settings)
            mechanism = next((m for m in self.built if type(m) is cls), None)
            if mechanism is not None:
                resets.setdefault(mechanism, {})[name] = value
            elif not (name == cls.size and value == 0):
                raise ValueError(f"{name}={value!r} is not accepted by a model built with {cls.size}=0: "
                                 f"{cls.title} is not built (build it with {cls.size} > 0)")
        for mechanism in self.built:
            mechanism.check_reset(resets.get(mechanism, {}), mem_len)
        return resets


class SegmentStates:
    """
    The states one segment reads, by mechanism, from the flat list of the call (`state.py`).

    Args:
        on: the mechanisms on, in the registry's order.
        flat: the call's flat list of states, or None for a new stream (no state: nothing joined or placed but a
            mechanism's initial rows, nothing returned).
        xl_memory: Transformer-XL's memory mechanism, whose state is the layers' memory.
    """

    def __init__(self, on: Sequence[MemoryMechanism], flat: Optional[Sequence[torch.Tensor]],
                 xl_memory: MemoryMechanism):
        self.on, self.layout, self.xl_memory = list(on), StateLayout(on), xl_memory
        self.states: Dict[MemoryMechanism, State] = {} if flat is None else self.layout.unflatten(flat)
        # Transformer-XL's memories $m^{n-1}$, where it is on
        self.memories: Optional[List[torch.Tensor]] = self.states[xl_memory]['mem'] if xl_memory in self.states \
            else None

    @property
    def mlen(self) -> int:
        """The length of Transformer-XL's memory."""
        return self.memories[0].shape[0] if self.memories is not None and self.memories[0].dim() == 3 else 0

    def attended(self, n_layer: int) -> Optional[List[torch.Tensor]]:
        """Per layer, the rows it attends to before its segment, oldest first: the rows every mechanism but
        Transformer-XL's joins (in the registry's order), then Transformer-XL's memory; None where there are none."""
        attended = []
        for i in range(n_layer):
            parts = [mechanism.joined_rows(state, i) for mechanism, state in self.states.items()
                     if mechanism is not self.xl_memory]
            parts = [rows for rows in parts + [None if self.memories is None else self.memories[i]]
                     if rows is not None and _held(rows)]
            if not parts:
                return None
            attended.append(parts[0] if len(parts) == 1 else torch.cat(parts))
        return attended

    def first_layer_rows(self, embedded: torch.Tensor
                         ) -> Tuple[torch.Tensor, slice, Dict[MemoryMechanism, Tuple[slice, slice]]]:
        """The word embeddings `embedded` with the rows every mechanism places before and after them, in the registry's
        order (`embedded` itself where none does); the slice of its rows that are the segment's tokens, and each
        placing mechanism's slices (before, after)."""
        bsz, before, after, rows = embedded.shape[1], [], [], {}
        for mechanism, state in self.states.items():
            ahead, behind = mechanism.placed_rows(state, bsz, embedded)
            rows[mechanism] = (0 if ahead is None else ahead.shape[0], 0 if behind is None else behind.shape[0])
            before += [] if ahead is None else [ahead]
            after += [] if behind is None else [behind]
        if not before and not after:
            return embedded, slice(0, embedded.shape[0]), {}
        start = sum(r.shape[0] for r in before)
        tokens = slice(start, start + embedded.shape[0])
        placed, ahead_at, behind_at = {}, 0, tokens.stop
        for mechanism, (ahead, behind) in rows.items():
            if ahead or behind:
                placed[mechanism] = (slice(ahead_at, ahead_at + ahead), slice(behind_at, behind_at + behind))
            ahead_at, behind_at = ahead_at + ahead, behind_at + behind
        return torch.cat(before + [embedded] + after), tokens, placed

    def attention_branches(self, n_layer: int) -> List[Optional[AttentionBranch]]:
        """Each layer's second attention (`MemoryMechanism.attention_branch`), or None; at most one mechanism adds one
        to a layer."""
        branches = []
        for layer in range(n_layer):
            given = [branch for branch in (mechanism.attention_branch(state, layer)
                                           for mechanism, state in self.states.items()) if branch is not None]
            if len(given) > 1:
                raise ValueError(f"layer {layer} is given {len(given)} second attentions by the memory mechanisms: "
                                 f"at most one mechanism may add one to a layer")
            branches.append(given[0] if given else None)
        return branches

    def reads_keys_values(self) -> bool:
        """Whether a mechanism on reads the layers' keys and values of the segment."""
        return any(mechanism.reads_keys_values for mechanism in self.on)

    def evicted(self, evicted: int) -> int:
        """The rows of `[memory, segment]` that fall out of Transformer-XL's memory, where its own rule evicts
        `evicted`: more where a mechanism takes them in groups (the compressed memory, `compression_rate` at a
        time)."""
        for mechanism in self.on:
            evicted = mechanism.evicted_rows(evicted)
        return evicted

    def after(self, segment: Segment, losses: bool) -> Tuple[List[torch.Tensor], Dict[str, torch.Tensor]]:
        """The flat list of the next states, made from what the segment computed, and, with `losses`, every
        mechanism's auxiliary losses by name (else none)."""
        # $m^{n-1}_{\tau+1} = [m^{n-1}_\tau \circ h^{n-1}_{\tau+1}]_{[beg, end)}$, and each mechanism's next state
        new_states = {mechanism: mechanism.next_state(self.states[mechanism], segment) for mechanism in self.on}
        aux_losses = {}
        if losses:
            for mechanism in self.on:
                aux_losses.update(mechanism.aux_losses(self.states[mechanism], segment))
        return self.layout.flatten(new_states), aux_losses
