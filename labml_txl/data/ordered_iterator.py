r"""
# Ordered iterator

Transformer-XL trains on one long token stream, read in order so that each segment continues the previous one
and the memory of the last segment is its real context. `LMOrderedIterator` (the original's name) cuts the stream
into `bsz` equal columns, dropping the tail that does not fill a column: column $j$ holds tokens
$[j n, (j + 1) n)$ where $n = \lfloor N / bsz \rfloor$. It then walks down the columns `bptt` rows at a time:
the batch at row $i$ has inputs rows $[i - ext\_len, i + seq\_len)$ (fewer at the start) and targets rows
$[i + 1, i + 1 + seq\_len)$, the next token of each of the last `seq_len` inputs.

Every target row from 1 to $n - 1$ is produced exactly once per pass, in order, by the fixed-length iterator and by
the variable-length one. The variable-length iterator draws each segment length as the original:
`bptt` with probability 0.95 and `bptt / 2` otherwise, then a normal sample around it with standard deviation
`std`, truncated to an integer and clamped to `[min_len, bptt + max_deviation * std]`. The draws come from a
`torch.Generator`, so a run is repeatable. (The original stops when fewer than two rows remain, so its last
target row is sometimes never used; here the pass always runs to the end.)

The iterator remembers the row where its next batch starts (`position`), so training can stop and resume exactly:
save `state_dict()` (the position and, when there is one, the generator's state) and `load_state_dict` it into a
new iterator over the same data.
"""
from typing import Iterator, Optional, Tuple, Union

import torch

from ..errors import require_positive_int

Batch = Tuple[torch.Tensor, torch.Tensor, int]


class LMOrderedIterator:
    """
    Segments of a token stream cut into `bsz` columns, in order.

    Args:
        data: the token ids, a 1-D integer tensor
        bsz: the number of columns (batch size)
        bptt: the segment length (number of target rows per batch)
        device: where batches are placed
        ext_len: extra context: inputs start up to this many rows before the targets' rows
        generator: the random source of `get_varlen_iter`; `None` makes one from `seed`, or uses torch's global one
        seed: seed of a new generator (give `generator` or `seed`, not both)

    Shape:
        - data, target: `[seq_len + ext, bsz]` and `[seq_len, bsz]`, `ext <= ext_len` (fewer rows at the start)

    Iterating yields `(data, target, seq_len)`; `data[-seq_len:]` are the inputs whose next tokens are `target`.
    """

    def __init__(self, data: torch.Tensor, bsz: int, bptt: int, device: Union[str, torch.device] = 'cpu',
                 ext_len: Optional[int] = 0, generator: Optional[torch.Generator] = None,
                 seed: Optional[int] = None):
        if not isinstance(data, torch.Tensor) or data.dim() != 1 or data.is_floating_point() or data.is_complex():
            shape = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
            raise ValueError(f"data={shape} is not accepted: data must be a 1-D integer tensor of token ids")
        require_positive_int('bsz', bsz)
        require_positive_int('bptt', bptt)
        ext_len = 0 if ext_len is None else ext_len
        require_positive_int('ext_len', ext_len, allow_zero=True)
        if generator is not None and seed is not None:
            raise ValueError("give generator or seed, not both: seed makes a new generator")
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
        self.bsz, self.bptt, self.ext_len, self.device = bsz, bptt, ext_len, device
        self.generator = generator
        # Tokens per column; the remainder that does not fill a column is dropped
        self.n_step = data.numel() // bsz
        if self.n_step < 2:
            raise ValueError(f"data has {data.numel()} tokens, too few for bsz={bsz}: each of the bsz columns needs "
                             f"at least 2 tokens (an input and its target), so at least {2 * bsz} tokens")
        # Column j is data[j * n_step:(j + 1) * n_step]
        self.data = data[:self.n_step * bsz].view(bsz, self.n_step).t().contiguous().to(torch.long).to(device)
        # Number of batches of the fixed-length pass
        self.n_batch = (self.n_step - 1 + bptt - 1) // bptt
        # The row where the next batch starts
        self.position = 0

    def __len__(self) -> int:
        return self.n_batch

    def _check_start(self, start: Optional[int]) -> int:
        if start is None:
            return self.position
        require_positive_int('start', start, allow_zero=True)
        if start >= self.n_step - 1:
            raise ValueError(f"start={start} is not accepted: it must be below {self.n_step - 1}, the last row "
                             f"that has a target")
        return start

    def get_batch(self, i: int, bptt: Optional[int] = None) -> Batch:
        """The batch whose targets start at row `i + 1`: `(data, target, seq_len)`."""
        bptt = self.bptt if bptt is None else bptt
        seq_len = min(bptt, self.data.shape[0] - 1 - i)
        begin = max(0, i - self.ext_len)
        return self.data[begin:i + seq_len], self.data[i + 1:i + 1 + seq_len], seq_len

    def get_fixlen_iter(self, start: Optional[int] = None) -> Iterator[Batch]:
        """Batches of `bptt` rows (the last may be shorter) from row `start` (default: `position`) to the end."""
        i = self._check_start(start)
        while i < self.n_step - 1:
            batch = self.get_batch(i)
            i += batch[2]
            self.position = i if i < self.n_step - 1 else 0
            yield batch

    def get_varlen_iter(self, start: Optional[int] = None, std: float = 5, min_len: int = 5,
                        max_deviation: float = 3) -> Iterator[Batch]:
        """Batches of random lengths (see the module's description) from row `start` to the end."""
        if not std >= 0:
            raise ValueError(f"std={std!r} is not accepted: std must be a number >= 0")
        require_positive_int('min_len', min_len)
        if not max_deviation >= 0:
            raise ValueError(f"max_deviation={max_deviation!r} is not accepted: it must be a number >= 0")
        max_len = int(self.bptt + max_deviation * std)
        i = self._check_start(start)
        while i < self.n_step - 1:
            mean = self.bptt if torch.rand((), generator=self.generator).item() < 0.95 else self.bptt / 2.
            draw = torch.empty(()).normal_(mean, std, generator=self.generator).item() if std > 0 else mean
            bptt = min(max_len, max(min_len, int(draw)))
            batch = self.get_batch(i, bptt)
            i += batch[2]
            self.position = i if i < self.n_step - 1 else 0
            yield batch

    def __iter__(self) -> Iterator[Batch]:
        return self.get_fixlen_iter()

    def state_dict(self) -> dict:
        """Where the next batch starts and the generator's state, to resume exactly."""
        return {'position': self.position,
                'generator': self.generator.get_state() if self.generator is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()` of an iterator over the same data and `bsz`."""
        position = state['position']
        require_positive_int('position', position, allow_zero=True)
        if position >= max(self.n_step - 1, 1):
            raise ValueError(f"position={position} is past this iterator's {self.n_step} rows: the state is from "
                             f"other data or another bsz")
        self.position = position
        if state.get('generator') is not None:
            if self.generator is None:
                self.generator = torch.Generator()
            self.generator.set_state(state['generator'])
