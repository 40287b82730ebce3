"""
# enwik8

The first 100,000,000 bytes of an English Wikipedia XML dump (Hutter Prize), published as `enwik8.zip`
(holding the file `enwik8`) at mattmahoney.net/dc. Byte-level: the first 90,000,000 bytes train, the next
5,000,000 validate and the last 5,000,000 test, as the original's `prep_enwik8.py`.

As in the original, the vocabulary is the bytes that occur, ordered by count over the three splits, and each
symbol is the byte's decimal value (`'101'` is `e`), so token ids match checkpoints of the original
Transformer-XL. Also as in the original, newline bytes are dropped (its preparation writes each newline as a line
break and its tokenizer strips line ends), so bits-per-character compare with published numbers;
`keep_newlines=True` keeps every byte instead.
"""
from pathlib import Path
from typing import Optional, Union

from . import tokenization
from .cache import cached
from .char_level import build_code_vocabulary, encode_codes
from .corpus import Corpus
from .files import find_file, read_bytes, read_zip_member, require_file
from .splits import split_sizes

PathLike = Union[str, Path]


def find_single_file(path: PathLike, name: str) -> Path:
    """`path` itself if it is a file, else `<path>/<name>` or `<path>/<name>.zip`."""
    path = Path(path)
    if path.is_dir():
        return find_file(path, [name, f'{name}.zip'], f'{name} data file')
    return require_file(path, f'{name} data file')


def read_single_file(path: Path, name: str) -> bytes:
    """The content of the raw file, or of the member `name` of a `.zip`."""
    if path.suffix == '.zip':
        return read_zip_member(path, name, f'{name} archive')
    return read_bytes(path, f'{name} data file')


def load_enwik8(path: PathLike, *, train_size: Optional[int] = 90_000_000, valid_size: int = 5_000_000,
                test_size: int = 5_000_000, keep_newlines: bool = False, cache: bool = True,
                cache_dir: Optional[PathLike] = None) -> Corpus:
    """
    enwik8 from `path`: the file `enwik8` or `enwik8.zip`, or a folder that holds one of them.

    Args:
        path: the data file or its folder
        train_size, valid_size, test_size: the split, in bytes (the file must have exactly their sum; a
            `train_size` of `None` trains on everything before validation and test)
        keep_newlines: keep the newline byte (the original drops it)
        cache: cache the encoded corpus
        cache_dir: the cache folder; `None` is the data file's folder
    """
    source = find_single_file(path, 'enwik8')

    def build() -> dict:
        data = read_single_file(source, 'enwik8')
        n_train, n_valid, _ = split_sizes(len(data), train_size, valid_size, test_size, str(source), 'bytes')
        parts = [data[:n_train], data[n_train:n_train + n_valid], data[n_train + n_valid:]]
        codes = [tokenization.tokenize_bytes(p, keep_newlines=keep_newlines) for p in parts]
        vocab = build_code_vocabulary(codes, str)
        train, valid, test = (encode_codes(c, vocab, str) for c in codes)
        return Corpus('enwik8', vocab, train, valid, test, level='byte').to_payload()

    params = {'train_size': train_size, 'valid_size': valid_size, 'test_size': test_size,
              'keep_newlines': keep_newlines}
    payload = cached('enwik8', [source], params, build, (cache_dir or source.parent) if cache else None)
    return Corpus.from_payload(payload)
