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
parameters are unchanged (same tensors, same version counters: an optimizer step or `load_state_dict` bumps them).
"""
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..parameter_versions import track_fused_optimizer_steps


def _parameter_versions(module: nn.Module) -> List[Tuple[torch.Tensor, int]]:
    return [(p, p._version) for p in module.parameters()]


def _unchanged(saved: List[Tuple[torch.Tensor, int]], module: nn.Module) -> bool:
    current = list(module.parameters())
    return len(saved) == len(current) and all(p is q and v == q._version for (p, v), q in zip(saved, current))


class _AppendBuffer:
    """Keys and values `[2, bsz, n_head, capacity, d_head]` of which rows `[start, start + length)` are the kept
    window; rows after it are free for the next segment's."""

    def __init__(self, like: torch.Tensor, capacity: int):
        self.data = like.new_empty(like.shape[:3] + (capacity, like.shape[4]))
        self.start, self.length = 0, 0

    @property
    def window(self) -> torch.Tensor:
        return self.data[:, :, :, self.start:self.start + self.length]


class KeyValueMemo:
    r"""
    Per layer: the memory tensor, its keys and values `[2, bsz, n_head, mlen, d_head]`, the layer's parameters.

    The next memory is the rows `[beg, end)` of `[memory, segment]`. When they all lie in the segment (as when
    `mem_len <= tgt_len`) the kept keys and values are a view of the segment's. Otherwise they are kept in an
    append buffer with room for `max(qlen, window / 4)` more rows: the next segment writes only its own rows after
    the window, and the window moves on; when the room runs out, the window is copied to the front of a new buffer.
    A one-token step then copies one row per layer (and the window every `window / 4` steps), where joining the
    memory's keys with the new ones copied the whole window every step. The buffer is written only after the
    window that `lookup` handed out, and a window is handed out only for the memory tensor it was kept with, so
    no view in use is ever overwritten.
    """

    def __init__(self):
        self.entries: Dict[int, tuple] = {}

    def clear(self) -> None:
        self.entries = {}

    def lookup(self, layer: int, mems: Optional[torch.Tensor], attn: nn.Module) -> Optional[torch.Tensor]:
        """The keys and values of `mems` for `attn`, or None when they were not kept or may be stale."""
        entry = self.entries.get(layer)
        if entry is None or mems is None or entry[0] is not mems or not _unchanged(entry[2], attn):
            return None
        return entry[1]

    def store(self, layer: int, mems: torch.Tensor, kv_memory: Optional[torch.Tensor], kv_segment: torch.Tensor,
              beg: int, end: int, attn: nn.Module) -> None:
        """Keep the keys and values of the memory tensor `mems` the next segment will be given: rows `[beg, end)`
        of those of the memory (`kv_memory`, None without one) followed by the segment's (`kv_segment`)."""
        # The entries trust version counters, which fused optimizer steps do not bump by themselves
        track_fused_optimizer_steps()
        mlen = 0 if kv_memory is None else kv_memory.shape[3]
        entry = self.entries.get(layer)
        buffer = None
        if beg >= mlen:
            # All in the segment: a view
            kept = kv_segment[:, :, :, beg - mlen:end - mlen]
        else:
            new_rows = kv_segment[:, :, :, :end - mlen]
            buffer = entry[3] if entry is not None and entry[1] is kv_memory else None
            if buffer is not None and buffer.start + end <= buffer.data.shape[3]:
                # The memory is this buffer's window: append after it, and move the window on
                buffer.data[:, :, :, buffer.start + mlen:buffer.start + end].copy_(new_rows)
                buffer.start, buffer.length = buffer.start + beg, end - beg
            else:
                # A new buffer, the kept rows of the memory at its front
                length = end - beg
                fresh = _AppendBuffer(kv_segment, length + max(kv_segment.shape[3], length // 4))
                fresh.data[:, :, :, :mlen - beg].copy_(kv_memory[:, :, :, beg:])
                fresh.data[:, :, :, mlen - beg:length].copy_(new_rows)
                fresh.length = length
                buffer = fresh
            kept = buffer.window
        self.entries[layer] = (mems, kept, _parameter_versions(attn), buffer)
