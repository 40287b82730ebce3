"""
# Tokenization

How the original Transformer-XL turns text into symbols, for the three kinds of corpora:

* **words** (WikiText, PTB, One Billion Words): `Vocab.tokenize` strips the line, optionally lower-cases it,
  splits it on whitespace and appends `<eos>` (`add_eos`) or wraps it in `<S> ... <S>` (`add_double_eos`,
  One Billion Words: the same `<S>` opens and closes a sentence);
* **characters** (text8, Tiny Shakespeare): one symbol per Unicode character;
* **bytes** (enwik8): one symbol per byte. The original's `prep_enwik8.py` writes each byte as its decimal value
  and each newline byte as a line break, and `Vocab.tokenize` then strips the lines, so the newline byte (10)
  never reaches the model. `keep_newlines=False` reproduces that; `True` keeps every byte.

The corpora call these functions through this module (`tokenization.tokenize_line(...)`), which is also how the
tests count the calls to check that a cached corpus is not tokenized again.
"""
from typing import List, Optional

import torch

EOS = '<eos>'
SENTENCE_BOUNDARY = '<S>'
NEWLINE_BYTE = 10


def tokenize_line(line: str, *, lower_case: bool = False, add_eos: bool = False, add_double_eos: bool = False,
                  delimiter: Optional[str] = None) -> List[str]:
    """The symbols of one line, as the original's `Vocab.tokenize`.

    Args:
        line: one line of text (its trailing newline, if any, is stripped with the other surrounding whitespace)
        lower_case: lower-case the line first (the original does for PTB, text8 and enwik8)
        add_eos: append `<eos>` (WikiText, PTB)
        add_double_eos: return `['<S>'] + symbols + ['<S>']` (One Billion Words); takes precedence over `add_eos`
        delimiter: split on this string; `None` splits on runs of whitespace, `''` gives one symbol per character
    """
    line = line.strip()
    if lower_case:
        line = line.lower()
    symbols = list(line) if delimiter == '' else line.split(delimiter)
    if add_double_eos:
        return [SENTENCE_BOUNDARY] + symbols + [SENTENCE_BOUNDARY]
    if add_eos:
        return symbols + [EOS]
    return symbols


def tokenize_chars(text: str) -> torch.Tensor:
    """The Unicode code points of `text` as a 1-D `int64` tensor (one symbol per character)."""
    if not text:
        return torch.zeros(0, dtype=torch.int64)
    if text.isascii():
        codes = torch.frombuffer(bytearray(text.encode('ascii')), dtype=torch.uint8)
    else:
        codes = torch.frombuffer(bytearray(text.encode('utf-32-le')), dtype=torch.int32)
    return codes.to(torch.int64)


def tokenize_bytes(data: bytes, *, keep_newlines: bool = False) -> torch.Tensor:
    """The byte values of `data` as a 1-D `int64` tensor; without the newline byte unless `keep_newlines`."""
    if not data:
        return torch.zeros(0, dtype=torch.int64)
    codes = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if not keep_newlines:
        codes = codes[codes != NEWLINE_BYTE]
    return codes.to(torch.int64)
