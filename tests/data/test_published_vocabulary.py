"""Published Transformer-XL vocabularies: Hugging Face's vocab.pkl (written here by transformers 4.44.2's own
TransfoXLTokenizer) and the authors' corpus caches (pickled from classes named as theirs), read into a Vocabulary
with the file's symbols and ids, and encoding as HF's tokenizer does; a cache that asks for code is refused."""
import contextlib
import importlib
import os
import pickle
import struct
import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch
from transformers.models.deprecated.transfo_xl.tokenization_transfo_xl import TransfoXLTokenizer

from labml_txl.data.files import DataFileFormatError
from labml_txl.data.published_vocabulary import load_authors_cache, vocabulary_from_authors_cache, \
    vocabulary_from_hf_pickle
from labml_txl.data.safe_pickle import ForbiddenGlobalError

TEXT = ["The cat sat on the mat .", "The dog , the cat and a <unk> met in Zürich .", "A café opened 1,000 days ago ."]
SENTENCE = "The cat met a zebra in Zürich ."  # 'zebra' is not in the vocabulary

# The attributes of the authors' `Vocab` (pytorch/utils/vocabulary.py), which HF's converter saved as vocab.pkl
AUTHORS_VOCAB_ATTRIBUTES = ('counter', 'special', 'min_freq', 'max_size', 'lower_case', 'delimiter', 'vocab_file',
                            'idx2sym', 'sym2idx', 'eos_idx', 'unk_idx')


def counted_tokenizer() -> TransfoXLTokenizer:
    """A tokenizer whose vocabulary is counted as the authors' WikiText one: `<eos>` first, then by count."""
    tokenizer = TransfoXLTokenizer(special=['<eos>'], lower_case=False, clean_up_tokenization_spaces=False)
    tokenizer.count_sents([tokenizer.tokenize(line) + ['<eos>'] for line in TEXT])
    tokenizer.build_vocab()
    return tokenizer


def file_tokenizer(tmp_path) -> TransfoXLTokenizer:
    """A tokenizer whose vocabulary is read from a vocabulary file (`word count` lines), so it has `unk_idx`."""
    path = tmp_path / 'vocab.txt'
    path.write_text('<eos> 9\nthe 7\n<unk> 5\ncat 4\ncafé 3\nZürich 2\n. 2\na 1\n', encoding='utf-8')
    return TransfoXLTokenizer(vocab_file=str(path), clean_up_tokenization_spaces=False)


def check_against_tokenizer(vocabulary, tokenizer, hf_decodes_by_idx2sym=False):
    assert vocabulary.symbols == tokenizer.idx2sym
    assert vocabulary.index == dict(tokenizer.sym2idx)
    tokens = tokenizer.tokenize(SENTENCE) + ['<eos>']
    assert 'zebra' in tokens and 'zebra' not in tokenizer.sym2idx
    ids = tokenizer.convert_tokens_to_ids(tokens)
    assert vocabulary.indices(tokens) == ids
    assert vocabulary.decode(ids) == [t if t in tokenizer.sym2idx else '<unk>' for t in tokens]
    if hf_decodes_by_idx2sym:
        # HF decodes through its added tokens first; a vocabulary counted after the tokenizer was made has
        # <eos>, <unk> and <formula> there at ids 0, 1, 2, so only one that was there from the start (read from a
        # file) decodes by idx2sym
        everything = list(range(len(tokenizer.idx2sym)))
        assert vocabulary.decode(everything) == tokenizer.convert_ids_to_tokens(everything)


@pytest.mark.parametrize('built', ['counted', 'vocabulary file'])
def test_save_vocabulary_pickle_gives_the_tokenizers_vocabulary(tmp_path, built):
    tokenizer = counted_tokenizer() if built == 'counted' else file_tokenizer(tmp_path)
    path, = tokenizer.save_vocabulary(str(tmp_path))
    vocabulary = vocabulary_from_hf_pickle(path)
    check_against_tokenizer(vocabulary, tokenizer, hf_decodes_by_idx2sym=built == 'vocabulary file')
    assert vocabulary.unk == '<unk>'
    assert vocabulary.special == (['<eos>'] if built == 'counted' else [])


def test_the_hubs_vocab_pkl_reads_as_hfs_tokenizer_reads_it(tmp_path, monkeypatch):
    """The hub's file is HF's converter's torch.save (before torch 1.6: the legacy format) of the authors'
    Vocab.__dict__; HF's tokenizer reads it with pickle when trusted."""
    counted = counted_tokenizer()
    path = tmp_path / 'vocab.pkl'
    state = {k: counted.__dict__[k] for k in AUTHORS_VOCAB_ATTRIBUTES if k in counted.__dict__}
    torch.save(state, path, _use_new_zipfile_serialization=False)
    monkeypatch.setenv('TRUST_REMOTE_CODE', 'True')
    tokenizer = TransfoXLTokenizer(pretrained_vocab_file=str(path), clean_up_tokenization_spaces=False)
    vocabulary = vocabulary_from_hf_pickle(path)
    check_against_tokenizer(vocabulary, tokenizer, hf_decodes_by_idx2sym=True)
    assert vocabulary.special == ['<eos>'] and vocabulary.unk == '<unk>'


@contextlib.contextmanager
def throwaway_modules(folder, sources):
    """The modules `sources` (path: source) written in `folder` and importable only inside the block."""
    names = [p[:-3].replace('/', '.').replace('.__init__', '') for p in sources]
    clashing = [n for n in names if n.split('.')[0] in sys.modules]
    assert not clashing, f'a module named {clashing} is already imported'
    for relative, source in sources.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(source)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield {n: importlib.import_module(n) for n in names}
    finally:
        sys.path.remove(str(folder))
        for n in names:
            sys.modules.pop(n, None)


PYTORCH_CLASSES = {'data_utils.py': 'class Corpus(object):\n    pass\n', 'utils/__init__.py': '',
                   'utils/vocabulary.py': 'class Vocab(object):\n    pass\n'}


def authors_corpus(modules, vocab_module, tokenizer, dataset, split_ids):
    """A `data_utils.Corpus` as the authors' code pickles it: its `Vocab` and the splits."""
    vocab = modules[vocab_module].Vocab()
    vars(vocab).update({k: tokenizer.__dict__[k] for k in AUTHORS_VOCAB_ATTRIBUTES if k in tokenizer.__dict__})
    corpus = modules['data_utils'].Corpus()
    corpus.dataset, corpus.vocab = dataset, vocab
    corpus.train, corpus.valid, corpus.test = split_ids
    return corpus


def encode(tokenizer, lines):
    """The ids of the lines with `<eos>` after each, as the authors' encode_file(ordered=True)."""
    unk = tokenizer.sym2idx['<unk>']
    return [tokenizer.sym2idx.get(s, unk) for line in lines for s in tokenizer.tokenize(line) + ['<eos>']]


@pytest.mark.parametrize('legacy', [False, True])
def test_the_authors_pytorch_cache_gives_vocabulary_and_splits(tmp_path, legacy):
    tokenizer = counted_tokenizer()
    splits = [torch.tensor(encode(tokenizer, lines)) for lines in (TEXT, [SENTENCE], TEXT[:1])]
    path = tmp_path / 'cache.pt'
    with throwaway_modules(tmp_path / 'code', PYTORCH_CLASSES) as modules:
        torch.save(authors_corpus(modules, 'utils.vocabulary', tokenizer, 'wt103', splits), path,
                   _use_new_zipfile_serialization=not legacy)
    cache = load_authors_cache(path)
    assert 'data_utils' not in sys.modules and 'utils.vocabulary' not in sys.modules
    check_against_tokenizer(cache.vocabulary, tokenizer)
    assert cache.vocabulary.special == ['<eos>'] and cache.dataset == 'wt103'
    for loaded, saved in zip((cache.train, cache.valid, cache.test), splits):
        assert loaded.dtype == torch.int64 and torch.equal(loaded, saved)
    assert cache.vocabulary.decode(cache.valid) == \
        [t if t in tokenizer.sym2idx else '<unk>' for t in tokenizer.tokenize(SENTENCE)] + ['<eos>']
    assert vocabulary_from_authors_cache(path) == cache.vocabulary


def test_the_authors_one_billion_words_cache_keeps_sentences_and_paths(tmp_path):
    tokenizer = file_tokenizer(tmp_path)
    sentences = [torch.tensor(encode(tokenizer, [line])) for line in TEXT]
    paths = ['data/news.en-00001-of-00100', 'data/news.en-00002-of-00100']
    path = tmp_path / 'cache.pt'
    with throwaway_modules(tmp_path / 'code', PYTORCH_CLASSES) as modules:
        torch.save(authors_corpus(modules, 'utils.vocabulary', tokenizer, 'lm1b', (paths, sentences, sentences)),
                   path)
    cache = load_authors_cache(path)
    assert cache.train == paths and cache.dataset == 'lm1b'
    assert len(cache.valid) == 3 and all(torch.equal(a, b) for a, b in zip(cache.valid, sentences))
    assert cache.vocabulary.unk == tokenizer.idx2sym[tokenizer.unk_idx] == '<unk>'


class Python2Pickler(pickle._Pickler):
    """Writes `bytes` with the opcodes of Python 2's `str`, as the authors' Python 2 code wrote cache.pkl."""
    dispatch = dict(pickle._Pickler.dispatch)

    def save_python2_str(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack('<i', len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_python2_str


# Under Python 2 the attribute names and the symbols were `str`, the bytes of UTF-8 text
PYTHON2_STATE = '    def __getstate__(self):\n        return {k.encode(): v for k, v in vars(self).items()}\n'


@pytest.mark.parametrize('writer', ['python 3', 'python 2'])
def test_the_authors_tensorflow_cache_pkl_with_numpy_splits(tmp_path, writer):
    tokenizer = counted_tokenizer()
    splits = [np.array(encode(tokenizer, lines), dtype=np.int64) for lines in (TEXT, [SENTENCE], TEXT[:1])]
    body = PYTHON2_STATE if writer == 'python 2' else '    pass\n'
    path = tmp_path / 'cache.pkl'
    with throwaway_modules(tmp_path / 'code', {'data_utils.py': f'class Corpus(object):\n{body}',
                                               'vocabulary.py': f'class Vocab(object):\n{body}'}) as modules:
        corpus = authors_corpus(modules, 'vocabulary', tokenizer, 'wt103', splits)
        if writer == 'python 2':
            vocab = corpus.vocab
            vocab.idx2sym = [s.encode() for s in vocab.idx2sym]
            vocab.sym2idx = OrderedDict((s.encode(), i) for s, i in vocab.sym2idx.items())
            vocab.special = [s.encode() for s in vocab.special]
            corpus.dataset = b'wt103'
            with open(path, 'wb') as f:
                Python2Pickler(f, protocol=2).dump(corpus)
            # numpy 1, which Python 2 had, named the module numpy.core
            path.write_bytes(path.read_bytes().replace(b'cnumpy._core.multiarray\n', b'cnumpy.core.multiarray\n'))
        else:
            with open(path, 'wb') as f:
                pickle.dump(corpus, f, protocol=2)  # as tf/data_utils.py
    cache = load_authors_cache(path)
    check_against_tokenizer(cache.vocabulary, tokenizer)
    assert 'café' in cache.vocabulary and 'Zürich' in cache.vocabulary
    assert cache.dataset == 'wt103' and cache.vocabulary.special == ['<eos>']
    for loaded, saved in zip((cache.train, cache.valid, cache.test), splits):
        assert torch.equal(loaded, torch.from_numpy(saved))


class SystemCall:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_cache_that_asks_for_code_is_refused_and_does_not_run_it(tmp_path):
    marker, path = tmp_path / 'ran', tmp_path / 'cache.pt'
    tokenizer = counted_tokenizer()
    with throwaway_modules(tmp_path / 'code', PYTORCH_CLASSES) as modules:
        corpus = authors_corpus(modules, 'utils.vocabulary', tokenizer, 'wt103', (None, None, None))
        corpus.vocab.counter = SystemCall(f'touch {marker}')
        torch.save(corpus, path)
    with pytest.raises(ForbiddenGlobalError) as info:
        vocabulary_from_authors_cache(path)
    assert (info.value.module, info.value.name) == (os.system.__module__, 'system') and info.value.source == path
    assert not marker.exists()


def test_files_of_the_wrong_kind_or_inconsistent(tmp_path):
    tokenizer = counted_tokenizer()
    hf_path, = tokenizer.save_vocabulary(str(tmp_path))
    with pytest.raises(DataFileFormatError, match='vocabulary_from_hf_pickle'):
        load_authors_cache(hf_path)

    cache_path = tmp_path / 'cache.pt'
    with throwaway_modules(tmp_path / 'code', PYTORCH_CLASSES) as modules:
        torch.save(authors_corpus(modules, 'utils.vocabulary', tokenizer, 'wt103', (torch.tensor([0, 99]),) * 3),
                   cache_path)
    with pytest.raises(DataFileFormatError, match='load_authors_cache'):
        vocabulary_from_hf_pickle(cache_path)
    with pytest.raises(DataFileFormatError, match=rf'train holds ids from 0 to 99, .* ids 0 to {len(tokenizer.idx2sym) - 1}'):
        load_authors_cache(cache_path)

    state = {'idx2sym': ['<eos>', 'a', 'b'], 'sym2idx': {'<eos>': 0, 'a': 2, 'b': 1}}
    for broken, message in [(state, "sym2idx gives 'a' the id 2 and idx2sym gives it 1"),
                            ({'idx2sym': ['a']}, 'has no sym2idx: .* it has idx2sym'),
                            ({'idx2sym': ['a', 'a'], 'sym2idx': {'a': 1}}, "has 'a' twice"),
                            ([1, 2], 'holds a list: expected a dictionary')]:
        path = tmp_path / 'broken.pkl'
        path.write_bytes(pickle.dumps(broken))
        with pytest.raises(DataFileFormatError, match=message):
            vocabulary_from_hf_pickle(path)
