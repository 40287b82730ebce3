"""WikiText-103, WikiText-2 and PTB from files in their published formats: <eos> per line, the original's vocab."""
from collections import Counter

import pytest

from labml_txl.data import get_corpus, load_ptb

WT_TRAIN = (' \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles is a game . \n'
            ' \n = = Gameplay = = \n \n The game is a <unk> game , and the game sold well . \n')
WT_VALID = ' \n = Homarus gammarus = \n \n Homarus gammarus is a lobster . \n'
WT_TEST = ' \n = Robert Boulter = \n \n Robert Boulter is an English actor . \n'


def write_wikitext(folder, train=WT_TRAIN, valid=WT_VALID, test=WT_TEST):
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (('train', train), ('valid', valid), ('test', test)):
        (folder / f'wiki.{split}.tokens').write_text(text, encoding='utf-8')


def lines_with_eos(text, lower=False):
    """Every line's words then <eos>, blank lines too (the original's add_eos=True)."""
    out = []
    for line in text.split('\n')[:-1]:
        out += (line.lower() if lower else line).split() + ['<eos>']
    return out


def vocab_order(tokens):
    return [t for t, _ in Counter(tokens).most_common()]


def test_wt103_eos_at_every_line_and_vocab_from_train_only(tmp_path):
    write_wikitext(tmp_path / 'wikitext-103')
    corpus = get_corpus('wt103', tmp_path, cache=False)  # found in the wikitext-103/ folder
    train_words = [t for t in lines_with_eos(WT_TRAIN) if t != '<eos>']
    assert corpus.vocab.symbols == ['<eos>'] + vocab_order(train_words)
    assert corpus.vocab.decode(corpus.train) == lines_with_eos(WT_TRAIN)
    assert corpus.train.numel() == len(WT_TRAIN.split()) + WT_TRAIN.count('\n')
    # Words of the validation and test files that training never saw become <unk>
    known = set(corpus.vocab.symbols)
    for split, text in (('valid', WT_VALID), ('test', WT_TEST)):
        expected = [t if t in known else '<unk>' for t in lines_with_eos(text)]
        assert corpus.vocab.decode(getattr(corpus, split)) == expected
    assert 'Homarus' not in corpus.vocab and corpus.vocab.unk == '<unk>'


def test_wt2_counts_all_three_files_as_the_original(tmp_path):
    write_wikitext(tmp_path, train=' a b c\n', valid=' c d\n', test=' d c\n')
    corpus = get_corpus('wt2', tmp_path, cache=False)
    # c is counted 3 times, d twice: both come before a and b; <unk> is not in these files, so it follows <eos>
    assert corpus.vocab.symbols == ['<eos>', '<unk>', 'c', 'd', 'a', 'b']
    assert corpus.vocab.decode(corpus.valid) == ['c', 'd', '<eos>']


def test_wikitext_min_freq_and_max_size_map_rare_words_to_unk(tmp_path):
    write_wikitext(tmp_path)
    corpus = get_corpus('wt103', tmp_path, min_freq=2, cache=False)
    counts = Counter(t for t in lines_with_eos(WT_TRAIN) if t != '<eos>')
    kept = [t for t in vocab_order([t for t in lines_with_eos(WT_TRAIN) if t != '<eos>']) if counts[t] >= 2]
    assert corpus.vocab.symbols == ['<eos>'] + kept
    assert corpus.vocab.decode(corpus.train) == [t if t in kept or t == '<eos>' else '<unk>'
                                                 for t in lines_with_eos(WT_TRAIN)]
    corpus = get_corpus('wt103', tmp_path, max_size=3, cache=False)
    top = vocab_order([t for t in lines_with_eos(WT_TRAIN) if t != '<eos>'])[:3]
    assert corpus.vocab.symbols == ['<eos>'] + ([] if '<unk>' in top else ['<unk>']) + top


def test_ptb_lower_cased_with_eos_from_the_published_names(tmp_path):
    data = tmp_path / 'simple-examples' / 'data'
    data.mkdir(parents=True)
    texts = {'train': " aer banknote N <unk> \n the cat sat\n", 'valid': ' The Cat \n', 'test': ' cat N\n'}
    for split, text in texts.items():
        (data / f'ptb.{split}.txt').write_text(text, encoding='utf-8')
    corpus = load_ptb(tmp_path, cache=False)
    every = [t for s in ('train', 'valid', 'test') for t in lines_with_eos(texts[s], lower=True) if t != '<eos>']
    assert corpus.vocab.symbols == ['<eos>'] + vocab_order(every)
    assert corpus.decode(corpus.valid) == 'the cat <eos>'
    # The original lower-cases PTB, its number token N included
    assert corpus.vocab.decode(corpus.train) == lines_with_eos(texts['train'], lower=True)
    assert 'n' in corpus.vocab and 'N' not in corpus.vocab


def test_unknown_keyword_is_named(tmp_path):
    write_wikitext(tmp_path)
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) 'min_frequency'.*'min_freq'"):
        get_corpus('wt103', tmp_path, min_frequency=2)
