r"""
# What a model keeps between calls, beside the memories it returns

Transformer-XL's recurrence needs only the memories: `model(data, target, *mems)` returns the next ones,
$m^{n}_{\tau+1} = [m^{n}_\tau \circ h^{n}_{\tau+1}]_{[beg, end)}$. Evaluation keeps more, each derived from what a
call computed and each exact:

* the positions and masks of each segment shape (`shaped`, `last_rows`), which depend on shapes only;
* the keys and values of each memory, projected by the segment before (`kv_memo.py`);
* the append buffers whose windows are the returned memories (`append_buffer.py`), so a step writes only its rows;
* what the decoder-layer kernel reads of each layer (`fused_step.LayerParts`).

`ModelMemory` holds them all, so the model handles one object, and forgets them all at once (`clear`). Whether a call
may keep a value is its plan's: `dispatch.Plan.keeps_shapes` and `keeps_caches`.
"""
from typing import Callable, Dict, List, Optional, Sequence, TypeVar

import torch
from torch import nn

from ..fast.dispatch import Plan
from .append_buffer import AppendBuffer, joined_rows, keep_rows
from .attention import KeysValues
from .fused_step import LayerParts
from .kv_memo import KeyValueMemo

T = TypeVar('T')
# The most values of shapes, and of tables, one memory keeps before it starts afresh
MOST_KEPT = 16


def held_rows(memory: torch.Tensor) -> Optional[torch.Tensor]:
    """`memory`, or None where it holds no rows (empty, or the original's empty `[0]`)."""
    return memory if memory.dim() == 3 and memory.shape[0] > 0 else None


class ModelMemory:
    """The caches of one `MemTransformerLM` (see the module docstring)."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        """Forget everything kept: after a change of lengths, dtype or device, or of `impl`."""
        # Positions and masks by shape, dtype and device
        self.shapes: Dict[tuple, torch.Tensor] = {}
        # Tables that serve every length up to their own (`last_rows`), by dtype, device and what they depend on
        self.tables: Dict[tuple, torch.Tensor] = {}
        self.keys_values = KeyValueMemo()
        # Per layer input, the buffer whose window is the memory last returned
        self.buffers: Dict[int, Optional[AppendBuffer]] = {}
        # Per layer, what the decoder-layer kernel reads of it
        self.parts: Dict[int, LayerParts] = {}

    def shaped(self, plan: Plan, key: tuple, make: Callable[[], T]) -> T:
        """`make()`, kept under `key` where the plan keeps values of shapes (not while `torch.compile` traces: it
        folds constants)."""
        if not plan.keeps_shapes:
            return make()
        value = self.shapes.get(key)
        if value is None:
            if len(self.shapes) >= MOST_KEPT:
                self.shapes = {}
            value = self.shapes[key] = make()
        return value

    def last_rows(self, plan: Plan, key: tuple, rows: int, longest: int, make: Callable[[int], torch.Tensor]
                  ) -> torch.Tensor:
        """The last `rows` rows of the table kept under `key`, for tables whose last rows are the table of fewer rows
        (the distances `n - 1 .. 0`): made by `make(n)` with `n = max(rows, longest)` where the kept one is shorter,
        so one table serves every length up to `longest`, and what is derived from it row by row can be kept once
        (`fast.kept.last_rows_of`). Not kept where the plan keeps no values of shapes: `make(rows)`."""
        if not plan.keeps_shapes:
            return make(rows)
        table = self.tables.get(key)
        if table is None or table.shape[0] < rows:
            if len(self.tables) >= MOST_KEPT:
                # (a table whose key is gone, as the frequencies loaded since, is never read again)
                self.tables = {}
            table = make(max(rows, longest))
            # A tensor of its own, not a view, so that its slices are seen as its rows (`last_rows_of`)
            table = self.tables[key] = table if table._base is None else table.clone()
        return table[table.shape[0] - rows:]

    def layer_parts(self, layers: nn.ModuleList) -> Sequence[LayerParts]:
        """What the decoder-layer kernel would read of each layer, gathered (again, where a layer changed) only when
        an item is read: the dispatcher reads them only where nothing of the call refuses the kernel first (not in
        training, not under `torch.compile`, which would guard on the parameters' versions)."""
        return _LayerPartsOf(self.parts, layers)

    def keeps_keys_values(self, plan: Plan, exact: bool) -> bool:
        """Whether this call keeps the keys and values of its memories for the next one: where keeping them is exact
        (`exact`: the memory is projected as it is, not with positions added) and the plan keeps values of
        parameters. Where it does not, those kept before are forgotten."""
        keep = exact and plan.keeps_caches
        if not keep:
            self.keys_values.clear()
        return keep

    def kept_keys_values(self, layers: nn.ModuleList, mems: Optional[Sequence[torch.Tensor]]
                         ) -> List[Optional[torch.Tensor]]:
        """Per layer, the keys and values of its memory `[2, bsz, n_head, mlen, d_head]` where the step before kept
        them and they are not stale, else None."""
        if mems is None:
            return [None] * len(layers)
        return [self.keys_values.lookup(i, mems[i], layer.dec_attn) for i, layer in enumerate(layers)]

    def next_memories(self, plan: Plan, hids: Sequence[torch.Tensor], mems: Optional[Sequence[torch.Tensor]],
                      keys_values: Sequence[KeysValues], layers: nn.ModuleList, beg: int,
                      end: int) -> List[torch.Tensor]:
        """
        The memories for the next segment: rows `[beg, end)` of `[memory, segment]` of every layer input, detached;
        and, with `keys_values` (the layers' `KeysValues`, empty when they are not kept), the same rows of each
        layer's keys and values, kept for the next segment.

        In no-grad evaluation (where the plan keeps caches) memories that keep rows of the memory before are windows
        of append buffers: each segment writes only its own rows, and no returned memory is changed later.
        """
        if not plan.keeps_caches:
            self.buffers = {}
        new_mems = []
        with torch.no_grad():
            for i, (m, h) in enumerate(zip(mems, hids)):
                m = held_rows(m)
                if not plan.keeps_caches:
                    # (every segment's memories are new: no buffer with room to append to)
                    new_mems.append(joined_rows(m, h, beg, end, dim=0).detach())
                    continue
                kept, self.buffers[i] = keep_rows(self.buffers.get(i), m, h, beg, end, dim=0)
                # (a buffer's window holds no graph, and keeps its identity: the next segment appends to it)
                new_mems.append(kept if self.buffers[i] is not None else kept.detach())
        for i, kv in enumerate(keys_values):
            # The same rows of the keys and values as of the states: `[2, bsz, n_head, beg:end, d_head]`
            self.keys_values.store(i, new_mems[i], kv.memory, kv.segment, beg, end, layers[i].dec_attn)
        return new_mems


class _LayerPartsOf(Sequence):
    """`ModelMemory.layer_parts`: each layer's `LayerParts`, from the memory's where the layer did not change, checked
    once per call."""

    def __init__(self, kept: Dict[int, LayerParts], layers: nn.ModuleList):
        self.kept, self.layers = kept, layers
        self.read: List[Optional[LayerParts]] = [None] * len(layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerParts:
        parts = self.read[i]
        if parts is None:
            layer, parts = self.layers[i], self.kept.get(i)
            if parts is None or not parts.of_layer(layer):
                parts = self.kept[i] = LayerParts.of(layer)
            self.read[i] = parts
        return parts
