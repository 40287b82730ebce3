"""
# Penn Treebank

Mikolov's preprocessed Penn Treebank, published in `simple-examples.tgz`, whose `simple-examples/data/` holds
`ptb.train.txt`, `ptb.valid.txt` and `ptb.test.txt`: lower-case words, numbers as `N`, rare words as `<unk>`
(10,000 words in all), one sentence a line.

As in the original Transformer-XL: lines are lower-cased, each ends with `<eos>`, and the vocabulary is `<eos>`
then the words by count over the three files.
"""
from pathlib import Path
from typing import Optional, Union

from .corpus import Corpus
from .files import find_file
from .word_level import word_corpus

PathLike = Union[str, Path]


def load_ptb(path: PathLike, *, min_freq: int = 0, max_size: Optional[int] = None, cache: bool = True,
             cache_dir: Optional[PathLike] = None) -> Corpus:
    """
    Penn Treebank from the folder `path`.

    Args:
        path: the folder holding `ptb.{train,valid,test}.txt` (or the folder above `simple-examples/`; the
            original's renamed `train.txt`, `valid.txt`, `test.txt` are found too)
        min_freq: leave out words counted fewer times (0: keep all)
        max_size: keep at most this many words besides `<eos>`; `None`: all
        cache: cache the encoded corpus
        cache_dir: the cache folder; `None` is the data folder
    """
    files = {s: find_file(path, [f'ptb.{s}.txt', f'simple-examples/data/ptb.{s}.txt', f'{s}.txt'],
                          f'Penn Treebank {s} file') for s in ('train', 'valid', 'test')}
    return word_corpus('ptb', 'Penn Treebank', files, lower_case=True, counted=('train', 'valid', 'test'),
                       min_freq=min_freq, max_size=max_size, cache=cache, cache_dir=cache_dir)
