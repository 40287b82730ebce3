"""
# Word-level corpora

`word_corpus` builds WikiText and PTB from their three line-per-sentence files, counted and encoded as the
original does (`word_files.py`): `<eos>` first in the vocabulary and at the end of every line, `<unk>` for unknown
words.
"""
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence, Union

from .cache import cached
from .corpus import Corpus
from .tokenization import EOS
from .vocabulary import Vocabulary
from .word_files import count_file, encode_file

UNK = '<unk>'


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
