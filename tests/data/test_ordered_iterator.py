"""LMOrderedIterator: columns, bptt segments, ext_len, variable lengths, exact resume."""
import pytest
import torch

from labml_txl.data import LMOrderedIterator


def columns(stream, bsz):
    """The original's batchify, written with lists: bsz equal columns, the tail dropped."""
    n = len(stream) // bsz
    return [stream[j * n:(j + 1) * n] for j in range(bsz)]


def check_covers_every_target_once(batches, stream, bsz, ext_len):
    """Targets concatenated down the batches == each column shifted by one; inputs == the ext_len window."""
    cols = columns(stream, bsz)
    targets = [[] for _ in range(bsz)]
    i = 0
    for data, target, seq_len in batches:
        assert target.shape == (seq_len, bsz)
        begin = max(0, i - ext_len)
        assert data.shape == (i + seq_len - begin, bsz)
        for j in range(bsz):
            assert data[:, j].tolist() == cols[j][begin:i + seq_len]
            targets[j] += target[:, j].tolist()
        i += seq_len
    for j in range(bsz):
        assert targets[j] == cols[j][1:]


@pytest.mark.parametrize('n, bsz, bptt, ext_len', [(103, 4, 5, 0), (103, 4, 5, 3), (100, 1, 7, 10),
                                                   (61, 3, 20, 2), (20, 10, 3, 0)])
def test_fixed_length_covers_every_token_once_in_order(n, bsz, bptt, ext_len):
    stream = torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    it = LMOrderedIterator(torch.tensor(stream), bsz, bptt, ext_len=ext_len)
    batches = list(it)
    assert len(batches) == len(it) == -(-(n // bsz - 1) // bptt)
    assert all(b[2] == bptt for b in batches[:-1])
    check_covers_every_target_once(batches, stream, bsz, ext_len)


@pytest.mark.parametrize('ext_len', [0, 4])
def test_variable_length_covers_every_token_once_and_repeats_for_a_seed(ext_len):
    stream = torch.arange(2003).tolist()
    kwargs = dict(std=5, min_len=5, max_deviation=3)
    batches = list(LMOrderedIterator(torch.tensor(stream), 3, 20, ext_len=ext_len, seed=1).get_varlen_iter(**kwargs))
    check_covers_every_target_once(batches, stream, 3, ext_len)
    lengths = [b[2] for b in batches]
    assert all(5 <= s <= 20 + 3 * 5 for s in lengths[:-1]) and len(set(lengths)) > 3
    again = LMOrderedIterator(torch.tensor(stream), 3, 20, ext_len=ext_len,
                              generator=torch.Generator().manual_seed(1)).get_varlen_iter(**kwargs)
    assert [b[2] for b in again] == lengths
    other = LMOrderedIterator(torch.tensor(stream), 3, 20, ext_len=ext_len, seed=2).get_varlen_iter(**kwargs)
    assert [b[2] for b in other] != lengths


def test_variable_length_uses_half_bptt_about_five_percent_of_the_time():
    it = LMOrderedIterator(torch.zeros(200_000, dtype=torch.long), 1, 40, seed=0)
    lengths = [b[2] for b in it.get_varlen_iter(std=0)][:-1]
    assert set(lengths) == {40, 20}
    share = lengths.count(20) / len(lengths)
    assert len(lengths) > 4000 and 0.04 < share < 0.06


@pytest.mark.parametrize('varlen', [False, True])
def test_state_dict_resumes_exactly(varlen):
    stream = torch.arange(997)

    def run(it, start=None):
        return list(it.get_varlen_iter(start=start) if varlen else it.get_fixlen_iter(start=start))

    first = LMOrderedIterator(stream, 4, 9, ext_len=2, seed=5)
    expected = run(first)
    first = LMOrderedIterator(stream, 4, 9, ext_len=2, seed=5)
    batches = first.get_varlen_iter() if varlen else iter(first)
    done = [next(batches) for _ in range(7)]
    state = first.state_dict()
    assert state['position'] == sum(b[2] for b in done)
    resumed = LMOrderedIterator(stream, 4, 9, ext_len=2, seed=999)
    resumed.load_state_dict(state)
    rest = run(resumed)
    assert len(done) + len(rest) == len(expected)
    for (d, t, s), (ed, et, es) in zip(done + rest, expected):
        assert s == es and torch.equal(d, ed) and torch.equal(t, et)
    # A finished pass starts the next one from the beginning
    assert resumed.position == 0


def test_start_at_a_given_row():
    it = LMOrderedIterator(torch.arange(100), 2, 10)
    data, target, seq_len = next(it.get_fixlen_iter(start=13))
    assert data[:, 0].tolist() == list(range(13, 23)) and target[:, 1].tolist() == list(range(64, 74))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r'data has 7 tokens, too few for bsz=4.*at least 8 tokens'):
        LMOrderedIterator(torch.arange(7), 4, 3)
    with pytest.raises(ValueError, match='bptt=0'):
        LMOrderedIterator(torch.arange(70), 4, 0)
    with pytest.raises(ValueError, match='1-D integer tensor'):
        LMOrderedIterator(torch.zeros(3, 4), 1, 2)
    with pytest.raises(ValueError, match='start=49'):
        next(LMOrderedIterator(torch.arange(100), 2, 10).get_fixlen_iter(start=49))
