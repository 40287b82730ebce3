r"""
# Keys and values of the memory, kept from the segment before (no-grad evaluation)

A memory is the hidden states $m^{n-1}_\tau$ that layer $n$ read in the segment before, and that segment already
projected them: $[W_k; W_v]\,[m^{n-1}_{\tau-1} \circ h^{n-1}_\tau]$ is part of its attention. The memory handed to
the next segment is a slice `[beg:end]` of that same sequence, so its keys and values are the same slice of what
was computed. Keeping them saves projecting the whole memory again at every segment: with one-token steps
(generation) that is the difference between $O(L\,d^2)$ and $O(d^2 + L\,d)$ work per token for a memory of $L$.

Only where that is exact: evaluation without gradients (where `dispatch.Plan.keeps_caches`), for the attention
types whose memory is projected as is (all but 2 and 3, which add positions that move with the window). An entry
is used only for the very tensor it was made with (held, so its identity stays meaningful) and while the layer's
parameters are unchanged (same tensors, same version counters: an optimizer step or `load_state_dict` bumps them;
`parameter_versions.ParameterSnapshot`).
"""
from typing import Dict, NamedTuple, Optional

import torch
from torch import nn

from ..fast.parameter_versions import ParameterSnapshot, track_fused_optimizer_steps
from .append_buffer import AppendBuffer, keep_rows


class _Entry(NamedTuple):
    # The memory tensor the keys and values are of
    mems: torch.Tensor
    # Its keys and values `[2, bsz, n_head, mlen, d_head]`
    kept: torch.Tensor
    # The attention's parameters when they were computed
    parameters: ParameterSnapshot
    # The buffer `kept` is the window of (None for a view of a segment's)
    buffer: Optional[AppendBuffer]


class KeyValueMemo:
    r"""
    Per layer: the memory tensor, its keys and values `[2, bsz, n_head, mlen, d_head]`, the layer's parameters.

    The next memory is the rows `[beg, end)` of `[memory, segment]`, and so are its keys and values
    (`append_buffer.keep_rows`): a view of the segment's when they all lie in it (as when `mem_len <= tgt_len`),
    else the window of an append buffer to which each segment adds only its own rows. A one-token step then copies
    one row per layer (and the window every `window / 4` steps), where joining the memory's keys with the new ones
    copied the whole window every step.
    """

    def __init__(self):
        self.entries: Dict[int, _Entry] = {}

    def clear(self) -> None:
        self.entries = {}

    def lookup(self, layer: int, mems: Optional[torch.Tensor], attn: nn.Module) -> Optional[torch.Tensor]:
        """The keys and values of `mems` for `attn`, or None when they were not kept or may be stale."""
        entry = self.entries.get(layer)
        if entry is None or mems is None or entry.mems is not mems or not entry.parameters.unchanged():
            return None
        return entry.kept

    def store(self, layer: int, mems: torch.Tensor, kv_memory: Optional[torch.Tensor], kv_segment: torch.Tensor,
              beg: int, end: int, attn: nn.Module) -> None:
        """Keep the keys and values of the memory tensor `mems` the next segment will be given: rows `[beg, end)`
        of those of the memory (`kv_memory`, None without one) followed by the segment's (`kv_segment`)."""
        entry = self.entries.get(layer)
        # The keys and values of the memory were the kept ones (so the parameters were checked by `lookup` in this
        # step), or were computed in it: either way with the parameters as they are
        if entry is not None and entry.kept is kv_memory:
            parameters, buffer = entry.parameters, entry.buffer
        else:
            # The entries trust version counters, which fused optimizer steps do not bump by themselves
            track_fused_optimizer_steps()
            parameters, buffer = ParameterSnapshot(attn), None
        kept, buffer = keep_rows(buffer, kv_memory, kv_segment, beg, end, dim=3)
        self.entries[layer] = _Entry(mems, kept, parameters, buffer)
