"""
# text8

The first 100,000,000 characters of an English Wikipedia dump, cleaned to the 26 lower-case letters and single
spaces, published as `text8.zip` (holding the file `text8`) at mattmahoney.net/dc. Character-level: the first
90,000,000 characters train, the next 5,000,000 validate and the last 5,000,000 test, as the original's
`prep_text8.py`, which also strips spaces from the two ends of each split (so the training split loses
text8's leading space).

The vocabulary is the characters that occur (27), ordered by count over the three splits as the original, so
token ids match its checkpoints; the space symbol is `' '` here (the original's files write it as `'_'`).
"""
from pathlib import Path
from typing import Optional, Union

from . import tokenization
from .cache import cached
from .char_level import build_code_vocabulary, encode_codes
from .corpus import Corpus
from .enwik8 import find_single_file, read_single_file
from .files import decode_utf8
from .splits import split_sizes

PathLike = Union[str, Path]


def load_text8(path: PathLike, *, train_size: Optional[int] = 90_000_000, valid_size: int = 5_000_000,
               test_size: int = 5_000_000, cache: bool = True, cache_dir: Optional[PathLike] = None) -> Corpus:
    """
    text8 from `path`: the file `text8` or `text8.zip`, or a folder that holds one of them.

    Args:
        path: the data file or its folder
        train_size, valid_size, test_size: the split, in characters (the file must have exactly their sum; a
            `train_size` of `None` trains on everything before validation and test)
        cache: cache the encoded corpus
        cache_dir: the cache folder; `None` is the data file's folder
    """
    source = find_single_file(path, 'text8')

    def build() -> dict:
        text = decode_utf8(read_single_file(source, 'text8'), source, 'text8 data file')
        n_train, n_valid, _ = split_sizes(len(text), train_size, valid_size, test_size, str(source), 'characters')
        parts = [text[:n_train], text[n_train:n_train + n_valid], text[n_train + n_valid:]]
        codes = [tokenization.tokenize_chars(p.strip()) for p in parts]
        vocab = build_code_vocabulary(codes, chr)
        train, valid, test = (encode_codes(c, vocab, chr) for c in codes)
        return Corpus('text8', vocab, train, valid, test, level='char').to_payload()

    params = {'train_size': train_size, 'valid_size': valid_size, 'test_size': test_size}
    payload = cached('text8', [source], params, build, (cache_dir or source.parent) if cache else None)
    return Corpus.from_payload(payload)
