"""The vocabulary: the original's order (specials, then most_common), min_freq, max_size, <unk>, files."""
import random
from collections import Counter

import pytest
import torch

from labml_txl.data.char_level import build_code_vocabulary, code_counts
from labml_txl.data.tokenization import tokenize_chars
from labml_txl.data.vocabulary import Vocabulary


def by_count_then_first_seen(tokens):
    """The expected order, computed without Counter.most_common."""
    first = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    counts = {t: tokens.count(t) for t in first}
    return sorted(first, key=lambda t: (-counts[t], first[t]))


def test_specials_first_then_by_count_ties_by_first_occurrence():
    tokens = 'b a c a b d e e e'.split()
    vocab = Vocabulary.from_counter(Counter(tokens), special=['<eos>'])
    assert vocab.symbols == ['<eos>'] + by_count_then_first_seen(tokens)
    assert vocab.symbols == ['<eos>', 'e', 'b', 'a', 'c', 'd']
    assert vocab.index_of('<eos>') == 0 and len(vocab) == 6


def test_min_freq_and_max_size_leave_symbols_out_and_add_unk_after_specials():
    rng = random.Random(0)
    tokens = [rng.choice('abcdefghij') for _ in range(500)] + ['k']
    expected = by_count_then_first_seen(tokens)
    counts = Counter(tokens)
    vocab = Vocabulary.from_counter(counts, special=['<eos>'], min_freq=2, unk='<unk>')
    assert vocab.symbols == ['<eos>', '<unk>'] + [t for t in expected if counts[t] >= 2]
    assert vocab.encode(['k', 'zzz', expected[0]]).tolist() == [1, 1, 2]
    vocab = Vocabulary.from_counter(counts, special=['<eos>'], max_size=3, unk='<unk>')
    assert vocab.symbols == ['<eos>', '<unk>'] + expected[:3]


def test_unk_in_the_data_keeps_its_place_by_count():
    tokens = ['<unk>'] * 3 + ['a'] * 5 + ['b']
    vocab = Vocabulary.from_counter(Counter(tokens), special=['<eos>'], unk='<unk>')
    assert vocab.symbols == ['<eos>', 'a', '<unk>', 'b']
    assert vocab.index_of('never-seen') == 2


def test_encode_decode_round_trip_and_unknown_symbol_without_unk():
    vocab = Vocabulary(['x', 'y', 'z'])
    ids = vocab.encode(['z', 'x', 'y', 'z'])
    assert ids.dtype == torch.long and ids.tolist() == [2, 0, 1, 2]
    assert vocab.decode(ids) == ['z', 'x', 'y', 'z']
    with pytest.raises(KeyError, match="'w' is not in the vocabulary"):
        vocab.encode(['x', 'w'])
    with pytest.raises(IndexError, match='token id 3 is out of range'):
        vocab.decode([3])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='min_freq=-1'):
        Vocabulary.from_counter(Counter('ab'), min_freq=-1)
    with pytest.raises(ValueError, match='max_size=0'):
        Vocabulary.from_counter(Counter('ab'), max_size=0)
    with pytest.raises(ValueError, match="'a' twice"):
        Vocabulary(['a', 'b', 'a'])


def test_vocabulary_file_in_file_order_with_its_unk(tmp_path):
    path = tmp_path / '1b_word_vocab.txt'
    path.write_text('<S> 0\n</S> 0\n<UNK> 0\nthe 100\n, 90\n\nof 80\nthe 3\n', encoding='utf-8')
    vocab = Vocabulary.from_file(path)
    assert vocab.symbols == ['<S>', '</S>', '<UNK>', 'the', ',', 'of']
    assert vocab.encode(['the', 'zebra']).tolist() == [3, 2]
    path.write_text('a 1\nb 2\n', encoding='utf-8')
    with pytest.raises(ValueError, match=r"has no unknown symbol '<UNK>'"):
        Vocabulary.from_file(path)


def test_code_counting_matches_a_counter_over_characters():
    rng = random.Random(1)
    alphabet = 'abcdé\n ✓xyz'
    parts = [''.join(rng.choice(alphabet) for _ in range(n)) for n in (300, 40, 50)]
    text = ''.join(parts)
    assert code_counts([tokenize_chars(p) for p in parts]) == \
        [(ord(c), n) for c, n in Counter(text).most_common()]
    vocab = build_code_vocabulary([tokenize_chars(p) for p in parts], chr)
    assert vocab.symbols == by_count_then_first_seen(list(text))
