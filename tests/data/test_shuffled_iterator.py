"""LMShuffledIterator: sentences streamed into columns, each token once per epoch, shuffles repeatable."""
import random
from collections import Counter

import pytest
import torch

from labml_txl.data import LMShuffledIterator


def make_sentences(n=40, seed=0):
    rng = random.Random(seed)
    # Distinct ids per sentence so that a pair (input, target) says which sentence it came from
    return [torch.tensor([1000 * k + i for i in range(rng.randint(2, 11))]) for k in range(n)]


def next_token_pairs(batches):
    pairs = Counter()
    for data, target, _ in batches:
        rows = target.shape[0]
        inputs = data[-rows:]
        keep = target != -1
        pairs.update(zip(inputs[keep].tolist(), target[keep].tolist()))
    return pairs


def expected_pairs(sentences):
    return Counter(p for s in sentences for p in zip(s[:-1].tolist(), s[1:].tolist()))


@pytest.mark.parametrize('shuffle', [False, True])
def test_every_sentence_once_per_epoch_without_drop_last(shuffle):
    sentences = make_sentences()
    it = LMShuffledIterator(sentences, bsz=3, bptt=4, shuffle=shuffle, seed=1, drop_last=False)
    batches = list(it)
    assert all(d.shape == t.shape == (4, 3) and s == 4 for d, t, s in batches)
    assert next_token_pairs(batches) == expected_pairs(sentences)
    # Targets of each column continue from sentence to sentence with no gap before the end
    for col in range(3):
        targets = torch.cat([t[:, col] for _, t, _ in batches])
        valid = (targets != -1).nonzero().reshape(-1)
        assert valid.tolist() == list(range(len(valid)))


def test_in_order_fills_the_first_column_with_the_first_sentences():
    sentences = make_sentences(20)
    data, target, _ = next(iter(LMShuffledIterator(sentences, bsz=2, bptt=30)))
    tokens_in_order = torch.cat([s[1:] for s in sentences])
    assert target[:, 0].tolist() == tokens_in_order[:30].tolist()


def test_drop_last_gives_the_same_batches_but_only_full_ones():
    sentences = make_sentences(50)
    full = list(LMShuffledIterator(sentences, 4, 5, shuffle=True, seed=3, drop_last=False))
    dropped = list(LMShuffledIterator(sentences, 4, 5, shuffle=True, seed=3))
    assert 0 < len(dropped) < len(full)
    for (d, t, _), (fd, ft, _) in zip(dropped, full):
        assert torch.equal(d, fd) and torch.equal(t, ft) and bool((t != -1).all())
    assert bool((full[len(dropped)][1] == -1).any())


def test_shuffle_is_repeatable_per_seed_and_epoch_and_resumes_at_an_epoch():
    sentences = make_sentences(30)
    it = LMShuffledIterator(sentences, 2, 6, shuffle=True, seed=11)
    epoch0, epoch1 = [t for _, t, _ in it], [t for _, t, _ in it]
    assert any(not torch.equal(a, b) for a, b in zip(epoch0, epoch1))
    same = LMShuffledIterator(sentences, 2, 6, shuffle=True, seed=11)
    assert all(torch.equal(a, b) for a, b in zip(epoch0, [t for _, t, _ in same]))
    resumed = LMShuffledIterator(sentences, 2, 6, shuffle=True, seed=0)
    resumed.load_state_dict({'epoch': 1, 'seed': 11})
    assert all(torch.equal(a, b) for a, b in zip(epoch1, [t for _, t, _ in resumed]))


def test_ext_len_carries_the_last_input_rows():
    batches = list(LMShuffledIterator(make_sentences(30), 2, 5, ext_len=3))
    assert batches[0][0].shape == (5, 2)
    for (prev, _, _), (data, target, _) in zip(batches, batches[1:]):
        assert data.shape == (8, 2) and target.shape == (5, 2)
        assert torch.equal(data[:3], prev[-3:])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='bsz=0'):
        LMShuffledIterator(make_sentences(3), 0, 5)
    with pytest.raises(ValueError, match=r'data\[1\]'):
        LMShuffledIterator([torch.arange(3), torch.zeros(2, 2)], 1, 5)
