"""
Our causal relative attention kernel (`labml_txl/fast/native/attention.py`) against the plain computation (the original's
scores, shift and masked softmax in float64), where the dispatcher runs it and where it does not (with the reasons
`dispatch.recording()` shows), and how it falls back when it cannot be built.
"""
import warnings

import pytest
import torch
from torch.utils import cpp_extension

from labml_txl.fast import dispatch, native
from labml_txl.attention.masks import decoder_key_window, decoder_window_mask
from labml_txl.fast.dispatch import Plan, RelativeTerms
from labml_txl.fast.dropout import Dropout
from labml_txl.fast.native import attention as native_attention
from labml_txl.fast.native import build
from labml_txl.attention.reference import masked_softmax, relative_attention_scores, relative_shift
from labml_txl.xl import MemTransformerLM

from tolerance import assert_close_rounding, assert_same_function, xl_depths
from xl.helpers import plain_and_fast, small_config


def _original_mask(qlen, mlen, mem_len=None):
    """The original's decoder mask, True where masked: the future, and with `same_length` (`mem_len` given) the
    keys more than `mem_len` back (its `triu` + `tril(-mask_shift_len)`)."""
    klen = mlen + qlen
    mask = torch.ones(qlen, klen).triu(1 + mlen)
    if mem_len is not None:
        mask_len = klen - mem_len
        mask_shift_len = qlen - mask_len if mask_len > 0 else qlen
        mask = mask + torch.ones(qlen, klen).tril(-mask_shift_len)
    return mask.bool()


def _plain_attention(q, k, values, table, content_bias, position_bias, entry_bias, scale, mask=None):
    r"""The original's computation in float64, `[qlen, batch, heads * d_head]`: the four terms by einsums, the
    pad-and-copy shift, the masked softmax (the decoder's causal mask unless `mask` is given), the weighted
    values."""
    q, k, values, table = (t.double() for t in (q, k, values, table))
    klen = k.shape[-2]
    # `[len, batch, heads, d_head]` and the table `[klen, heads, d_head]`, as the plain path takes them
    q_, k_, v_ = (t.permute(2, 0, 1, 3) for t in (q, k, values))
    table_ = table[:, :klen].transpose(0, 1)
    zeros = torch.zeros(q.shape[1], q.shape[-1], dtype=torch.float64)
    u = zeros if content_bias is None else content_bias.double()
    v = zeros if position_bias is None else position_bias.double()
    score = relative_attention_scores(q_, k_, table_, u, v)
    if entry_bias is not None:
        # $c_s$ per table entry, shifted to key positions with the position terms
        score = score + relative_shift(entry_bias[:, :klen].double().t()[None, :, None].expand(q_.shape[0], -1,
                                                                                             q.shape[0], -1))
    mask = _original_mask(q_.shape[0], klen - q_.shape[0]) if mask is None else mask
    weights = masked_softmax(score * scale, mask[:, :, None, None])
    out = torch.einsum('ijbn,jbnd->ibnd', weights, v_)
    return out.reshape(out.shape[0], out.shape[1], -1)


def _depth(q, k):
    """Rule 2's depth of the attention's output (`tolerance.py`): a score's `d_head` products and its three terms'
    two additions, then the softmax's normaliser and the weighted sum of the values, over `klen` keys each."""
    return q.shape[-1] + 2 + 2 * k.shape[-2]


def _inputs(batch, heads, qlen, mlen, d_head, seed=0, table_extra=1):
    """Queries in the joint projection's layout (a strided view, as the model passes them), keys and values
    head-major, a table with `table_extra` entries past `klen` (the model pads one), every bias."""
    generator = torch.Generator().manual_seed(seed)
    klen = mlen + qlen

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    projection = randn(qlen, batch, 3 * heads * d_head)
    q = projection[..., :heads * d_head].unflatten(-1, (heads, d_head)).permute(1, 2, 0, 3)
    k, values = randn(batch, heads, klen, d_head), randn(batch, heads, klen, d_head)
    table = randn(heads, klen + table_extra, d_head)
    return q, k, values, table, randn(heads, d_head), randn(heads, d_head), randn(heads, klen + table_extra)


def _decision(q, k, values, table, a=None, b=None, c=None, masked=None, plan=None, dropout=None,
              need_weights=False):
    """What `dispatch.attend` runs for these inputs, decided in the state of the caller (or `plan`): the `Choice`
    it records and the window of keys it gives the kernel."""
    plan = Plan.now(q.device) if plan is None else plan
    terms = RelativeTerms(table, a, b, c)
    with dispatch.recording() as choices:
        chosen, window = dispatch.choose_attention(plan, q, k.shape[-2], masked, terms, None, dropout, need_weights,
                                                   False, [k, values] + terms.tensors())
    assert len(choices) == 1 and choices[0].chosen == chosen
    return choices[0], window


def _kernel_refusal(choice):
    """The reason the kernel was refused, or None where it was chosen."""
    return dict(choice.refused).get('kernel')


def _attention_choices(choices):
    return [c for c in choices if c.operation == 'attention']


# batch, heads, qlen, mlen, d_head: one query, no memory, a partial block (37 = 32 + 5), three blocks behind a
# memory longer than the segment, heads whose size is not a multiple of the vector width
SHAPES = [(2, 3, 1, 0, 8), (2, 3, 1, 9, 8), (1, 1, 5, 0, 4), (2, 2, 37, 11, 8), (2, 2, 70, 100, 16),
          (1, 2, 32, 32, 17)]
# Which of a (content), b (position) and c (per entry) are given: attention type 0 (u folded into the queries, so
# b = v - u), type 1 (u and the entry bias b_s), all, none
BIASES = {'type-0': (False, True, False), 'type-1': (True, False, True), 'all': (True, True, True),
          'none': (False, False, False)}


@pytest.mark.parametrize('biases', BIASES.values(), ids=BIASES.keys())
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_kernel_equals_the_plain_computation(shape, biases):
    q, k, values, table, a, b, c = _inputs(*shape)
    a, b, c = (t if given else None for t, given in zip((a, b, c), biases))
    qlen, klen = q.shape[-2], k.shape[-2]
    causal = _original_mask(qlen, klen - qlen)
    with torch.no_grad():
        # The dispatcher gives it the causal mask's window, every key
        choice, window = _decision(q, k, values, table, a, b, c, causal)
        assert choice.chosen == 'kernel' and window == klen
        with dispatch.recording() as choices:
            out, weights = dispatch.attend(Plan.now(q.device), q, k, values, scale=0.3, masked=causal,
                                           terms=RelativeTerms(table, a, b, c))
        assert [c.chosen for c in choices] == ['kernel'] and weights is None
        assert torch.equal(native_attention.causal_relative_attention(q, k, values, table, a, b, 0.3, c), out)
    expected = _plain_attention(q, k, values, table, a, b, c, 0.3)
    assert out.shape == expected.shape and out.dtype == torch.float32
    assert_close_rounding(out, expected, depth=_depth(q, k))


@pytest.mark.parametrize('window', [None, 30])
def test_the_first_checks_expectation_is_the_plain_computation(window):
    """The first check compares the kernel with `relative_attention.py`'s computation (`_reference`): that is the
    plain computation too, on a causal and a `same_length` window."""
    q, k, values, table, a, b, c = _inputs(2, 3, 37, 40, 8)
    expected = _plain_attention(q, k, values, table, a, b, c, 0.3,
                                None if window is None else decoder_window_mask(37, 77, window))
    # (the same function: the reference in float64 too)
    reference = native_attention._reference(*(t.double() for t in (q, k, values, table, a, b, c)), 0.3,
                                            77 if window is None else window)
    assert reference.shape == (37, 2, 3, 8)
    assert_same_function(reference.flatten(-2), expected)


def test_portable_build_equals_the_plain_computation(monkeypatch):
    """The build for a PyTorch without float32 `brgemm` and without FBGEMM's transposition multiplies with BLAS's
    sgemm and transposes with its own loop: the same numbers to float rounding, forward and backward, on a causal and
    a `same_length` window, the keys in two parts."""
    portable_build = build.load_kernel('causal_relative_attention',
                                       defines=('LABML_TXL_KERNEL_SGEMM', 'LABML_TXL_KERNEL_OWN_TRANSPOSE'))
    assert portable_build is not None and portable_build is not build.load_kernel('causal_relative_attention')
    # `native_attention.causal_relative_attention` calls this build from here on
    monkeypatch.setitem(build._checked, 'causal_relative_attention', portable_build)
    q, k, values, table, a, b, c = _inputs(2, 3, 37, 40, 16)
    for window in (77, 30):
        with torch.no_grad():
            out = native_attention.causal_relative_attention(q, k[:, :, 40:], values[:, :, 40:], table, a, b, 0.3, c,
                                                             window, k_memory=k[:, :, :40],
                                                             values_memory=values[:, :, :40])
        mask = decoder_window_mask(37, 77, window)
        assert_close_rounding(out, _plain_attention(q, k, values, table, a, b, c, 0.3, mask), depth=_depth(q, k))
        _assert_gradients_match_the_plain_computation((q, k, values, table, a, b, c), 0.3, window=window,
                                                      memory_rows=40)


@pytest.mark.parametrize('qlen,memory_rows', [(37, 0), (37, 1), (37, 31), (37, 40), (37, 77), (1, 0), (1, 1), (1, 23),
                                              (1, 40)], ids=lambda m: str(m))
def test_kernel_reads_keys_and_values_in_two_parts(qlen, memory_rows):
    """The memory's keys and values and the segment's, each a view of its own projection, as the model passes
    them: the same as the joined ones, for blocks that start in the memory, straddle the boundary or lie past it
    (37 queries behind 40 keys of memory; `memory_rows` of the 77 keys in the first part), and for one query (a
    one-token step, its own path in the kernel) behind 40."""
    klen = 40 + qlen
    q, k, values, table, a, b, c = _inputs(2, 3, qlen, 40, 8)
    # Keys and values strided as a projection's view is: `[len, bsz, 2 * heads * d_head]` in memory
    projected = torch.cat([k, values], dim=1).permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    k_all, v_all = projected.split(3, dim=1)
    k_memory, v_memory = (k_all[..., :memory_rows, :], v_all[..., :memory_rows, :]) if memory_rows else (None, None)
    k_segment, v_segment = k_all[..., memory_rows:, :], v_all[..., memory_rows:, :]
    assert not k_all.is_contiguous()
    for window in (klen, 25):
        with torch.no_grad():
            out = native_attention.causal_relative_attention(q, k_segment, v_segment, table, a, b, 0.3, c, window,
                                                             k_memory=k_memory, values_memory=v_memory)
        assert_close_rounding(out, _plain_attention(q, k, values, table, a, b, c, 0.3,
                                                    decoder_window_mask(qlen, klen, window)), depth=_depth(q, k))


def test_kernel_reads_strided_tables_and_biases():
    """The tables of attention type 1 are transposed views of `[klen, heads, d_head]` parameters."""
    q, k, values, table, a, _, c = _inputs(2, 3, 6, 4, 8, table_extra=0)
    table_view = table.transpose(0, 1).contiguous().transpose(0, 1)
    entry_view = c.t().contiguous().t()
    assert not table_view.is_contiguous() and not entry_view.is_contiguous()
    with torch.no_grad():
        out = native_attention.causal_relative_attention(q, k, values, table_view, a, None, 0.5, entry_view)
    assert_close_rounding(out, _plain_attention(q, k, values, table, a, None, c, 0.5), depth=_depth(q, k))


def test_kernel_refuses_inconsistent_shapes_with_a_message():
    q, k, values, table, *_ = _inputs(1, 2, 4, 3, 8)
    module = build.load_kernel('causal_relative_attention')
    with pytest.raises(RuntimeError, match=r'table must be \[H, R >= K, D\]'):
        module.causal_relative_attention(q, None, None, k, values, table[:, :5], None, None, None, 1.0, 7, 32)
    with pytest.raises(RuntimeError, match='at least as many keys as queries'):
        module.causal_relative_attention(q, None, None, k[:, :, :2], values[:, :, :2], table, None, None, None, 1.0,
                                         7, 32)
    with pytest.raises(RuntimeError, match='float32'):
        module.causal_relative_attention(q.double(), None, None, k, values, table, None, None, None, 1.0, 7, 32)
    with pytest.raises(RuntimeError, match='k_memory and v_memory go together'):
        module.causal_relative_attention(q, k[:, :, :3], None, k[:, :, 3:], values[:, :, 3:], table, None, None, None,
                                         1.0, 7, 32)
    with pytest.raises(RuntimeError, match='window must be positive'):
        module.causal_relative_attention(q, None, None, k, values, table, None, None, None, 1.0, 0, 32)


@pytest.mark.parametrize('qlen,mlen,mem_len', [(5, 0, 3), (5, 3, 3), (37, 40, 40), (70, 100, 100), (8, 4, 4),
                                                (6, 2, 4), (1, 9, 9)])
def test_kernel_with_same_length_windows_equals_the_plain_computation(qlen, mlen, mem_len):
    """`same_length`: each query sees `mem_len` keys (fewer while the memory fills), so the masked past of a block
    is skipped as its future is."""
    q, k, values, table, a, b, c = _inputs(2, 2, qlen, mlen, 8)
    mask = _original_mask(qlen, mlen, mem_len)
    with torch.no_grad():
        choice, window = _decision(q, k, values, table, a, b, c, mask)
        assert choice.chosen == 'kernel' and window == decoder_key_window(mask, qlen, mlen + qlen) is not None
        out = native_attention.causal_relative_attention(q, k, values, table, a, b, 0.3, c, window)
        # and the same through the dispatcher
        attended, _ = dispatch.attend(Plan.now(q.device), q, k, values, scale=0.3, masked=mask,
                                      terms=RelativeTerms(table, a, b, c))
    assert torch.equal(attended, out)
    assert_close_rounding(out, _plain_attention(q, k, values, table, a, b, c, 0.3, mask), depth=_depth(q, k))


def _gradients(inputs, out, grad_out):
    """The gradients of `(out * grad_out).sum()` for each input (None for one not given or unreached)."""
    given = [t for t in inputs if t is not None]
    grads = iter(torch.autograd.grad(out, given, grad_out, allow_unused=True))
    return [None if t is None else next(grads) for t in inputs]


def _assert_gradients_match_the_plain_computation(inputs, scale, window=None, memory_rows=0):
    """The kernel's output and the gradients of every input (float32) against autograd through
    `_plain_attention` in float64, within float32's rounding of each (`_gradient_depths`). With `memory_rows`, the
    keys and values go to the kernel in two parts, memory and segment, as a model passes them."""
    q, k, values, table, a, b, c = inputs
    qlen, klen = q.shape[-2], k.shape[-2]
    mask = _original_mask(qlen, klen - qlen) if window is None else decoder_window_mask(qlen, klen, window)
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    q_, k_, v_, table_, a_, b_, c_ = leaves
    parts = {} if memory_rows == 0 else dict(k_memory=k_[:, :, :memory_rows], values_memory=v_[:, :, :memory_rows])
    out = native_attention.causal_relative_attention(q_, k_[:, :, memory_rows:], v_[:, :, memory_rows:], table_, a_,
                                                     b_, scale, c_, window, needs_grad=True, **parts)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = _gradients(leaves, out, grad_out)
    # The dispatcher, with gradients recorded and this mask, gives the same call to the kernel and its backward pass
    with dispatch.recording() as choices:
        attended, _ = dispatch.attend(Plan.now(q.device), q_, k_[:, :, memory_rows:], v_[:, :, memory_rows:],
                                      scale=scale, masked=mask, terms=RelativeTerms(table_, a_, b_, c_), **parts)
    assert [c.chosen for c in choices] == ['kernel'] and torch.equal(attended, out)
    for grad, dispatched in zip(grads, _gradients(leaves, attended, grad_out)):
        assert (grad is None) == (dispatched is None) and (grad is None or torch.equal(grad, dispatched))
    reference_leaves = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    expected = _plain_attention(*reference_leaves, scale, mask)
    expected_grads = _gradients(reference_leaves, expected, grad_out.double())
    assert_close_rounding(out, expected.detach(), depth=_depth(q, k))
    depths = _gradient_depths(q.shape[0], qlen, klen, q.shape[-1])
    for name, grad, expected_grad in zip(['q', 'k', 'values', 'table', 'a', 'b', 'c'], grads, expected_grads):
        if expected_grad is None:
            # (the table's entries past the keys: no key reads them)
            assert grad is None or not grad.any(), name
            continue
        assert_close_rounding(grad, expected_grad, depth=depths[name], msg=name)


def _gradient_depths(batch, qlen, klen, d_head):
    r"""Rule 2's depth of each input's gradient: the scores' gradient $G$ comes through the forward pass's weights
    (a score, `d_head + 2`, and the normaliser, `klen`), the weights' gradient $dO\,V^\top$ (`d_head`) and the
    softmax's sum over the keys (`klen`); then each input's own sum: over the keys for the queries' (two products
    added), over the queries for the keys' and the values' (the values' from the forward weights alone), over the
    batch and the queries for the table's and the biases' (each row's, for the content and position biases that
    of a query, a sum over the keys)."""
    scores = 2 * d_head + 2 + 2 * klen
    return dict(q=scores + klen + 1, k=scores + qlen, values=d_head + 2 + klen + qlen, table=scores + batch * qlen,
                a=scores + klen + 1 + batch * qlen, b=scores + klen + 1 + batch * qlen, c=scores + batch * qlen)


@pytest.mark.parametrize('biases', BIASES.values(), ids=BIASES.keys())
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_kernel_gradients_equal_the_plain_computation(shape, biases):
    """The backward pass of training: the gradients of queries, keys, values, table and every bias."""
    inputs = list(_inputs(*shape))
    for i, given in zip((4, 5, 6), biases):
        inputs[i] = inputs[i] if given else None
    _assert_gradients_match_the_plain_computation(inputs, 0.3)


@pytest.mark.parametrize('qlen,mlen,mem_len', [(5, 3, 3), (37, 40, 40), (6, 2, 4), (70, 100, 64)])
def test_kernel_gradients_with_same_length_windows(qlen, mlen, mem_len):
    _assert_gradients_match_the_plain_computation(_inputs(2, 2, qlen, mlen, 8), 0.3, window=mem_len)


@pytest.mark.parametrize('memory_rows', [3, 40])
def test_kernel_gradients_reach_keys_and_values_given_in_two_parts(memory_rows):
    """With gradients the two parts are joined before the kernel; both get their gradients."""
    _assert_gradients_match_the_plain_computation(_inputs(2, 2, 37, 40, 8), 0.3, memory_rows=memory_rows)


def test_kernel_refuses_a_second_derivative_with_a_message():
    """The kernel's gradients carry no graph of their own: asking for a second derivative raises instead of
    returning a wrong one."""
    q, k, values, table, a, b, _ = (None if t is None else t.requires_grad_() for t in _inputs(2, 2, 5, 3, 8))
    out = native_attention.causal_relative_attention(q, k, values, table, a, b, 0.3, needs_grad=True)
    # (an incoming gradient that itself needs one, as in a gradient penalty)
    grad_out = torch.randn(out.shape, requires_grad=True)
    (grad_q,) = torch.autograd.grad(out, q, grad_out, create_graph=True)
    with pytest.raises(RuntimeError, match='differentiate twice'):
        grad_q.sum().backward()


def test_kernel_backward_refuses_a_gradient_of_another_layout_with_a_message():
    q, k, values, table, a, b, _ = _inputs(2, 2, 5, 3, 8)
    module = build.load_kernel('causal_relative_attention')
    out, weights = module.causal_relative_attention_forward(q, k, values, table, a, b, None, 0.3, 8, 32)
    with pytest.raises(RuntimeError, match='grad_out must be contiguous'):
        module.causal_relative_attention_backward(out.transpose(0, 1), q, k, values, table, a, b, False, weights,
                                                  0.3, 8, 32)
    with pytest.raises(RuntimeError, match='weights must be the contiguous'):
        module.causal_relative_attention_backward(out, q, k, values, table, a, b, False, weights[:, :, :4], 0.3, 8,
                                                  32)


@pytest.mark.parametrize('qlen,mlen', [(1, 0), (4, 0), (4, 6), (7, 7)])
def test_key_window_is_read_from_the_mask(qlen, mlen):
    klen = qlen + mlen
    assert decoder_key_window(_original_mask(qlen, mlen), qlen, klen) == klen
    for mem_len in range(1, klen + 1):
        mask = _original_mask(qlen, mlen, mem_len)
        window = decoder_key_window(mask, qlen, klen)
        # The number of keys of the last query, and the mask it stands for is this one
        assert window == int((~mask[-1]).sum())
        assert torch.equal(decoder_window_mask(qlen, klen, window), mask)
    # Not a window: a padding column, every key masked for a query, no mask, a float mask
    padded = _original_mask(qlen, mlen).clone()
    padded[:, 0] = True
    assert decoder_key_window(padded, qlen, klen) is None
    assert decoder_key_window(torch.ones(qlen, klen, dtype=torch.bool), qlen, klen) is None
    assert decoder_key_window(None, qlen, klen) is None
    assert decoder_key_window(_original_mask(qlen, mlen).float(), qlen, klen) is None


def test_key_window_kept_for_a_mask_follows_changes_to_it():
    """The window found for a mask is kept per tensor; an in-place change or another view of it is looked at
    afresh."""
    mask = _original_mask(4, 6)[:, :, None].clone()
    assert decoder_key_window(mask[:, :, 0], 4, 10) == 10
    assert decoder_key_window(mask[:, :, 0], 4, 10) == 10
    # A view of the same rows with other sizes: the first three queries of the same mask
    assert decoder_key_window(mask[:3, :9, 0], 3, 9) == 9
    mask[:, 1] = True
    assert decoder_key_window(mask[:, :, 0], 4, 10) is None
    mask.copy_(_original_mask(4, 6, mem_len=6)[:, :, None])
    assert decoder_key_window(mask[:, :, 0], 4, 10) == 6


def test_kernel_serves_only_float32_cpu_under_a_window_mask():
    """The dispatcher's decision for the kernel, and the reason it gives where it refuses it."""
    q, k, values, table, a, b, _ = _inputs(2, 2, 5, 3, 8)
    causal = _original_mask(5, 3)
    with torch.no_grad():
        choice, window = _decision(q, k, values, table, a, b, masked=causal)
        assert choice.chosen == 'kernel' and choice.refused == () and window == 8
        # The `[qlen, klen, 1]` form of the same mask (one for every sequence) is the same window
        assert _decision(q, k, values, table, a, b, masked=causal[:, :, None])[0].chosen == 'kernel'
        # A padding mask, no mask, a mask per sequence: not a decoder's window
        padding = causal.clone()
        padding[:, 1] = True
        for masked in (padding, None, causal[:, :, None].expand(5, 8, 2)):
            choice, window = _decision(q, k, values, table, a, b, masked=masked)
            assert choice.chosen != 'kernel' and window is None
            assert 'window' in _kernel_refusal(choice)
        # A table shorter than the keys
        assert 'table of 7 entries for 8 keys' in _kernel_refusal(_decision(q, k, values, table[:, :7], a, b,
                                                                            masked=causal)[0])
        # float64, a float64 bias
        doubles = (t.double() for t in (q, k, values, table))
        assert 'float32' in _kernel_refusal(_decision(*doubles, masked=causal)[0])
        # (the reason names the input that is not float32, here only the bias)
        assert 'an input is torch.float64' in _kernel_refusal(_decision(q, k, values, table, a.double(), b,
                                                                        masked=causal)[0])
        # autocast
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert 'autocast' in _kernel_refusal(_decision(q, k, values, table, a, b, masked=causal)[0])
        # inside `torch.compile`, on another device
        compiling = Plan('auto', 'cpu', grad=False, autocast=None, compiling=True)
        assert 'torch.compile' in _kernel_refusal(_decision(q, k, values, table, a, b, masked=causal,
                                                            plan=compiling)[0])
        on_cuda = Plan('auto', 'cuda', grad=False, autocast=None, compiling=False)
        assert 'cuda' in _kernel_refusal(_decision(q, k, values, table, a, b, masked=causal, plan=on_cuda)[0])
        # the weights asked for, attention dropout in training (not in evaluation)
        assert 'need_weights' in _kernel_refusal(_decision(q, k, values, table, a, b, masked=causal,
                                                           need_weights=True)[0])
        assert 'dropout' in _kernel_refusal(_decision(q, k, values, table, a, b, masked=causal,
                                                      dropout=Dropout(0.1).train())[0])
        assert _decision(q, k, values, table, a, b, masked=causal, dropout=Dropout(0.1).eval())[0].chosen == 'kernel'
        # `impl='reference'` asks for the reference
        choice, _ = _decision(q, k, values, table, a, b, masked=causal, plan=Plan.now(q.device, 'reference'))
        assert choice.chosen == 'reference' and "impl='reference'" in _kernel_refusal(choice)
    # with gradients too (the kernel has its backward pass), but not in a `disabled()` block
    choice, window = _decision(q.requires_grad_(), k, values, table, a, b, masked=causal)
    assert choice.chosen == 'kernel' and window == 8
    with native.disabled():
        assert 'disabled' in _kernel_refusal(_decision(q, k, values, table, a, b, masked=causal)[0])


def _model_depths(config, batch=1):
    """Rule 2's depths (`tolerance.py`) for a `MemTransformerLM` of `config` over segments of `tgt_len` (by `batch`)
    behind `mem_len` keys of memory: of each memory (each layer's input) and of the losses; and of one training step
    (forward, backward and the update) of the weights and of the gradients the next step computes from them."""
    d_model, d_head, heads, klen = config['d_model'], config['d_head'], config['n_head'], config['mem_len'] + \
        config['tgt_len']
    inputs, loss = xl_depths(config, klen)
    # Backward, the same products transposed: the joint projection's input gradient sums its 3 * heads * d_head
    # outputs; the attention's dO V^T (d_head), the softmax's sum and G K (klen each); the output projection's and the
    # feed-forward's (d_model, d_inner, d_model), the layer norms' two sums each; the logits' over n_token. A
    # weight's gradient then sums over the rows (tgt_len * batch) and the relative terms' over the keys too; the
    # update rounds once
    backward_layer = 3 * heads * d_head + d_head + 2 * klen + 2 * d_model + config['d_inner'] + 4 * d_model + 2
    step = loss + config['n_token'] + config['n_layer'] * backward_layer + config['tgt_len'] * batch + klen + 1
    return inputs, loss, step


@pytest.mark.parametrize('overrides', [dict(attn_type=0), dict(attn_type=1), dict(attn_type=0, same_length=True),
                                       dict(attn_type=1, same_length=True, mem_len=3)],
                         ids=lambda c: '-'.join(f'{k}={v}' for k, v in c.items()))
def test_model_evaluation_through_the_kernel_equals_the_plain_path(overrides):
    """Both relative attention types in evaluation, with and without `same_length`: each layer's attention runs in
    the kernel, and losses and memories match the plain path over segments that carry memories (of 20 rows: more
    than the fused decoder layer takes, so each attention is chosen). The plain path in float64: the float32 kernel
    within float32's rounding of the exact computation."""
    config = small_config(**overrides)
    plain, fast = (model.eval() for model in plain_and_fast(**overrides))
    plain.double()
    inputs_depths, loss_depth, _ = _model_depths(config)
    data = torch.randint(40, (16, 4))
    plain_mems, fast_mems = [], []
    plain_choices, fast_choices = [], []
    with torch.no_grad():
        for s in range(3):
            x, y = data[5 * s:5 * s + 5], data[5 * s + 1:5 * s + 6]
            with dispatch.recording() as choices:
                plain_loss, *plain_mems = plain(x, y, *plain_mems)
            plain_choices += _attention_choices(choices)
            with dispatch.recording() as choices:
                fast_loss, *fast_mems = fast(x, y, *fast_mems)
            fast_choices += _attention_choices(choices)
            assert_close_rounding(fast_loss, plain_loss, depth=loss_depth)
            for a, b, depth in zip(fast_mems, plain_mems, inputs_depths, strict=True):
                assert_close_rounding(a, b, depth=depth)
    assert [c.chosen for c in fast_choices] == ['kernel'] * (3 * config['n_layer'])
    assert [c.chosen for c in plain_choices] == ['reference'] * (3 * config['n_layer'])


@pytest.mark.parametrize('overrides', [dict(attn_type=0), dict(attn_type=1), dict(attn_type=0, same_length=True),
                                       dict(attn_type=1, same_length=True, mem_len=3)],
                         ids=lambda c: '-'.join(f'{k}={v}' for k, v in c.items()))
def test_model_training_through_the_kernel_equals_the_plain_path(overrides):
    """Training steps (forward, backward, SGD) over segments that carry memories: each layer's attention runs in
    the kernel and its backward pass, and the losses, the gradients of every parameter and the weights after
    each step match the plain path (in float64: the float32 kernel within float32's rounding of the exact
    training)."""
    config = small_config(**overrides)
    plain, fast = plain_and_fast(**overrides)
    plain.double()
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1) for model in (plain, fast)]
    data = torch.randint(40, (16, 3))
    _, loss_depth, step_depth = _model_depths(config, batch=data.shape[1])
    plain_mems, fast_mems = [], []
    fast_choices = []
    for s in range(3):
        x, y = data[5 * s:5 * s + 5], data[5 * s + 1:5 * s + 6]
        plain_loss, *plain_mems = plain(x, y, *plain_mems)
        with dispatch.recording() as choices:
            fast_loss, *fast_mems = fast(x, y, *fast_mems)
        fast_choices += _attention_choices(choices)
        # (each step's weights carry the rounding of the steps before: step s starts s steps' depth deep)
        assert_close_rounding(fast_loss, plain_loss, depth=s * step_depth + loss_depth)
        plain_loss.mean().backward()
        fast_loss.mean().backward()
        for (name, a), b in zip(fast.named_parameters(), plain.parameters()):
            assert_close_rounding(a.grad, b.grad, depth=(s + 1) * step_depth, msg=name)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        for a, b in zip(fast.parameters(), plain.parameters()):
            assert_close_rounding(a, b, depth=(s + 1) * step_depth)
    assert [c.chosen for c in fast_choices] == ['kernel'] * (3 * config['n_layer'])


def test_disabled_block_runs_the_pytorch_path_and_ends_with_it():
    q, k, values, table, _, b, _ = _inputs(2, 2, 5, 3, 8)
    causal = _original_mask(5, 3)
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config()).eval()
    # (20 rows: more than the fused decoder layer takes, so each attention is chosen)
    data = torch.randint(40, (6, 4))
    with torch.no_grad():
        with native.disabled():
            assert 'disabled' in _kernel_refusal(_decision(q, k, values, table, None, b, masked=causal)[0])
            with dispatch.recording() as inside:
                without = model(data[:5], data[1:])[0]
        assert len(_attention_choices(inside)) == small_config()['n_layer']
        for choice in _attention_choices(inside):
            assert choice.chosen != 'kernel' and 'disabled' in _kernel_refusal(choice)
        assert _decision(q, k, values, table, None, b, masked=causal) == (dispatch.Choice('attention', 'kernel'), 8)
        with dispatch.recording() as after:
            # (no memory: each query sees at most the segment's 5 keys)
            assert_close_rounding(model(data[:5], data[1:])[0], without,
                                  depth=_model_depths(small_config(mem_len=0))[1])
    assert [c.chosen for c in _attention_choices(after)] == ['kernel'] * small_config()['n_layer']


# -- where it cannot be built --

@pytest.fixture
def fresh_kernels(monkeypatch):
    """`load_kernel` and each kernel's `kernel_available` as in a new process (the tests' own build stays cached on disk)."""
    monkeypatch.setattr(build, '_loaded', {})
    monkeypatch.setattr(build, '_checked', {})


def test_disabled_kernels_leave_the_pytorch_path(monkeypatch, fresh_kernels):
    monkeypatch.setenv(build.DISABLE_VARIABLE, '0')
    q, k, values, table, _, b, _ = _inputs(2, 2, 5, 3, 8)
    with torch.no_grad():
        choice, window = _decision(q, k, values, table, None, b, masked=_original_mask(5, 3))
    assert choice.chosen != 'kernel' and window == 8 and 'LABML_TXL_NATIVE=0' in _kernel_refusal(choice)
    assert build.load_kernel('causal_relative_attention') is None


def test_a_failed_build_warns_with_the_compilers_error_and_falls_back(monkeypatch, fresh_kernels, tmp_path):
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', str(tmp_path))  # an empty cache: every kernel is compiled

    def failing_load(name, *args, **kwargs):
        raise RuntimeError(f"Error building extension '{name}'\n[1/2] c++ -c kernel.cpp\n"
                           f"kernel.cpp:1:10: fatal error: torch/extension.h: No such file or directory\n"
                           f"ninja: build stopped: subcommand failed.")

    monkeypatch.setattr(cpp_extension, 'load', failing_load)
    expected = 'fatal error: torch/extension.h: No such file.*g\\+\\+.*LABML_TXL_NATIVE=0'
    with pytest.warns(RuntimeWarning, match=expected):
        assert not native.attention.kernel_available()
    # Warned once: later calls know
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert not native.attention.kernel_available()
    # The model still evaluates, by SDPA (and PyTorch's layer norms, whose kernel fails to build alike), as the
    # plain path does
    plain, fast = (model.eval() for model in plain_and_fast())
    data = torch.randint(40, (6, 2))
    with torch.no_grad(), pytest.warns(RuntimeWarning, match='could not build its residual_layer_norm kernel'):
        with dispatch.recording() as choices:
            fast_loss = fast(data[:5], data[1:])[0]
        # (two float32 paths; no memory: each query sees at most the segment's 5 keys)
        assert_close_rounding(fast_loss, plain(data[:5], data[1:])[0],
                              depth=_model_depths(small_config(mem_len=0))[1])
    attention = _attention_choices(choices)
    assert attention and all(c.chosen == 'sdpa' and 'could not be built' in _kernel_refusal(c) for c in attention)
    norms = [c for c in choices if c.operation == 'residual layer norm']
    assert norms and all(c.chosen == 'PyTorch' and 'could not be built' in dict(c.refused)['kernel'] for c in norms)


def test_a_kernel_with_wrong_results_is_not_used(monkeypatch, fresh_kernels):
    class WrongKernel:
        @staticmethod
        def causal_relative_attention(q, *args):
            return torch.zeros(q.shape[2], q.shape[0], q.shape[1], q.shape[3])

    monkeypatch.setattr(build, '_loaded', {('causal_relative_attention',): WrongKernel()})
    with pytest.warns(RuntimeWarning, match='other results than PyTorch'):
        assert not native.attention.kernel_available()
    _assert_the_dispatcher_does_not_use_the_kernel()


def _assert_the_dispatcher_does_not_use_the_kernel():
    """Where the kernel failed its first check, the dispatcher refuses it, with and without gradients, and what
    runs instead gives the plain computation's numbers."""
    q, k, values, table, a, b, c = _inputs(2, 2, 5, 3, 8)
    causal = _original_mask(5, 3)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), dispatch.recording() as choices:
            out, _ = dispatch.attend(Plan.now(q.device), q, k, values, scale=0.3, masked=causal,
                                     terms=RelativeTerms(table, a, b, c))
        (choice,) = choices
        assert choice.chosen != 'kernel' and 'failed its first check' in _kernel_refusal(choice)
        assert_close_rounding(out, _plain_attention(q, k, values, table, a, b, c, 0.3).detach(), depth=_depth(q, k))


def test_a_kernel_with_wrong_gradients_is_not_used(monkeypatch, fresh_kernels):
    """The first check covers the training passes too: a backward pass that gets one gradient wrong (the keys') is
    caught before any model trains with it."""
    built = build.load_kernel('causal_relative_attention')

    class WrongBackward:
        causal_relative_attention = staticmethod(built.causal_relative_attention)
        causal_relative_attention_forward = staticmethod(built.causal_relative_attention_forward)

        @staticmethod
        def causal_relative_attention_backward(*args):
            grads = built.causal_relative_attention_backward(*args)
            return [grads[0], grads[1] * 1.01] + list(grads[2:])

    monkeypatch.setattr(build, '_loaded', {('causal_relative_attention',): WrongBackward()})
    with pytest.warns(RuntimeWarning, match='causal relative attention \\(training\\) kernel gave other results'):
        assert not native.attention.kernel_available()
    _assert_the_dispatcher_does_not_use_the_kernel()
