"""
# One Billion Words

The One Billion Word benchmark (Chelba et al., 2013), published as
`1-billion-word-language-modeling-benchmark-r13output.tar.gz`. It unpacks to
`1-billion-word-language-modeling-benchmark-r13output/` with

* `training-monolingual.tokenized.shuffled/news.en-00001-of-00100` ... `news.en-00099-of-00100`: the training
  shards, one tokenized sentence a line, sentences shuffled;
* `heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050` ... `-00049-of-00050`: held-out shards.

As the original Transformer-XL (`getdata.sh`), the held-out shard `news.en.heldout-00000-of-00050` serves as both
the validation and the test set, and the vocabulary is read from `1b_word_vocab.txt` (Jozefowicz et al.'s
vocabulary, one `word count` a line, unknown words as `<UNK>`) when that file is in the data folder or given.
Without it, the vocabulary is counted over the training shards: `<S>`, then the words by count, with `min_freq`
and `max_size` (and `<UNK>` for the words left out). Case is kept.

Each sentence is encoded as `<S> w1 ... wn <S>` (the original's `add_double_eos`). The training split stays a list
of shard files, encoded shard by shard as `LMMultiFileIterator` reaches them (the encoded shards would not fit in
memory); validation and test are lists of sentences, cached.
"""
from collections import Counter
from pathlib import Path
from typing import Optional, Union

from .cache import cached
from .corpus import Corpus
from .files import MissingDataFileError, folder_listing, find_file, require_file
from .tokenization import SENTENCE_BOUNDARY
from .vocabulary import Vocabulary
from .word_files import count_file, encode_file

PathLike = Union[str, Path]

RELEASE = '1-billion-word-language-modeling-benchmark-r13output'
TRAIN_FOLDER = 'training-monolingual.tokenized.shuffled'
HELDOUT_FOLDER = 'heldout-monolingual.tokenized.shuffled'
TRAIN_PATTERN = 'news.en-*'
HELDOUT_FILE = 'news.en.heldout-00000-of-00050'
VOCAB_FILE = '1b_word_vocab.txt'
UNK = '<UNK>'


def load_lm1b(path: PathLike, *, vocab_file: Optional[PathLike] = None, min_freq: int = 0,
              max_size: Optional[int] = None, heldout_file: str = HELDOUT_FILE, cache: bool = True,
              cache_dir: Optional[PathLike] = None) -> Corpus:
    """
    One Billion Words from the folder `path` (the release folder, or the folder above it).

    Args:
        path: the folder
        vocab_file: a vocabulary file (`word count` a line); `None` uses `<path>/1b_word_vocab.txt` if it is there,
            else counts the training shards
        min_freq: when counting: leave out words counted fewer times
        max_size: when counting: keep at most this many words besides `<S>`
        heldout_file: the held-out shard used for validation and test
        cache: cache the vocabulary and the encoded held-out sentences
        cache_dir: the cache folder; `None` is `path`
    """
    path = Path(path)
    root = path / RELEASE if (path / RELEASE).is_dir() else path
    train_dir = root / TRAIN_FOLDER
    shards = sorted(train_dir.glob(TRAIN_PATTERN)) if train_dir.is_dir() else []
    if not shards:
        raise MissingDataFileError(f"One Billion Words training shards not found: expected files "
                                   f"{train_dir / TRAIN_PATTERN} (news.en-00001-of-00100 ...)"
                                   f"{folder_listing(train_dir if train_dir.is_dir() else root)}")
    for shard in shards:
        require_file(shard, 'One Billion Words training shard')
    heldout = find_file(root / HELDOUT_FOLDER, [heldout_file], 'One Billion Words held-out file')
    require_file(heldout, 'One Billion Words held-out file')
    if vocab_file is None:
        for folder in (path, root):
            if (folder / VOCAB_FILE).is_file():
                vocab_file = folder / VOCAB_FILE
                break
    if vocab_file is not None:
        vocab_file = require_file(vocab_file, 'One Billion Words vocabulary file')
    sources = shards + [heldout] + ([vocab_file] if vocab_file is not None else [])

    def build() -> dict:
        if vocab_file is not None:
            vocab = Vocabulary.from_file(vocab_file, unk=UNK)
        else:
            counter = Counter()
            for shard in shards:
                count_file(shard, counter, 'One Billion Words training shard')
            vocab = Vocabulary.from_counter(counter, special=[SENTENCE_BOUNDARY], min_freq=min_freq,
                                            max_size=max_size, unk=UNK)
        sentences = encode_file(heldout, vocab, 'One Billion Words held-out file', ordered=False,
                                add_double_eos=True)
        return Corpus('lm1b', vocab, shards, sentences, sentences, level='word').to_payload()

    params = {'vocab_file': str(vocab_file) if vocab_file is not None else None,
              'min_freq': None if vocab_file is not None else min_freq,
              'max_size': None if vocab_file is not None else max_size}
    payload = cached('lm1b', sources, params, build, (cache_dir or path) if cache else None)
    return Corpus.from_payload(payload)
