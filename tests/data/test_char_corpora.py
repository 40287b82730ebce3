"""Tiny Shakespeare, enwik8 and text8: splits, vocabularies and contents, from files in the published formats."""
import random
import zipfile
from collections import Counter

import pytest
import torch

from labml_txl.data import DataFileFormatError, get_corpus, load_enwik8, load_text8, load_tiny_shakespeare


def most_common_symbols(sequence):
    return [s for s, _ in Counter(sequence).most_common()]


def test_tiny_shakespeare_is_split_90_5_5_in_order():
    text = load_tiny_shakespeare()
    corpus = get_corpus('tiny_shakespeare')
    n = len(text)
    sizes = [corpus.train.numel(), corpus.valid.numel(), corpus.test.numel()]
    assert sizes == [int(0.9 * n), int(0.05 * n), n - int(0.9 * n) - int(0.05 * n)]
    assert corpus.decode(corpus.train) + corpus.decode(corpus.valid) + corpus.decode(corpus.test) == text
    assert corpus.vocab.symbols == most_common_symbols(text)
    assert corpus.n_token == len(set(text))


def test_tiny_shakespeare_from_another_file(tmp_path):
    path = tmp_path / 'play.txt'
    path.write_text('To be, or not to be: that is the question.\n' * 10, encoding='utf-8')
    corpus = get_corpus('tiny_shakespeare', path, train_fraction=0.8, valid_fraction=0.1)
    assert [corpus.train.numel(), corpus.valid.numel(), corpus.test.numel()] == [344, 43, 43]
    assert corpus.decode(corpus.valid) == path.read_text()[344:387]


def enwik8_bytes(n, seed=0):
    rng = random.Random(seed)
    # XML-like ASCII, newlines, and some multi-byte UTF-8
    pieces = ['<page>', '\n', 'the ', 'Zürich ', '[[link]] ', '\n', '日本 ', '&amp; ']
    data = ''.join(rng.choice(pieces) for _ in range(n)).encode('utf-8')
    return data[:n]


@pytest.mark.parametrize('as_zip', [False, True])
def test_enwik8_split_in_bytes_newlines_dropped_as_the_original(tmp_path, as_zip):
    data = enwik8_bytes(1000)
    if as_zip:
        with zipfile.ZipFile(tmp_path / 'enwik8.zip', 'w') as archive:
            archive.writestr('enwik8', data)
    else:
        (tmp_path / 'enwik8').write_bytes(data)
    corpus = get_corpus('enwik8', tmp_path, train_size=800, valid_size=100, test_size=100)
    parts = [data[:800], data[800:900], data[900:]]
    for ids, part in zip((corpus.train, corpus.valid, corpus.test), parts):
        kept = [b for b in part if b != 10]
        assert ids.numel() == len(kept)
        assert [int(s) for s in corpus.vocab.decode(ids)] == kept
    # The original's vocabulary: decimal byte values, by count over the three splits
    assert corpus.vocab.symbols == most_common_symbols([str(b) for b in data if b != 10])
    assert '10' not in corpus.vocab


def test_enwik8_keep_newlines_keeps_every_byte(tmp_path):
    data = enwik8_bytes(1000, seed=3)
    (tmp_path / 'enwik8').write_bytes(data)
    corpus = load_enwik8(tmp_path / 'enwik8', train_size=900, valid_size=50, test_size=50, keep_newlines=True)
    ids = [corpus.train, corpus.valid, corpus.test]
    assert [t.numel() for t in ids] == [900, 50, 50]
    assert b''.join(bytes(int(s) for s in corpus.vocab.decode(t)) for t in ids) == data
    assert corpus.decode(corpus.test) == data[950:].decode('utf-8', errors='replace')


def test_enwik8_sizes_must_add_up_and_train_size_none_takes_the_rest(tmp_path):
    path = tmp_path / 'enwik8'
    path.write_bytes(enwik8_bytes(1000))
    with pytest.raises(DataFileFormatError, match=r'has 1,000 bytes: expected .* = 800 \+ 100 \+ 50 = 950') as e:
        load_enwik8(path, train_size=800, valid_size=100, test_size=50, cache=False)
    assert str(path) in str(e.value)
    corpus = load_enwik8(path, train_size=None, valid_size=100, test_size=50, keep_newlines=True, cache=False)
    assert [corpus.train.numel(), corpus.valid.numel(), corpus.test.numel()] == [850, 100, 50]
    # The published defaults: 90M + 5M + 5M
    with pytest.raises(ValueError, match='90,000,000 \\+ 5,000,000 \\+ 5,000,000 = 100,000,000'):
        load_enwik8(path, cache=False)


@pytest.mark.parametrize('as_zip', [False, True])
def test_text8_split_in_characters_stripped_as_the_original(tmp_path, as_zip):
    rng = random.Random(0)
    words = ['anarchism', 'originated', 'as', 'a', 'term', 'of', 'abuse', 'first', 'used']
    text = ' ' + ' '.join(rng.choice(words) for _ in range(400))
    text = text[:2000]
    if as_zip:
        with zipfile.ZipFile(tmp_path / 'text8.zip', 'w') as archive:
            archive.writestr('text8', text)
    else:
        (tmp_path / 'text8').write_text(text, encoding='utf-8')
    corpus = load_text8(tmp_path, train_size=1800, valid_size=100, test_size=100)
    parts = [text[:1800].strip(), text[1800:1900].strip(), text[1900:].strip()]
    assert [corpus.decode(corpus.train), corpus.decode(corpus.valid), corpus.decode(corpus.test)] == parts
    assert corpus.vocab.symbols == most_common_symbols(''.join(parts))
    assert corpus.n_token == len(set(text))


def test_iterator_of_a_split_and_bad_split_name():
    corpus = get_corpus('tiny_shakespeare')
    data, target, seq_len = next(iter(corpus.get_iterator('valid', bsz=2, bptt=16)))
    half = corpus.valid.numel() // 2
    assert corpus.decode(data[:, 1]) == corpus.decode(corpus.valid[half:half + 16])
    assert torch.equal(target[:, 0], corpus.valid[1:17])
    with pytest.raises(ValueError, match=r"split='dev' is not accepted: split must be 'train', 'valid' or 'test'"):
        corpus.get_iterator('dev', bsz=2, bptt=16)
