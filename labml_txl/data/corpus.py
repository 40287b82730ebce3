"""
# Corpus

What every corpus loader returns, as the original Transformer-XL's `Corpus`: a vocabulary and the three splits,
with `get_iterator` choosing the iterator the original uses for them:

* ordered corpora (Tiny Shakespeare, enwik8, text8, WikiText, PTB): each split is one tensor of token ids, read by
  `LMOrderedIterator`;
* One Billion Words: the training split is the list of shard files, read by `LMMultiFileIterator` (shuffled);
  validation and test are lists of sentences, read in order by `LMShuffledIterator` (not shuffled).
"""
from pathlib import Path
from typing import List, Sequence, Union

import torch

from ..errors import describe_choices
from .cache import compact
from .ordered_iterator import LMOrderedIterator
from .shuffled_iterator import LMMultiFileIterator, LMShuffledIterator
from .vocabulary import Vocabulary

SPLITS = ('train', 'valid', 'test')
LEVELS = ('byte', 'char', 'word')


class Corpus:
    """
    A tokenized corpus.

    Args:
        name: the corpus name (`'enwik8'`, `'wt103'`, ...)
        vocab: its vocabulary
        train: the training ids (1-D tensor), or the training files (One Billion Words)
        valid: the validation ids (1-D tensor), or a list of sentences (1-D tensors)
        test: the test ids, like `valid`
        level: `'byte'`, `'char'` or `'word'`: how `decode` joins symbols
        lower_case: whether the text was lower-cased (used when `LMMultiFileIterator` encodes training files)
    """

    def __init__(self, name: str, vocab: Vocabulary, train: Union[torch.Tensor, Sequence[Path]],
                 valid: Union[torch.Tensor, List[torch.Tensor]], test: Union[torch.Tensor, List[torch.Tensor]],
                 level: str, lower_case: bool = False):
        if level not in LEVELS:
            raise ValueError(f"level={level!r} is not accepted: level must be {describe_choices(LEVELS)}")
        self.name, self.vocab, self.level, self.lower_case = name, vocab, level, lower_case
        self.train, self.valid, self.test = train, valid, test
        # Ordered corpora are single streams; One Billion Words is a set of sentences
        self.ordered = isinstance(train, torch.Tensor)

    @property
    def n_token(self) -> int:
        """The vocabulary size (the original's `ntokens`)."""
        return len(self.vocab)

    def __repr__(self) -> str:
        def size(split):
            if isinstance(split, torch.Tensor):
                return f'{split.numel():,} tokens'
            if split and isinstance(split[0], torch.Tensor):
                return f'{len(split):,} sentences'
            return f'{len(split)} files'
        return (f"Corpus({self.name!r}, {self.n_token:,} symbols, train: {size(self.train)}, "
                f"valid: {size(self.valid)}, test: {size(self.test)})")

    def get_iterator(self, split: str, bsz: int, bptt: int, device: Union[str, torch.device] = 'cpu',
                     ext_len: int = 0, **kwargs):
        """The original's iterator for `split`; `kwargs` go to the iterator (`seed`, `generator`, `drop_last`...)."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not accepted: split must be {describe_choices(SPLITS)}")
        data = getattr(self, split)
        if self.ordered:
            return LMOrderedIterator(data, bsz, bptt, device=device, ext_len=ext_len, **kwargs)
        if split == 'train':
            kwargs.setdefault('shuffle', True)
            return LMMultiFileIterator(data, self.vocab, bsz, bptt, device=device, ext_len=ext_len,
                                       lower_case=self.lower_case, **kwargs)
        return LMShuffledIterator(data, bsz, bptt, device=device, ext_len=ext_len, **kwargs)

    def encode(self, text: str) -> torch.Tensor:
        """The ids of `text`, the inverse of `decode`: UTF-8 bytes, characters, or words split on spaces."""
        if self.level == 'byte':
            symbols = [str(b) for b in text.encode('utf-8')]
        elif self.level == 'char':
            symbols = list(text)
        else:
            symbols = text.split()
        return self.vocab.encode(symbols)

    def decode(self, ids: Union[torch.Tensor, Sequence[int]]) -> str:
        """The text of `ids`: bytes decoded as UTF-8 (invalid sequences replaced), characters joined, words
        joined with spaces."""
        symbols = self.vocab.decode(ids)
        if self.level == 'byte':
            return bytes(int(s) for s in symbols).decode('utf-8', errors='replace')
        if self.level == 'char':
            return ''.join(symbols)
        return ' '.join(symbols)

    # Conversions to and from the plain data kept in cache files

    def to_payload(self) -> dict:
        def pack(split):
            if isinstance(split, torch.Tensor):
                return compact(split, len(self.vocab))
            if split and isinstance(split[0], torch.Tensor):
                return {'tokens': compact(torch.cat(split), len(self.vocab)),
                        'lengths': torch.tensor([len(s) for s in split], dtype=torch.long)}
            return {'files': [str(p) for p in split]}

        return {'name': self.name, 'level': self.level, 'lower_case': self.lower_case,
                'vocab': self.vocab.state_dict(), **{s: pack(getattr(self, s)) for s in SPLITS}}

    @classmethod
    def from_payload(cls, payload: dict) -> 'Corpus':
        def unpack(split):
            if isinstance(split, torch.Tensor):
                return split.to(torch.long)
            if 'files' in split:
                return [Path(p) for p in split['files']]
            return list(torch.split(split['tokens'].to(torch.long), split['lengths'].tolist()))

        return cls(payload['name'], Vocabulary.from_state_dict(payload['vocab']),
                   *(unpack(payload[s]) for s in SPLITS), level=payload['level'], lower_case=payload['lower_case'])
