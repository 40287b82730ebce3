r"""
# Keys and values of the memory, kept from the segment before (no-grad evaluation)

A memory is the hidden states $m^{n-1}_\tau$ that layer $n$ read in the segment before, and that segment already
projected them: $[W_k; W_v]\,[m^{n-1}_{\tau-1} \circ h^{n-1}_\tau]$ is part of its attention. The memory handed to
the next segment is a slice `[beg:end]` of that same sequence, so its keys and values are the same slice of what
was computed. Keeping them saves projecting the whole memory again at every segment: with one-token steps
(generation) that is the difference between $O(L\,d^2)$ and $O(d^2 + L\,d)$ work per token for a memory of $L$.

Only where that is exact: evaluation without gradients, on the fast path, for the attention types whose memory is
projected as is (0 and 1; types 2 and 3 add positions that move with the window). An entry is used only for the
very tensor it was made with (held, so its identity stays meaningful) and while the layer's parameters are
unchanged (same tensors, same version counters: an optimizer step or `load_state_dict` bumps them).
"""
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..parameter_versions import track_fused_optimizer_steps

# The caches here trust parameter versions, which fused optimizer steps do not bump by themselves
track_fused_optimizer_steps()


def _parameter_versions(module: nn.Module) -> List[Tuple[torch.Tensor, int]]:
    return [(p, p._version) for p in module.parameters()]


def _unchanged(saved: List[Tuple[torch.Tensor, int]], module: nn.Module) -> bool:
    current = list(module.parameters())
    return len(saved) == len(current) and all(p is q and v == q._version for (p, v), q in zip(saved, current))


def kept_rows(kv_memory: Optional[torch.Tensor], kv_segment: torch.Tensor, beg: int, end: int) -> torch.Tensor:
    """Positions `[beg, end)` of the keys and values of memory (or None) and segment, `[2, bsz, n_head, len,
    d_head]` each: a view of the segment's when they all lie in it (as when `mem_len <= tgt_len`), else a slice of
    the two joined."""
    mlen = 0 if kv_memory is None else kv_memory.shape[3]
    if beg >= mlen:
        return kv_segment[:, :, :, beg - mlen:end - mlen]
    return torch.cat([kv_memory, kv_segment], dim=3)[:, :, :, beg:end]


class KeyValueMemo:
    """Per layer: the memory tensor, its keys and values `[2, bsz, n_head, mlen, d_head]`, the layer's parameters."""

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

    def store(self, layer: int, mems: torch.Tensor, kv: torch.Tensor, attn: nn.Module) -> None:
        """Keep `kv`, the keys and values of the memory tensor `mems` the next segment will be given."""
        self.entries[layer] = (mems, kv, _parameter_versions(attn))
