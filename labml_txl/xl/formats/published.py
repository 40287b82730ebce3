r"""
# The published Transformer-XL models: their vocabularies, their test text and the paper's test settings

A published model is a Hugging Face TransfoXL folder (`MemTransformerLM.from_pretrained`; the authors' TensorFlow
checkpoints convert to one, `xl/tf_checkpoint.py`) and a vocabulary: Hugging Face's `vocab.pkl` beside the weights,
or the authors' corpus cache (`cache.pkl` of `tf/sota/download.sh`, or the PyTorch code's `cache.pt`), which also
holds the corpus encoded (`data/published_vocabulary.py` reads both without running pickled code).

To score a model on a corpus, its text must be in the model's ids. The authors' cache holds the splits so encoded;
otherwise the corpus is read from its published files (`labml_txl.data.get_corpus`) and each of its symbols is
mapped to the model's id of the same symbol (`in_vocabulary`): this package's loaders build the vocabulary as the
original does, but the order of symbols of equal count may differ (the authors' caches were made by Python 2), so
ids are never assumed equal. The original's text8 files write the space as `'_'`; this package's loader keeps
`' '`, and the mapping takes one for the other.

`PAPER_SETTINGS` are the test settings of the authors' published models (`tf/sota/*.sh`), the same as their PyTorch
scripts' large models (`presets.py`), with the scores the paper reports for them.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from ...configs.presets import PRESETS
from ...data import Corpus, Vocabulary, get_corpus
from ...data.files import DataFileFormatError
from ...data.published_vocabulary import load_authors_cache, vocabulary_from_hf_pickle
from ...data.safe_pickle import PickledObject, load_file
from ...errors import describe_choices

PathLike = Union[str, Path]

# The vocabulary Hugging Face keeps beside a model's weights
HF_VOCABULARY_FILE = 'vocab.pkl'


@dataclass(frozen=True)
class PaperSettings:
    """How the paper tests one published model, and what it reports."""
    preset: str
    tgt_len: int
    mem_len: int
    clamp_len: int
    same_length: bool
    # The test batch size of the authors' `tf/sota` scripts
    batch_size: int
    reported: str


def _paper(preset: str, reported: str) -> PaperSettings:
    row = PRESETS[preset]
    return PaperSettings(preset, row['test_tgt_len'], row['test_mem_len'], row['test_clamp_len'], True, 16, reported)


PAPER_SETTINGS: Dict[str, PaperSettings] = {
    'wt103': _paper('wt103_large', '18.3 perplexity'),
    'enwik8': _paper('enwik8_large', '0.99 bits per character'),
    'text8': _paper('text8_large', '1.08 bits per character'),
    'lm1b': _paper('lm1b_large', '21.8 perplexity'),
}

# The corpora's levels (how text becomes symbols), for a cache that names its dataset
_LEVELS = {'enwik8': 'byte', 'text8': 'char', 'wt103': 'word', 'wt2': 'word', 'ptb': 'word', 'lm1b': 'word'}
# Symbols this package's loaders write otherwise than the original's files: text8's space
_ALIASES = {' ': '_'}


def paper_settings(corpus_name: str) -> PaperSettings:
    """The paper's test settings of the published model of `corpus_name`, or a `ValueError` naming those there are."""
    if corpus_name not in PAPER_SETTINGS:
        raise ValueError(f"paper=True is not accepted with corpus_name={corpus_name!r}: the paper's test settings are "
                         f"known for the published models of {describe_choices(PAPER_SETTINGS)}")
    return PAPER_SETTINGS[corpus_name]


def vocabulary_path(pretrained: PathLike, vocab: Optional[PathLike]) -> Path:
    """`vocab`, or the `vocab.pkl` Hugging Face keeps in the model's folder; an error naming both when neither is."""
    if vocab is not None:
        return Path(vocab)
    beside = Path(pretrained) / HF_VOCABULARY_FILE
    if not beside.is_file():
        raise FileNotFoundError(f"{str(pretrained)!r} has no {HF_VOCABULARY_FILE}: give the model's vocabulary with "
                                f"vocab=PATH (Hugging Face's vocab.pkl, or the authors' cache.pkl or cache.pt)")
    return beside


def read_vocabulary(path: PathLike):
    """`(vocabulary, cache)`: the vocabulary of Hugging Face's `vocab.pkl` (cache None) or of the authors' corpus
    cache, which is returned too (an `AuthorsCache`, with the encoded splits). A file that asks for code is a
    `ForbiddenGlobalError` naming it (a `ValueError`, as the scripts' other errors of the user's files)."""
    content = load_file(path)
    if isinstance(content, PickledObject) and content.pickled_name == 'data_utils.Corpus':
        cache = load_authors_cache(path)
        return cache.vocabulary, cache
    return vocabulary_from_hf_pickle(path), None


def level_of(vocabulary: Vocabulary) -> str:
    """How text becomes the symbols of `vocabulary`: `'byte'` (every symbol a byte's decimal value, as enwik8's),
    `'char'` (single characters) or `'word'`."""
    symbols = [s for s in vocabulary.symbols if s not in vocabulary.special]
    if symbols and all(s.isdigit() and int(s) < 256 for s in symbols):
        return 'byte'
    if symbols and all(len(s) == 1 for s in symbols):
        return 'char'
    return 'word'


def in_vocabulary(corpus: Corpus, vocabulary: Vocabulary) -> Corpus:
    """
    The validation and test splits of `corpus` with their ids mapped to those of the same symbols in `vocabulary` (a
    model's), to score the model on; the training split is left out. A symbol the vocabulary lacks becomes its
    unknown symbol; without one, or when more than 1% of the text would, it is an error naming some of them (the
    vocabulary is then another corpus's).
    """
    def model_id(symbol: str) -> Optional[int]:
        if symbol in vocabulary.index:
            return vocabulary.index[symbol]
        return vocabulary.index.get(_ALIASES.get(symbol))

    ids = [model_id(symbol) for symbol in corpus.vocab.symbols]
    missing = [i for i, found in enumerate(ids) if found is None]
    if missing:
        scored = [t for split in (corpus.valid, corpus.test) for t in _tensors(split)]
        unknown = sum(int(torch.isin(t, torch.tensor(missing)).sum()) for t in scored)
        running = sum(t.numel() for t in scored)
        if vocabulary.unk_index is None or unknown > 0.01 * running:
            examples = ', '.join(repr(corpus.vocab.symbols[i]) for i in missing[:5])
            raise ValueError(f"the model's vocabulary ({len(vocabulary):,} symbols) lacks {len(missing):,} symbols of "
                             f"the {corpus.name} corpus (e.g. {examples}), {unknown:,} of the {running:,} symbols of "
                             f"its validation and test text, and "
                             f"{'has no unknown symbol' if vocabulary.unk_index is None else 'that is more than 1%'}: "
                             f"it is the vocabulary of another corpus; give the model's own with vocab=PATH")
    # The model's id of each of the corpus' ids
    # (-1 for a symbol only the training split has, with no unknown symbol: never read)
    unk = -1 if vocabulary.unk_index is None else vocabulary.unk_index
    table = torch.tensor([unk if i is None else i for i in ids], dtype=torch.long)

    def mapped(split):
        if isinstance(split, torch.Tensor):
            return table[split]
        return [table[s] if isinstance(s, torch.Tensor) else s for s in split]

    no_training = torch.zeros(0, dtype=torch.long) if corpus.ordered else []
    return Corpus(corpus.name, vocabulary, no_training, mapped(corpus.valid), mapped(corpus.test),
                  level=corpus.level, lower_case=corpus.lower_case)


def _tensors(split) -> list:
    """The tensors of a split: itself, or its sentences (a list of file paths has none)."""
    if isinstance(split, torch.Tensor):
        return [split]
    return [s for s in split or [] if isinstance(s, torch.Tensor)]


def text_codec(vocabulary: Vocabulary, cache=None) -> Corpus:
    """A corpus without text that encodes and decodes with `vocabulary` (`Corpus.encode`, `decode`): at the level of
    the dataset the authors' `cache` names, else as the symbols say (`level_of`)."""
    name = cache.dataset if cache is not None and cache.dataset else 'published'
    empty = torch.zeros(0, dtype=torch.long)
    return Corpus(name, vocabulary, empty, empty, empty, level=_LEVELS.get(name, level_of(vocabulary)))


# The corpus that comes with the package (`labml_txl.data.get_corpus` reads it without a path)
BUNDLED_CORPUS = 'tiny_shakespeare'


def evaluation_corpus(vocabulary: Vocabulary, cache, corpus_name: Optional[str] = None,
                      data_path: Optional[PathLike] = None) -> Corpus:
    """
    The text to score a model of `vocabulary` on, in its ids: `corpus_name` read from `data_path` and mapped into
    the vocabulary (`in_vocabulary`; the bundled Tiny Shakespeare needs no `data_path`), or without `data_path` the
    splits of the authors' `cache` (as they encoded them). An error says what to give when neither is there.
    """
    if data_path is not None:
        if corpus_name is None:
            raise ValueError("data_path is given without corpus_name: name the corpus of the files (e.g. "
                             "corpus_name=wt103)")
        return in_vocabulary(get_corpus(corpus_name, data_path), vocabulary)
    if corpus_name == BUNDLED_CORPUS:
        # The bundled corpus needs no files
        return in_vocabulary(get_corpus(corpus_name), vocabulary)
    if cache is None:
        raise ValueError("no text to evaluate on: give corpus_name=NAME data_path=PATH (the corpus' published files; "
                         f"corpus_name={BUNDLED_CORPUS} alone for the bundled one), or vocab=PATH of the authors' "
                         "cache.pkl / cache.pt, which holds the encoded splits")
    if cache.test is None and cache.valid is None:
        raise DataFileFormatError("the authors' cache holds no validation or test split: give corpus_name and "
                                  "data_path")
    name = corpus_name or cache.dataset or 'published'
    level = _LEVELS.get(name, level_of(vocabulary))
    # (the training split is not scored: a stand-in where the cache has none)
    train = cache.train if cache.train is not None else [] if isinstance(cache.test, list) else torch.zeros(0).long()
    return Corpus(name, vocabulary, train, cache.valid, cache.test, level=level)
