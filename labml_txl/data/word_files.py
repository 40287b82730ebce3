"""
# Counting and encoding the words of text files

The line-per-sentence text files of WikiText, PTB and One Billion Words, read as the original's `Vocab.count_file`
and `Vocab.encode_file`: each line is tokenized on its own (`tokenization.tokenize_line`), the vocabulary counts
the symbols *without* `<eos>` (it is a special symbol, placed first), and encoding adds `<eos>` at the end of
every line, empty lines included (`add_eos`), or `<S>` at both ends (`add_double_eos`). Corpora (`word_level.py`,
`lm1b.py`) and the shuffled iterator over One Billion Words' shards use them; they know nothing of either.
"""
from collections import Counter
from pathlib import Path
from typing import List, Union

import torch

from . import tokenization
from .files import iter_text_lines
from .vocabulary import Vocabulary

# Token ids are gathered in lists of this many before becoming a tensor
_FLUSH = 1 << 20


def count_file(path: Path, counter: Counter, what: str, lower_case: bool = False) -> None:
    """Add the symbols of every line of `path` to `counter`."""
    for _, line in iter_text_lines(path, what):
        counter.update(tokenization.tokenize_line(line, lower_case=lower_case))


def encode_file(path: Path, vocab: Vocabulary, what: str, ordered: bool, add_eos: bool = False,
                add_double_eos: bool = False, lower_case: bool = False) -> Union[torch.Tensor, List[torch.Tensor]]:
    """The ids of `path`: one tensor of the whole file if `ordered`, else one tensor a line."""
    sentences: List[torch.Tensor] = []
    pending: List[int] = []
    for number, line in iter_text_lines(path, what):
        symbols = tokenization.tokenize_line(line, lower_case=lower_case, add_eos=add_eos,
                                             add_double_eos=add_double_eos)
        try:
            ids = vocab.indices(symbols)
        except KeyError as e:
            raise KeyError(f"{what} {path}, line {number}: {e.args[0]}") from None
        if ordered:
            pending.extend(ids)
            if len(pending) >= _FLUSH:
                sentences.append(torch.tensor(pending, dtype=torch.long))
                pending = []
        else:
            sentences.append(torch.tensor(ids, dtype=torch.long))
    if ordered:
        sentences.append(torch.tensor(pending, dtype=torch.long))
        return torch.cat(sentences)
    return sentences
