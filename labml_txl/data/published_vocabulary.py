"""
# Published Transformer-XL vocabularies

The published models come with their vocabulary as a pickle; these functions read it with `safe_pickle` (which
runs no code) and return this package's `Vocabulary`, with the file's symbols in the file's id order, so text is
encoded and decoded as the model was trained.

* **Hugging Face's `vocab.pkl`.** On the hub (`transfo-xl/transfo-xl-wt103`) it is HF's converter's `torch.save` of
  the authors' `Vocab.__dict__`; `TransfoXLTokenizer.save_vocabulary` (transformers 4.44) pickles the tokenizer's
  `__dict__`. Both are a dictionary with the original's attributes: `idx2sym` (symbols in id order), `sym2idx`
  (symbol to id), `special`, `counter`, and `unk_idx` when the vocabulary was read from a file.
* **The authors' corpus cache.** Their TensorFlow code pickles a `data_utils.Corpus` to `cache.pkl` (protocol 2, the
  `tf/sota/download.sh` files), whose `vocab` is a `vocabulary.Vocab` and whose `train`, `valid`, `test` are numpy
  arrays of ids; their PyTorch code `torch.save`s the same `Corpus` to `cache.pt`, with a `utils.vocabulary.Vocab` and
  `LongTensor`s. Both give their `Vocab`'s attributes and the encoded splits.

Unknown symbols map as HF's tokenizer maps them: to `idx2sym[unk_idx]` when the file has `unk_idx`, else to
`<unk>`, else to `<UNK>`, else they are an error. The original's `Vocab` maps them only through `unk_idx` (the
WikiText-103 one has none, and fails on a word it never saw); HF's fallback to `<unk>` is kept because the published
vocabularies were used through it. `special` lists the file's special symbols that are in the vocabulary (a
vocabulary read from a file lists specials it does not hold). The tokens HF's tokenizer adds after the vocabulary
(`<formula>`, given as an additional special token) are not symbols of the file and get no id here: a published
model has no embedding for them.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Union

import torch

from .files import DataFileFormatError
from .safe_pickle import NumpyArray, PickledObject, load_file
from .vocabulary import Vocabulary

PathLike = Union[str, Path]

# The class names of the authors' `Vocab`: PyTorch code (`utils/vocabulary.py`) and TensorFlow code (`vocabulary.py`)
_AUTHORS_VOCAB = ('utils.vocabulary.Vocab', 'vocabulary.Vocab')


def _describe(value) -> str:
    if isinstance(value, PickledObject):
        return f'a pickled {value.pickled_name}'
    return f'a {type(value).__name__}'


def _text(value, what: str, source: PathLike) -> str:
    """`value` as a string: Python 2's strings were the bytes of UTF-8 text and arrive as `bytes`."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode('utf-8')
        except UnicodeDecodeError as e:
            raise DataFileFormatError(f"{source}: {what} is {value!r}, which is not UTF-8 ({e})") from None
    raise DataFileFormatError(f"{source}: {what} is {_describe(value)} ({value!r:.60}): expected a string")


def vocabulary_from_state(state: Mapping, source: PathLike) -> Vocabulary:
    """The `Vocabulary` of the attributes of the original's `Vocab` (or of HF's `TransfoXLTokenizer`).

    Args:
        state: the attributes: `idx2sym` and `sym2idx` (required, and in agreement), `special`, `unk_idx`
        source: the file they come from, for error messages
    """
    for key in ('idx2sym', 'sym2idx'):
        if key not in state:
            raise DataFileFormatError(
                f"{source} has no {key}: expected the attributes of a Transformer-XL vocabulary, idx2sym (the "
                f"symbols in id order) and sym2idx (symbol to id); it has {', '.join(map(str, state)) or 'none'}")
    idx2sym, sym2idx = state['idx2sym'], state['sym2idx']
    if not isinstance(idx2sym, list):
        raise DataFileFormatError(f"{source}: idx2sym is {_describe(idx2sym)}: expected a list of symbols")
    if not isinstance(sym2idx, Mapping):
        raise DataFileFormatError(f"{source}: sym2idx is {_describe(sym2idx)}: expected a dictionary of symbol to id")
    symbols = [_text(s, f'idx2sym[{i}]', source) for i, s in enumerate(idx2sym)]
    try:
        vocabulary = Vocabulary(symbols)
    except ValueError as e:
        raise DataFileFormatError(f"{source}: idx2sym cannot be a vocabulary: {e}") from None
    index = {_text(s, 'a key of sym2idx', source): i for s, i in sym2idx.items()}
    if index != vocabulary.index:
        for s in sorted(set(index) | set(vocabulary.index), key=lambda s: vocabulary.index.get(s, len(symbols))):
            if index.get(s) != vocabulary.index.get(s):
                raise DataFileFormatError(
                    f"{source}: sym2idx gives {s!r} the id {index.get(s)} and idx2sym gives it "
                    f"{vocabulary.index.get(s)}: a vocabulary file has them agree (encoding reads sym2idx, decoding "
                    f"idx2sym)")

    unk_idx = state.get('unk_idx')
    if unk_idx is not None:
        if isinstance(unk_idx, bool) or not isinstance(unk_idx, int) or not 0 <= unk_idx < len(symbols):
            raise DataFileFormatError(f"{source}: unk_idx={unk_idx!r} is not an id of its {len(symbols)} symbols")
        unk = symbols[unk_idx]
    else:
        unk = next((u for u in ('<unk>', '<UNK>') if u in vocabulary.index), None)
    special = state.get('special') or []
    if not isinstance(special, (list, tuple)):
        raise DataFileFormatError(f"{source}: special is {_describe(special)}: expected a list of symbols")
    special = [s for s in (_text(s, f'special[{i}]', source) for i, s in enumerate(special)) if s in vocabulary]
    return Vocabulary(symbols, special=special, unk=unk)


def vocabulary_from_hf_pickle(path: PathLike) -> Vocabulary:
    """The vocabulary of Hugging Face's TransfoXL `vocab.pkl` (the hub's, or `save_vocabulary`'s).

    Args:
        path: the file; read without running any code it holds (`safe_pickle`)

    Raises `ForbiddenGlobalError` for a pickle that asks for anything but data, `DataFileFormatError` for a file
    that is not such a vocabulary.
    """
    state = load_file(path)
    if isinstance(state, PickledObject) and state.pickled_name == 'data_utils.Corpus':
        raise DataFileFormatError(f"{path} holds the authors' data_utils.Corpus (a corpus cache): read it with "
                                  f"load_authors_cache or vocabulary_from_authors_cache")
    if not isinstance(state, Mapping):
        raise DataFileFormatError(f"{path} holds {_describe(state)}: expected a dictionary of the vocabulary's "
                                  f"attributes (idx2sym, sym2idx, ...) as HF's TransfoXLTokenizer writes vocab.pkl")
    return vocabulary_from_state(state, path)


Split = Union[None, torch.Tensor, List[torch.Tensor], List[str]]


@dataclass
class AuthorsCache:
    """What the authors' `cache.pkl` / `cache.pt` holds.

    Attributes:
        vocabulary: the corpus' vocabulary
        dataset: the corpus name the file records (`'wt103'`, `'enwik8'`, `'lm1b'`, ...)
        train, valid, test: each split's ids as one `int64` tensor (the ordered corpora); for One Billion Words a
            list of tensors, one a sentence (PyTorch's valid and test), or the list of training file paths (train)
    """
    vocabulary: Vocabulary
    dataset: Optional[str]
    train: Split
    valid: Split
    test: Split


def _split(value, name: str, n_token: int, source: PathLike) -> Split:
    if value is None:
        return None
    if isinstance(value, NumpyArray):
        value = value.tensor
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise DataFileFormatError(f"{source}: {name} holds {value.dtype} values: expected token ids (integers)")
        value = value.long()
        if value.numel() and not (0 <= int(value.min()) and int(value.max()) < n_token):
            raise DataFileFormatError(
                f"{source}: {name} holds ids from {int(value.min())} to {int(value.max())}, and the vocabulary has "
                f"ids 0 to {n_token - 1}: the ids were not encoded with this vocabulary")
        return value
    if isinstance(value, list):
        if all(isinstance(v, (str, bytes)) for v in value):
            return [_text(v, f'{name}[{i}]', source) for i, v in enumerate(value)]
        return [_split(v, f'{name}[{i}]', n_token, source) for i, v in enumerate(value)]
    raise DataFileFormatError(f"{source}: {name} is {_describe(value)}: expected the ids of the split (an array or a "
                              f"tensor), a list of them, or a list of file paths")


def load_authors_cache(path: PathLike) -> AuthorsCache:
    """The vocabulary and encoded splits of the authors' corpus cache: TensorFlow's `cache.pkl`, PyTorch's `cache.pt`.

    Args:
        path: the file; read without running any code it holds (`safe_pickle`)

    Raises `ForbiddenGlobalError` for a pickle that asks for anything but data, `DataFileFormatError` for a file
    that is not such a cache.
    """
    corpus = load_file(path)
    if not (isinstance(corpus, PickledObject) and corpus.pickled_name == 'data_utils.Corpus'):
        hint = ' (a dictionary is what HF writes: read it with vocabulary_from_hf_pickle)' \
            if isinstance(corpus, Mapping) else ''
        raise DataFileFormatError(f"{path} holds {_describe(corpus)}: expected the authors' data_utils.Corpus{hint}")
    vocab = getattr(corpus, 'vocab', None)
    if not (isinstance(vocab, PickledObject) and vocab.pickled_name in _AUTHORS_VOCAB):
        raise DataFileFormatError(f"{path}: the corpus' vocab is {_describe(vocab)}: expected "
                                  f"{' or '.join(_AUTHORS_VOCAB)}")
    vocabulary = vocabulary_from_state(vars(vocab), path)
    dataset = getattr(corpus, 'dataset', None)
    splits = {name: _split(getattr(corpus, name, None), name, len(vocabulary), path)
              for name in ('train', 'valid', 'test')}
    return AuthorsCache(vocabulary, None if dataset is None else _text(dataset, 'dataset', path), **splits)


def vocabulary_from_authors_cache(path: PathLike) -> Vocabulary:
    """The vocabulary of the authors' `cache.pkl` / `cache.pt` (`load_authors_cache(path).vocabulary`)."""
    return load_authors_cache(path).vocabulary
