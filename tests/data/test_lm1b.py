"""One Billion Words: the published folder layout, the vocabulary file, <S> ... <S>, shuffled shard streams."""
import random
from collections import Counter

import torch

from labml_txl.data import get_corpus

RELEASE = '1-billion-word-language-modeling-benchmark-r13output'


def write_lm1b(root, n_shards=3, sentences_per_shard=20, seed=0, vocab_file=True):
    rng = random.Random(seed)
    words = ['the', 'cat', 'sat', 'on', 'a', 'mat', 'and', 'dog', 'ran', ',', '.', 'Obama', 'said']
    train_dir = root / RELEASE / 'training-monolingual.tokenized.shuffled'
    heldout_dir = root / RELEASE / 'heldout-monolingual.tokenized.shuffled'
    train_dir.mkdir(parents=True)
    heldout_dir.mkdir(parents=True)
    shards = []
    for k in range(1, n_shards + 1):
        lines = [' '.join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(sentences_per_shard)]
        (train_dir / f'news.en-{k:05d}-of-00100').write_text('\n'.join(lines) + '\n', encoding='utf-8')
        shards.append(lines)
    heldout = ['the cat said hello .', 'Obama ran']
    (heldout_dir / 'news.en.heldout-00000-of-00050').write_text('\n'.join(heldout) + '\n', encoding='utf-8')
    if vocab_file:
        (root / '1b_word_vocab.txt').write_text(
            '<S> 0\n</S> 0\n<UNK> 0\n' + ''.join(f'{w} {100 - i}\n' for i, w in enumerate(words)), encoding='utf-8')
    return words, shards, heldout


def test_vocabulary_file_and_heldout_as_valid_and_test(tmp_path):
    words, shards, heldout = write_lm1b(tmp_path)
    corpus = get_corpus('lm1b', tmp_path, cache=False)
    assert corpus.vocab.symbols == ['<S>', '</S>', '<UNK>'] + words
    for split in (corpus.valid, corpus.test):
        assert [corpus.vocab.decode(s) for s in split] == [
            ['<S>'] + [w if w in words else '<UNK>' for w in line.split()] + ['<S>'] for line in heldout]
    assert [p.name for p in corpus.train] == [f'news.en-{k:05d}-of-00100' for k in (1, 2, 3)]


def test_vocabulary_counted_from_the_shards_without_a_file(tmp_path):
    _, shards, _ = write_lm1b(tmp_path, vocab_file=False)
    corpus = get_corpus('lm1b', tmp_path / RELEASE, min_freq=3, cache=False)
    counts = Counter(w for lines in shards for line in lines for w in line.split())
    kept = [w for w, c in counts.most_common() if c >= 3]
    assert corpus.vocab.symbols == ['<S>', '<UNK>'] + kept


def sentence_ids(corpus, shards):
    return [corpus.vocab.encode(['<S>'] + line.split() + ['<S>']) for lines in shards for line in lines]


def test_training_stream_yields_every_sentence_once_per_epoch(tmp_path):
    _, shards, _ = write_lm1b(tmp_path)
    corpus = get_corpus('lm1b', tmp_path, cache=False)
    it = corpus.get_iterator('train', bsz=4, bptt=5, seed=7, drop_last=False)
    batches = list(it)
    pairs = Counter()
    for data, target, seq_len in batches:
        assert data.shape == target.shape == (5, 4) and seq_len == 5
        for x, y in zip(data[target != -1].tolist(), target[target != -1].tolist()):
            pairs[x, y] += 1
    expected = Counter()
    for s in sentence_ids(corpus, shards):
        expected.update(zip(s[:-1].tolist(), s[1:].tolist()))
    assert pairs == expected
    # Repeatable for a seed; the next epoch is shuffled differently
    again = list(corpus.get_iterator('train', bsz=4, bptt=5, seed=7, drop_last=False))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches, again)) and len(batches) == len(again)
    second = list(it)
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(batches, second))


def test_heldout_iterator_streams_the_sentences_in_order(tmp_path):
    _, _, heldout = write_lm1b(tmp_path)
    corpus = get_corpus('lm1b', tmp_path, cache=False)
    data, target, seq_len = next(iter(corpus.get_iterator('valid', bsz=1, bptt=8, drop_last=False)))
    stream = [w for line in heldout for w in ['<S>'] + line.split()] + ['<S>']
    known = set(corpus.vocab.symbols)
    stream = [w if w in known else '<UNK>' for w in stream]
    assert corpus.vocab.decode(data[:, 0]) == stream[:8] and corpus.vocab.decode(target[:, 0]) == stream[1:9]
