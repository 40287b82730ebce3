"""
# WikiText-103 and WikiText-2

Word-level corpora of Wikipedia articles (Merity et al., 2016), published as `wikitext-103-v1.zip` and
`wikitext-2-v1.zip`, which unpack to `wikitext-103/` and `wikitext-2/` holding `wiki.train.tokens`,
`wiki.valid.tokens` and `wiki.test.tokens`. The files are already tokenized (words separated by spaces, rare words
replaced by `<unk>`), one paragraph or heading a line, with blank lines between them.

As in the original Transformer-XL: the text keeps its case, every line (blank lines too) ends with `<eos>`, and
the vocabulary is `<eos>` (id 0) then the words by count (`min_freq=0`, no `max_size`: all of them).
WikiText-103 counts the training file only; WikiText-2 counts all three files, as the original's `Corpus` does
(the words are the same, since every validation and test word occurs in training; only their order can differ).
Unknown words map to `<unk>`, which the files themselves contain.
"""
from pathlib import Path
from typing import Optional, Union

from .corpus import Corpus
from .files import find_file
from .word_level import word_corpus

PathLike = Union[str, Path]

FOLDERS = {'wt103': 'wikitext-103', 'wt2': 'wikitext-2'}
TITLES = {'wt103': 'WikiText-103', 'wt2': 'WikiText-2'}
# The splits whose words the original counts for the vocabulary
COUNTED = {'wt103': ('train',), 'wt2': ('train', 'valid', 'test')}


def load_wikitext(path: PathLike, name: str = 'wt103', *, min_freq: int = 0, max_size: Optional[int] = None,
                  cache: bool = True, cache_dir: Optional[PathLike] = None) -> Corpus:
    """
    WikiText-103 (`name='wt103'`) or WikiText-2 (`name='wt2'`) from the folder `path`.

    Args:
        path: the folder holding `wiki.{train,valid,test}.tokens` (or the folder above `wikitext-103/`; the
            original's renamed `train.txt`, `valid.txt`, `test.txt` are found too)
        name: `'wt103'` or `'wt2'`
        min_freq: leave out words counted fewer times (0: keep all, as the original)
        max_size: keep at most this many words besides `<eos>`; `None`: all
        cache: cache the encoded corpus
        cache_dir: the cache folder; `None` is the data folder
    """
    if name not in FOLDERS:
        raise ValueError(f"name={name!r} is not accepted: name must be 'wt103' or 'wt2'")
    files = {s: find_file(path, [f'wiki.{s}.tokens', f'{FOLDERS[name]}/wiki.{s}.tokens', f'{s}.txt'],
                          f'{TITLES[name]} {s} file') for s in ('train', 'valid', 'test')}
    return word_corpus(name, TITLES[name], files, lower_case=False, counted=COUNTED[name], min_freq=min_freq,
                       max_size=max_size, cache=cache, cache_dir=cache_dir)


def load_wt103(path: PathLike, **kwargs) -> Corpus:
    """WikiText-103: `load_wikitext(path, 'wt103', **kwargs)`."""
    return load_wikitext(path, 'wt103', **kwargs)


def load_wt2(path: PathLike, **kwargs) -> Corpus:
    """WikiText-2: `load_wikitext(path, 'wt2', **kwargs)`."""
    return load_wikitext(path, 'wt2', **kwargs)
