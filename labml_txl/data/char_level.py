"""
# Character- and byte-level vocabularies

For enwik8 and text8 the original counts every symbol of the training, validation and test files and orders the
vocabulary by `Counter.most_common` (count, then first occurrence). Counting 100 million symbols one Python string
at a time takes minutes, so here the symbols are integer codes (byte values or Unicode code points) in tensors:
`torch.bincount` gives the counts and a scatter of positions gives each code's first occurrence. The vocabulary
and ids are the same as counting with a `Counter` (a test checks that on text).
"""
from collections import Counter
from typing import Callable, List, Sequence, Tuple

import torch

from .vocabulary import Vocabulary

_CHUNK = 1 << 22


def code_counts(parts: Sequence[torch.Tensor]) -> List[Tuple[int, int]]:
    """`(code, count)` for every code in `parts` (read in order), in `Counter.most_common` order."""
    size = 1 + max((int(p.max()) for p in parts if p.numel()), default=-1)
    counts = torch.zeros(size, dtype=torch.int64)
    first = torch.full((size,), torch.iinfo(torch.int64).max, dtype=torch.int64)
    offset = 0
    for part in parts:
        for start in range(0, part.numel(), _CHUNK):
            chunk = part[start:start + _CHUNK]
            counts += torch.bincount(chunk, minlength=size)
            positions = torch.arange(offset + start, offset + start + chunk.numel(), dtype=torch.int64)
            first.scatter_reduce_(0, chunk, positions, reduce='amin')
        offset += part.numel()
    present = counts.nonzero().reshape(-1).tolist()
    counts, first = counts.tolist(), first.tolist()
    return sorted(((c, counts[c]) for c in present), key=lambda cc: (-cc[1], first[cc[0]]))


def build_code_vocabulary(parts: Sequence[torch.Tensor], symbol_of: Callable[[int], str]) -> Vocabulary:
    """The vocabulary of the codes in `parts`, each code named by `symbol_of(code)`."""
    counter = Counter()
    for code, count in code_counts(parts):
        counter[symbol_of(code)] = count
    return Vocabulary.from_counter(counter)


def encode_codes(codes: torch.Tensor, vocab: Vocabulary, symbol_of: Callable[[int], str]) -> torch.Tensor:
    """The token ids of `codes`, by a lookup table from code to id; every code must be in `vocab`."""
    if codes.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    unique = torch.bincount(codes).nonzero().reshape(-1).tolist()
    table = torch.full((unique[-1] + 1,), -1, dtype=torch.long)
    for code in unique:
        table[code] = vocab.index_of(symbol_of(code))
    return table[codes]
