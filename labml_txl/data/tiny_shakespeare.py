"""
# Tiny Shakespeare

Karpathy's Tiny Shakespeare (public domain, 1,115,394 characters) ships inside the package, gzip-compressed, as
the default corpus of the demo and the examples: nothing to download.

As a corpus it is character-level, every character (newlines too) a symbol, split in order: the first 90% of the
characters train, the next 5% validate and the last 5% test. In numbers, `int(0.9 * N)` and `int(0.05 * N)`
characters for training and validation and the rest for testing: 1,003,854, 55,769 and 55,771. The vocabulary
(65 characters) is ordered by count over the three splits, as the original orders its character corpora.

It encodes in well under a second, so it is cached only when a `cache_dir` is given.
"""
import gzip
from pathlib import Path
from typing import Optional, Union

from . import tokenization
from .cache import cached
from .char_level import build_code_vocabulary, encode_codes
from .corpus import Corpus
from .files import EmptyDataFileError, DataFileFormatError, decode_utf8, read_bytes, require_file

PathLike = Union[str, Path]

TINY_SHAKESPEARE_PATH = Path(__file__).resolve().parent / 'tiny_shakespeare.txt.gz'


def load_tiny_shakespeare() -> str:
    """The bundled Tiny Shakespeare text."""
    with gzip.open(TINY_SHAKESPEARE_PATH, 'rt', encoding='utf-8') as f:
        return f.read()


def _read_text(path: Path) -> str:
    data = read_bytes(path, 'Tiny Shakespeare text file')
    if path.suffix == '.gz':
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DataFileFormatError(f"Tiny Shakespeare text file {path} is not gzip data ({e}): expected a "
                                      f"gzip-compressed UTF-8 text, or a plain text file without the .gz suffix") \
                from None
        if not data:
            raise EmptyDataFileError(f"Tiny Shakespeare text file {path} holds no text (0 bytes uncompressed)")
    return decode_utf8(data, path, 'Tiny Shakespeare text file')


def load_tiny_shakespeare_corpus(path: Optional[PathLike] = None, *, train_fraction: float = 0.9,
                                 valid_fraction: float = 0.05, cache: bool = True,
                                 cache_dir: Optional[PathLike] = None) -> Corpus:
    """
    Tiny Shakespeare as a character-level corpus.

    Args:
        path: a UTF-8 text file (`.gz` compressed or not) to use instead of the bundled one
        train_fraction: the fraction of the characters for training (the first ones)
        valid_fraction: the fraction for validation (the next ones); the test split gets the rest
        cache: cache the encoded corpus (only where `cache_dir` says)
        cache_dir: the cache folder; `None` does not cache
    """
    for name, value in (('train_fraction', train_fraction), ('valid_fraction', valid_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ValueError(f"{name}={value!r} is not accepted: {name} must be a number between 0 and 1")
    if train_fraction + valid_fraction >= 1:
        raise ValueError(f"train_fraction + valid_fraction = {train_fraction + valid_fraction} is not accepted: "
                         f"it must be below 1 to leave characters for the test split")
    source = TINY_SHAKESPEARE_PATH if path is None else Path(path)

    def build() -> dict:
        text = load_tiny_shakespeare() if path is None else _read_text(source)
        n_train, n_valid = int(len(text) * train_fraction), int(len(text) * valid_fraction)
        parts = [text[:n_train], text[n_train:n_train + n_valid], text[n_train + n_valid:]]
        if not all(parts):
            raise ValueError(f"{source} has {len(text)} characters, too few to split into "
                             f"{[len(p) for p in parts]} (train, valid, test): every split needs characters")
        codes = [tokenization.tokenize_chars(p) for p in parts]
        vocab = build_code_vocabulary(codes, chr)
        train, valid, test = (encode_codes(c, vocab, chr) for c in codes)
        return Corpus('tiny_shakespeare', vocab, train, valid, test, level='char').to_payload()

    if path is not None:
        require_file(source, 'Tiny Shakespeare text file')  # fail early on a missing or empty file
    params = {'train_fraction': train_fraction, 'valid_fraction': valid_fraction}
    payload = cached('tiny_shakespeare', [source], params, build, cache_dir if cache else None)
    return Corpus.from_payload(payload)
