"""`append_buffer.keep_rows` against `torch.cat`, the computation it replaces, and the promise that a window handed out
is never changed afterwards."""
import pytest
import torch

from labml_txl.xl.append_buffer import keep_rows


def _concatenated(memory, segment, beg, end, dim):
    """The original's `cat([memory[beg:], segment[:end - mlen]])[...]` along `dim` (no memory: `segment[beg:end]`)."""
    index = (slice(None),) * dim
    if memory is None:
        return segment[index + (slice(beg, end),)]
    mlen = memory.shape[dim]
    return torch.cat([memory[index + (slice(beg, None),)], segment[index + (slice(None, end - mlen),)]], dim)


@pytest.mark.parametrize('dim', [0, 3])
@pytest.mark.parametrize('qlens,mem_len', [([1] * 40, 12), ([3] * 15, 12), ([5, 1, 7, 2, 2, 9, 1, 1, 4], 10),
                                           ([4] * 10, 4)])
def test_steps_equal_concatenating_and_windows_stay_unchanged(dim, qlens, mem_len):
    """Many segments through the buffers (several new ones as the room runs out): every memory equals the
    concatenation's, and every window returned keeps its values to the end."""
    generator = torch.Generator().manual_seed(0)

    def rows(n):
        shape = [2, 3, 2, 5]
        shape.insert(dim, n)
        return torch.randn(*shape, generator=generator)

    memory, buffer, handed_out, buffers = None, None, [], set()
    for qlen in qlens:
        segment = rows(qlen)
        mlen = 0 if memory is None else memory.shape[dim]
        end = qlen + mlen
        beg = max(0, end - mem_len)
        expected = _concatenated(memory, segment, beg, end, dim)
        memory, buffer = keep_rows(buffer, memory, segment, beg, end, dim)
        assert torch.equal(memory, expected)
        handed_out.append((memory, memory.clone()))
        buffers.add(id(buffer))
    for window, values in handed_out:
        assert torch.equal(window, values)
    if mem_len > max(qlens):
        # (the windows moved through more than one buffer)
        assert len(buffers - {id(None)}) > 1


def test_a_memory_used_twice_starts_a_new_buffer():
    """Two segments after the same memory (a search that branches): the second is not written over the first's rows."""
    # (a window of 8 rows: room for 2 more after it)
    memory, buffer = keep_rows(None, torch.arange(8.)[:, None], torch.tensor([[8.]]), 1, 9, dim=0)
    first, first_buffer = keep_rows(buffer, memory, torch.tensor([[10.]]), 1, 9, dim=0)
    second, second_buffer = keep_rows(first_buffer, memory, torch.tensor([[20.]]), 1, 9, dim=0)
    assert first_buffer is buffer and second_buffer is not buffer
    assert first.flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 10]
    assert second.flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 20]
    # The first branch goes on in its buffer
    third, third_buffer = keep_rows(first_buffer, first, torch.tensor([[30.]]), 1, 9, dim=0)
    assert third_buffer is buffer and third.flatten().tolist() == [3, 4, 5, 6, 7, 8, 10, 30]
    assert first.flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 10]
    assert second.flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 20]


def test_a_window_that_a_graph_saved_may_be_written_after():
    """A memory read by a training step (autograd saves it for the weight's gradient), then written after by the
    next segment: the backward pass runs and gives the gradient of the memory's values."""
    memory, buffer = keep_rows(None, torch.zeros(2, 3), torch.randn(4, 3), 1, 4, dim=0)
    memory, buffer = keep_rows(buffer, memory, torch.randn(1, 3), 1, 4, dim=0)
    weight = torch.randn(5, 3, requires_grad=True)
    loss = (memory @ weight.t()).sum()
    expected = memory.clone()
    keep_rows(buffer, memory, torch.randn(1, 3), 1, 4, dim=0)
    loss.backward()
    torch.testing.assert_close(weight.grad, expected.sum(0).expand(5, 3))


def test_parts_of_two_dtypes_are_joined_as_cat_joins_them():
    memory = torch.randn(3, 2, dtype=torch.bfloat16)
    segment = torch.randn(2, 2)
    kept, buffer = keep_rows(None, memory, segment, 1, 5, dim=0)
    assert buffer is None and kept.dtype == torch.float32
    assert torch.equal(kept, torch.cat([memory[1:], segment]))


def test_no_row_of_the_segment_kept_is_the_originals_slicing():
    """`end < mlen` (`ext_len` above `qlen`): the original's `segment[:end - mlen]` counts from the end."""
    memory, segment = torch.arange(6.)[:, None], torch.arange(10., 13.)[:, None]
    kept, buffer = keep_rows(None, memory, segment, 2, 5, dim=0)
    assert buffer is None and torch.equal(kept, _concatenated(memory, segment, 2, 5, 0))


def test_a_buffer_made_in_inference_mode_is_not_written_outside_it():
    with torch.inference_mode():
        memory, buffer = keep_rows(None, torch.zeros(2, 1), torch.arange(3.)[:, None], 1, 3, dim=0)
        memory, buffer = keep_rows(buffer, memory, torch.tensor([[5.]]), 1, 3, dim=0)
    kept, new_buffer = keep_rows(buffer, memory, torch.tensor([[7.]]), 1, 3, dim=0)
    assert new_buffer is not buffer and kept.flatten().tolist() == [5, 7]
