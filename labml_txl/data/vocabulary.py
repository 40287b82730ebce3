"""
# Vocabulary

The mapping between symbols and token ids, as the original Transformer-XL's `Vocab`:

* the special symbols come first, in the order given (`<eos>` for WikiText and PTB, so `<eos>` is id 0);
* then the counted symbols in `Counter.most_common` order: by count, highest first, ties in the order the
  symbols were first seen; the list stops at the first symbol counted fewer than `min_freq` times and after
  `max_size` symbols (specials not included);
* or, with a vocabulary file (One Billion Words' `1b_word_vocab.txt`), the first word of each line, in file order.

Unknown symbols map to `unk` (`<unk>` in WikiText and PTB, whose files already contain it, so it takes its place
by count as in the original; `<UNK>` in `1b_word_vocab.txt`). When the counted text does not contain `unk` it is
added right after the specials, so words left out by `min_freq` or `max_size` and words never seen still have an
id. A vocabulary without `unk` (the character-level ones) refuses unknown symbols with an error that names them.
"""
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Union

import torch

from ..errors import require_positive_int
from .files import EmptyDataFileError, iter_text_lines


class Vocabulary:
    """
    Symbols and their ids.

    Args:
        symbols: the symbols in id order (no duplicates)
        special: the symbols among `symbols` that are special (`<eos>`, `<S>`, ...), for reference
        unk: the symbol unknown symbols map to; it must be in `symbols` if given

    Build one with `Vocabulary.from_counter` (counts) or `Vocabulary.from_file` (a vocabulary file).
    """

    def __init__(self, symbols: Sequence[str], special: Sequence[str] = (), unk: Optional[str] = None):
        symbols = list(symbols)
        index: Dict[str, int] = {}
        for i, s in enumerate(symbols):
            if not isinstance(s, str):
                raise TypeError(f"symbols[{i}]={s!r} is not accepted: symbols must be strings")
            if s in index:
                raise ValueError(f"symbols has {s!r} twice (ids {index[s]} and {i}): symbols must be unique")
            index[s] = i
        for s in special:
            if s not in index:
                raise ValueError(f"special symbol {s!r} is not among the symbols")
        if unk is not None and unk not in index:
            raise ValueError(f"unk={unk!r} is not among the symbols: give a vocabulary that contains it, or unk=None")
        self.symbols: List[str] = symbols
        self.index: Dict[str, int] = index
        self.special: List[str] = list(special)
        self.unk: Optional[str] = unk
        self.unk_index: Optional[int] = index[unk] if unk is not None else None

    @classmethod
    def from_counter(cls, counter: Counter, special: Sequence[str] = (), min_freq: int = 0,
                     max_size: Optional[int] = None, unk: Optional[str] = None) -> 'Vocabulary':
        """The specials, then the counted symbols in `most_common` order, as the original's `build_vocab`.

        Args:
            counter: symbol counts; ties are ordered by the counter's insertion order (first occurrence)
            special: symbols placed first, in this order
            min_freq: stop at the first symbol counted fewer times than this (0 keeps all)
            max_size: keep at most this many counted symbols (specials not included); `None` keeps all
            unk: the symbol for unknown symbols; added after the specials if the counter does not have it
        """
        require_positive_int('min_freq', min_freq, allow_zero=True)
        if max_size is not None:
            require_positive_int('max_size', max_size)
        if len(set(special)) != len(special):
            raise ValueError(f"special={list(special)!r} has a symbol twice: special symbols must be unique")
        symbols = list(special)
        taken = set(symbols)
        kept = 0
        for symbol, count in counter.most_common():
            if symbol in taken:
                continue
            if count < min_freq or (max_size is not None and kept >= max_size):
                break
            symbols.append(symbol)
            taken.add(symbol)
            kept += 1
        special = list(special)
        if unk is not None and unk not in taken:
            symbols.insert(len(special), unk)
            special.append(unk)
        return cls(symbols, special=special, unk=unk)

    @classmethod
    def from_file(cls, path: Union[str, Path], unk: Optional[str] = '<UNK>') -> 'Vocabulary':
        """The first whitespace-separated word of each non-blank line of `path`, in file order.

        This is how the original reads `1b_word_vocab.txt` (lines `word count`), whose unknown symbol is `<UNK>`.
        A word listed twice keeps its first id.
        """
        symbols: List[str] = []
        seen = set()
        for _, line in iter_text_lines(path, 'vocabulary file'):
            words = line.split()
            if words and words[0] not in seen:
                seen.add(words[0])
                symbols.append(words[0])
        if not symbols:
            raise EmptyDataFileError(f"vocabulary file {path} has no words: expected one word (and its count) a line")
        if unk is not None and unk not in seen:
            raise ValueError(f"vocabulary file {path} has no unknown symbol {unk!r}: expected a line for it "
                             f"(1b_word_vocab.txt has '<UNK>'), or pass unk=None")
        return cls(symbols, unk=unk)

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, symbol: str) -> bool:
        return symbol in self.index

    def __repr__(self) -> str:
        head = ', '.join(repr(s) for s in self.symbols[:8])
        return f"Vocabulary({len(self)} symbols: {head}{', ...' if len(self) > 8 else ''}; unk={self.unk!r})"

    def index_of(self, symbol: str) -> int:
        """The id of `symbol`, or of `unk` when it is unknown."""
        i = self.index.get(symbol, self.unk_index)
        if i is None:
            raise KeyError(f"symbol {symbol!r} is not in the vocabulary ({len(self)} symbols) and the vocabulary "
                           f"has no unknown symbol (unk=None)")
        return i

    def indices(self, symbols: Iterable[str]) -> List[int]:
        """The ids of `symbols`, as a list."""
        index, unk = self.index, self.unk_index
        if unk is not None:
            return [index.get(s, unk) for s in symbols]
        return [index[s] if s in index else self.index_of(s) for s in symbols]

    def encode(self, symbols: Iterable[str]) -> torch.Tensor:
        """The ids of `symbols` as a 1-D `int64` tensor."""
        return torch.tensor(self.indices(symbols), dtype=torch.long)

    def decode(self, ids: Union[torch.Tensor, Iterable[int]]) -> List[str]:
        """The symbols of `ids`."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        out = []
        for i in ids:
            if not 0 <= i < len(self.symbols):
                raise IndexError(f"token id {i} is out of range: the vocabulary has ids 0 to {len(self) - 1}")
            out.append(self.symbols[i])
        return out

    def state_dict(self) -> dict:
        """Plain data (lists and strings) to save with `torch.save` and restore with `from_state_dict`."""
        return {'symbols': list(self.symbols), 'special': list(self.special), 'unk': self.unk}

    @classmethod
    def from_state_dict(cls, state: dict) -> 'Vocabulary':
        return cls(state['symbols'], special=state['special'], unk=state['unk'])

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and self.state_dict() == other.state_dict()
