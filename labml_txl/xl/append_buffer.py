r"""
# A window of rows that moves on without being copied at every step

A memory is the last rows of `[memory, segment]`: after a segment of `qlen` inputs the rows `[beg, end)` of the
concatenation are kept (`MemTransformerLM._mem_bounds`). Joining the two copies the whole window at every
segment: with one-token steps (generation) that is `mem_len` rows per layer for one new row.

An `AppendBuffer` holds the window in a larger tensor with free rows after it. When the memory handed in is the
buffer's current window, the segment's rows are written after it and the window moves on to `[beg, end)`, a view:
one row written per layer and step instead of the window. When the room runs out, the window is copied to the
front of a new buffer (with `room` free rows after it), so a window of $L$ rows costs $L / \mathit{room}$ copied
rows per step.

Every row of a buffer is written once, at or after the end of its current window: a window handed out (a
returned memory, kept keys and values) is never changed afterwards, whoever holds it. A memory that is not the
buffer's current window (an older one, a branch taken twice from the same memory) starts a new buffer. The writes
go through `.data`, which does not bump the version counter the views share with the buffer: they touch no row of
any view handed out, so autograd, which checks the counter of the tensors it saved (a memory that a training step
read), has nothing to object to.
"""
from typing import Optional, Tuple

import torch


class AppendBuffer:
    """
    Rows along axis `dim` of `tensor`, of which `[start, fill)` are the current window and the rows from `fill` on
    are free.

    Args:
        like: a tensor of the dtype, device and shape (but along `dim`) of the rows.
        dim: the axis of the rows.
        capacity: how many rows the buffer holds.
    """

    def __init__(self, like: torch.Tensor, dim: int, capacity: int):
        shape = list(like.shape)
        shape[dim] = capacity
        self.tensor = like.new_empty(shape)
        self.dim = dim
        self.start, self.fill = 0, 0
        # The view of the current window handed out (by identity: only it may be appended to)
        self.window: Optional[torch.Tensor] = None

    def _rows(self, begin: int, end: int) -> torch.Tensor:
        return self.tensor.narrow(self.dim, begin, end - begin)

    def _write(self, at: int, rows: torch.Tensor) -> None:
        # (through `.data`: see the module docstring)
        self.tensor.data.narrow(self.dim, at, rows.shape[self.dim]).copy_(rows)

    def _move_window(self, start: int, fill: int) -> torch.Tensor:
        self.start, self.fill = start, fill
        self.window = self._rows(start, fill)
        return self.window

    def appends_to(self, memory: torch.Tensor, segment: torch.Tensor, n_rows: int) -> bool:
        """Whether `n_rows` rows of `segment` may be written after `memory`: it is this buffer's current window, the
        rows fit, and the segment is of the buffer's dtype and device (and inference mode, which a write outside
        it may not change)."""
        return (memory is self.window and self.fill + n_rows <= self.tensor.shape[self.dim]
                and segment.dtype == self.tensor.dtype and segment.device == self.tensor.device
                and self.tensor.is_inference() == torch.is_inference_mode_enabled())

    def append(self, segment: torch.Tensor, beg: int, end: int) -> torch.Tensor:
        """After the window (the memory, `mlen` rows), the rows of `segment` up to `end - mlen` (at least one); the
        window becomes rows `[beg, end)` of the two, returned (a view)."""
        mlen = self.fill - self.start
        new_rows = segment.narrow(self.dim, 0, end - mlen)
        self._write(self.fill, new_rows)
        return self._move_window(self.start + beg, self.fill + new_rows.shape[self.dim])


def joined_rows(memory: Optional[torch.Tensor], segment: torch.Tensor, beg: int, end: int, dim: int) -> torch.Tensor:
    """Rows `[beg, end)` along `dim` of `[memory, segment]` (no `memory`: of the segment), as the original takes them:
    a view of `segment` when they all lie in it, else `cat([memory[beg:], segment[:end - mlen]])`, its slicing
    included (no row of the segment when `end < mlen`, as with `ext_len > qlen`)."""
    mlen = 0 if memory is None else memory.shape[dim]
    if beg >= mlen:
        # All in the segment (as when `mem_len <= tgt_len`): a view, no copy
        return segment.narrow(dim, beg - mlen, end - beg)
    rows = (slice(None),) * dim + (slice(None, end - mlen),)
    return torch.cat([memory.narrow(dim, beg, mlen - beg), segment[rows]], dim)


def keep_rows(buffer: Optional[AppendBuffer], memory: Optional[torch.Tensor], segment: torch.Tensor, beg: int,
              end: int, dim: int) -> Tuple[torch.Tensor, Optional[AppendBuffer]]:
    """
    `joined_rows`, and the buffer that holds them (None where none does): where they keep rows of both `memory` and
    `segment`, written after `memory` where it is the current window of `buffer`, else into a new buffer with room
    for `max(qlen, (end - beg) // 4)` more rows.
    """
    mlen = 0 if memory is None else memory.shape[dim]
    new_rows = end - mlen
    if beg >= mlen or new_rows <= 0 or memory.dtype != segment.dtype or memory.device != segment.device:
        # All in the segment (a view), no row of the segment kept, or two dtypes (which `cat` promotes)
        return joined_rows(memory, segment, beg, end, dim), None
    if buffer is not None and buffer.appends_to(memory, segment, new_rows):
        return buffer.append(segment, beg, end), buffer
    # A new buffer, the kept rows of the memory at its front, then the segment's
    length = end - beg
    fresh = AppendBuffer(segment, dim, length + max(segment.shape[dim], length // 4))
    fresh._write(0, memory.narrow(dim, beg, mlen - beg))
    fresh._write(mlen - beg, segment.narrow(dim, 0, new_rows))
    return fresh._move_window(0, length), fresh
