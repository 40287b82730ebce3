"""
# Word-level files

Counting and encoding the line-per-sentence text files of WikiText, PTB and One Billion Words, as the original's
`Vocab.count_file` and `Vocab.encode_file`: each line is tokenized on its own (`tokenization.tokenize_line`),
the vocabulary counts the symbols *without* `<eos>` (it is a special symbol, placed first), and encoding adds
`<eos>` at the end of every line, empty lines included (`add_eos`), or `<S>` at both ends (`add_double_eos`).

`word_corpus` puts these together for WikiText and PTB: `<eos>` first in the vocabulary, `<unk>` for unknown words.
"""
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence, Union

import torch

from labml_txl.data import tokenization
from labml_txl.data.cache import cached
from labml_txl.data.corpus import Corpus
from labml_txl.data.files import iter_text_lines
from labml_txl.data.tokenization import EOS
from labml_txl.data.vocabulary import Vocabulary

_FLUSH = 1 << 20
UNK = '<unk>'


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


def word_corpus(name: str, title: str, files: dict, *, lower_case: bool, counted: Sequence[str], min_freq: int,
                max_size: Optional[int], cache: bool, cache_dir: Optional[Union[str, Path]]) -> Corpus:
    """A word-level corpus from its three files (`files[split]`): `<eos>` at each line end, `<unk>` for unknown
    words, the vocabulary counted over the `counted` splits."""
    sources = [files[s] for s in ('train', 'valid', 'test')]

    def build() -> dict:
        counter = Counter()
        for split in counted:
            count_file(files[split], counter, f'{title} {split} file', lower_case=lower_case)
        vocab = Vocabulary.from_counter(counter, special=[EOS], min_freq=min_freq, max_size=max_size, unk=UNK)
        train, valid, test = (encode_file(files[s], vocab, f'{title} {s} file', ordered=True, add_eos=True,
                                          lower_case=lower_case) for s in ('train', 'valid', 'test'))
        return Corpus(name, vocab, train, valid, test, level='word', lower_case=lower_case).to_payload()

    params = {'min_freq': min_freq, 'max_size': max_size, 'lower_case': lower_case, 'counted': list(counted)}
    payload = cached(name, sources, params, build, (cache_dir or sources[0].parent) if cache else None)
    return Corpus.from_payload(payload)
