"""
# Shuffled sentence streams

One Billion Words is a set of shuffled, unrelated sentences, so the original Transformer-XL does not read it as
one ordered stream. `LMShuffledIterator` shuffles the sentences (each `<S> w1 ... wn <S>`) and streams them into
`bsz` columns: each column takes `bptt` tokens at a time from its current sentence and, when the sentence runs
out, continues with the next sentence of the shuffled order. A sentence of $m$ tokens gives its first $m - 1$
tokens as inputs and its last $m - 1$ as targets: its closing `<S>` is only a target, and the next input of the
column is the next sentence's opening `<S>`, the same symbol, so each column reads as one continuous stream
`<S> w1 ... wn <S> v1 ... <S>`. With `ext_len`, each batch's inputs begin with the last `ext_len` input rows of the
previous batch.

When the sentences run out, the original drops the unfinished batch (`drop_last=True`). With `drop_last=False`
the pass continues until every column has used its last sentence: inputs past a column's end are `pad_index`
and their targets are `-1` (use `ignore_index=-1` in the loss), and each sentence's tokens are then all used
exactly once per epoch.

`LMMultiFileIterator` does the same for the training shards, which are too large to hold encoded in memory:
each epoch it shuffles the shard order, then reads, encodes and shuffles one shard at a time. The original
restarts the columns at every shard, dropping the unfinished sentences of each; here the shards are chained into
one sentence stream, so only the end of the epoch is unfinished.

Shuffling uses a `torch.Generator` seeded with `seed` and the epoch number, so every epoch's order is
repeatable, and a run resumed at an epoch boundary (`state_dict` / `load_state_dict`) sees the same orders.
"""
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import require_positive_int
from .vocabulary import Vocabulary
from .word_files import encode_file

Batch = Tuple[torch.Tensor, torch.Tensor, int]


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2 ** 63))


class LMShuffledIterator:
    """
    Sentences, shuffled and streamed into `bsz` columns.

    Args:
        data: the sentences, each a 1-D tensor of token ids
        bsz: the number of columns (batch size)
        bptt: the number of target rows per batch
        device: where batches are placed
        ext_len: extra context rows carried over from the previous batch's inputs
        shuffle: shuffle the sentences each epoch (`False` streams them in the given order)
        seed: the seed of the shuffles
        drop_last: drop the unfinished batches at the end of an epoch, as the original
        pad_index: the input id past a column's last sentence when `drop_last=False`

    Shape:
        - data: `[ext + bptt, bsz]`, `ext <= ext_len` (0 in the first batch); target: `[bptt, bsz]`

    Each iteration over the object is one epoch and yields `(data, target, bptt)`.
    """

    def __init__(self, data: Sequence[torch.Tensor], bsz: int, bptt: int, device: Union[str, torch.device] = 'cpu',
                 ext_len: Optional[int] = 0, shuffle: bool = False, seed: int = 0, drop_last: bool = True,
                 pad_index: int = 0):
        self._check(bsz, bptt, ext_len, seed)
        for i, sentence in enumerate(data):
            if not isinstance(sentence, torch.Tensor) or sentence.dim() != 1:
                raise ValueError(f"data[{i}] is not accepted: each sentence must be a 1-D tensor of token ids")
        self.data = list(data)
        self._init(bsz, bptt, device, ext_len, shuffle, seed, drop_last, pad_index)

    @staticmethod
    def _check(bsz, bptt, ext_len, seed):
        require_positive_int('bsz', bsz)
        require_positive_int('bptt', bptt)
        require_positive_int('ext_len', 0 if ext_len is None else ext_len, allow_zero=True)
        require_positive_int('seed', seed, allow_zero=True)

    def _init(self, bsz, bptt, device, ext_len, shuffle, seed, drop_last, pad_index):
        self.bsz, self.bptt, self.device = bsz, bptt, device
        self.ext_len = 0 if ext_len is None else ext_len
        self.shuffle, self.seed, self.drop_last, self.pad_index = shuffle, seed, drop_last, pad_index
        # The epoch the next iteration runs
        self.epoch = 0

    def get_sent_stream(self, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """The sentences of one epoch, shuffled if `shuffle`."""
        order = torch.randperm(len(self.data), generator=generator).tolist() if self.shuffle \
            else range(len(self.data))
        for i in order:
            yield self.data[i]

    def stream_iterator(self, sent_stream: Iterable[torch.Tensor]) -> Iterator[Batch]:
        """Batches from a stream of sentences."""
        sent_stream = iter(sent_stream)
        bsz, bptt = self.bsz, self.bptt
        # What is left of each column's current sentence
        streams: List[Optional[torch.Tensor]] = [None] * bsz
        retained = torch.zeros(0, bsz, dtype=torch.long)
        ended = False
        while True:
            data = torch.full((bptt, bsz), self.pad_index, dtype=torch.long)
            target = torch.full((bptt, bsz), -1, dtype=torch.long)
            for col in range(bsz):
                filled = 0
                while filled < bptt:
                    if streams[col] is None or len(streams[col]) <= 1:
                        sentence = None if ended else next(sent_stream, None)
                        if sentence is None:
                            ended = True
                            streams[col] = None
                            break
                        streams[col] = sentence
                        continue
                    n_new = min(len(streams[col]) - 1, bptt - filled)
                    data[filled:filled + n_new, col] = streams[col][:n_new]
                    target[filled:filled + n_new, col] = streams[col][1:n_new + 1]
                    streams[col] = streams[col][n_new:]
                    filled += n_new
                if ended and self.drop_last:
                    return
            if ended and bool((target == -1).all()):
                return
            data = torch.cat([retained, data])
            yield data.to(self.device), target.to(self.device), bptt
            retained = data[data.shape[0] - min(data.shape[0], self.ext_len):]

    def __iter__(self) -> Iterator[Batch]:
        generator = _epoch_generator(self.seed, self.epoch)
        self.epoch += 1
        return self.stream_iterator(self.get_sent_stream(generator))

    def state_dict(self) -> dict:
        """The epoch the next iteration runs (resume at an epoch boundary)."""
        return {'epoch': self.epoch, 'seed': self.seed}

    def load_state_dict(self, state: dict) -> None:
        require_positive_int('epoch', state['epoch'], allow_zero=True)
        self.epoch, self.seed = state['epoch'], state['seed']


class LMMultiFileIterator(LMShuffledIterator):
    """
    Sentences of many files (One Billion Words' training shards), shuffled and streamed into `bsz` columns.

    Args:
        paths: the files, one sentence a line
        vocab: the vocabulary that encodes them
        bsz, bptt, device, ext_len, shuffle, seed, drop_last, pad_index: as `LMShuffledIterator`
        lower_case: lower-case the lines before encoding them

    Each sentence is encoded as `<S> w1 ... wn <S>` (the original's `add_double_eos`).
    """

    def __init__(self, paths: Sequence[Union[str, Path]], vocab: Vocabulary, bsz: int, bptt: int,
                 device: Union[str, torch.device] = 'cpu', ext_len: Optional[int] = 0, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = True, pad_index: int = 0, lower_case: bool = False):
        self._check(bsz, bptt, ext_len, seed)
        if not paths:
            raise ValueError("paths is empty: give at least one file of sentences")
        self.paths = [Path(p) for p in paths]
        self.vocab, self.lower_case = vocab, lower_case
        self._init(bsz, bptt, device, ext_len, shuffle, seed, drop_last, pad_index)

    def get_sent_stream(self, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """The sentences of one epoch: the files (shuffled if `shuffle`), each file's sentences shuffled."""
        order = torch.randperm(len(self.paths), generator=generator).tolist() if self.shuffle \
            else range(len(self.paths))
        for f in order:
            sentences = encode_file(self.paths[f], self.vocab, 'training shard', ordered=False,
                                    add_double_eos=True, lower_case=self.lower_case)
            if self.shuffle:
                sentences = [sentences[i] for i in torch.randperm(len(sentences), generator=generator).tolist()]
            yield from sentences
