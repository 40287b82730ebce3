"""
`MemTransformerLM` with a compressed memory (`cmem_len > 0`, `memories/compressed.py`), in float64:

* at rate 1 with an identity compression it is Transformer-XL with a memory of `mem_len + cmem_len`, for every
  attention type;
* every segment's loss, memories, compressed memories and reconstruction loss equal a naive loop that recomputes
  each segment from the whole history of every layer's inputs, with the paper's rule written out directly (what is
  compressed: the first $c \\lceil (T - \\mathit{mem\\_len}) / c \\rceil$ of the $T$ inputs so far, in groups of $c$);
* the fast paths equal the reference, in evaluation, training and one-token steps;
* bad settings and memories are refused with what is accepted.
"""
import math

import pytest
import torch

from labml_txl.positions import registry
from labml_txl.xl import MemTransformerLM
from labml_txl.memories.compression import attention_reconstruction_loss
from tolerance import assert_same_function

from xl.helpers import small_config

ALL_TYPES = sorted(registry.ATTN_TYPES.values())


def _tokens(n: int, bsz: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 40, (n, bsz), generator=torch.Generator().manual_seed(seed))


def _model(seed: int = 0, **overrides) -> MemTransformerLM:
    torch.manual_seed(seed)
    return MemTransformerLM(**small_config(**overrides)).double().eval()


def _segments(lengths, seed: int = 1):
    """Consecutive segments of the given lengths over one stream: `(data, target)` pairs."""
    stream = _tokens(sum(lengths) + 1, seed=seed)
    start = 0
    for n in lengths:
        yield stream[start:start + n], stream[start + 1:start + n + 1]
        start += n


@pytest.mark.parametrize('same_length', [False, True])
@pytest.mark.parametrize('compression', ['max_pool', 'mean_pool', 'conv'])
@pytest.mark.parametrize('attn_type', ALL_TYPES)
def test_rate_one_identity_is_transformer_xl_with_both_lengths(attn_type, compression, same_length):
    """At rate 1 with an identity $f_c$ (a pool of one row, or a convolution of kernel 1 with the identity matrix) the
    compressed memory holds the rows Transformer-XL's longer memory holds: the same losses and, joined, the same
    memories at every segment (the memory fills, then the compressed memory, then both move on)."""
    mem_len, cmem_len = 4, 6
    compressive = _model(attn_type=attn_type, mem_len=mem_len, cmem_len=cmem_len, compression_rate=1,
                         compression=compression, same_length=same_length)
    if compression == 'conv':
        with torch.no_grad():
            for f_c in compressive.compressed_memory.functions:
                f_c.conv.weight.copy_(torch.eye(16, dtype=torch.float64)[:, :, None])
                f_c.conv.bias.zero_()
    xl = _model(attn_type=attn_type, mem_len=mem_len + cmem_len, same_length=same_length)
    xl.load_state_dict({k: v for k, v in compressive.state_dict().items() if not k.startswith('compressed_memory')})
    xl_mems, c_mems = [], []
    for data, target in _segments([5, 3, 5, 4, 5, 2]):
        xl_loss, *xl_mems = xl(data, target, *xl_mems)
        c_loss, *c_mems = compressive(data, target, *c_mems)
        assert_same_function(c_loss, xl_loss)
        memories, compressed = c_mems[:3], c_mems[3:]
        for n in range(2):
            assert_same_function(torch.cat([compressed[n], memories[n]]), xl_mems[n])
    # (the stream was long enough for both memories to fill)
    assert compressed[0].shape[0] == cmem_len and xl_mems[0].shape[0] == mem_len + cmem_len


def _compress(model: MemTransformerLM, n: int, rows: torch.Tensor, cmem_len: int) -> torch.Tensor:
    """Layer `n`'s $f_c$ of `rows` at once, its last `cmem_len` rows (none of no rows)."""
    return model.compressed_memory.functions[n](rows)[-cmem_len:] if rows.shape[0] else rows


def _naive_segment(model: MemTransformerLM, histories, data, target, rate, mem_len, cmem_len):
    """
    One segment computed from the whole history of each layer's inputs (`histories[n]`, `[T, bsz, d_model]`, the
    inputs of layer `n` at every position so far), with the paper's rule written out: of the T positions, the first
    $B = c \\lceil \\max(0, T - \\mathit{mem\\_len}) / c \\rceil$ are compressed in groups of $c$ (the last `cmem_len`
    groups kept) and the rest are the memory. Returns the loss, each layer's input for the segment, and the
    reconstruction loss of the rows this segment compresses, from the histories after it.
    """
    qlen, T = data.shape[0], histories[0].shape[0]
    evicted = rate * math.ceil(max(0, T - mem_len) / rate)
    x = model.word_emb(data)
    inputs = []
    for n, layer in enumerate(model.layers):
        inputs.append(x)
        compressed = _compress(model, n, histories[n][:evicted], cmem_len)
        attended = torch.cat([compressed, histories[n][evicted:]])
        klen = attended.shape[0] + qlen
        # Query i may see keys up to its own position, `alen + i`
        mask = torch.ones(qlen, klen, dtype=torch.bool).triu(1 + attended.shape[0])[:, :, None]
        position_args = ()
        if model.attn_type == 0:
            distances = torch.arange(klen - 1, -1, -1, dtype=torch.float64)
            position_args = (model.pos_emb(distances), model.r_w_bias, model.r_r_bias)
        x = layer(x, *position_args, dec_attn_mask=mask, mems=attended)
    loss = model.crit(x.reshape(-1, x.shape[-1]), target.reshape(-1)).view(qlen, -1)
    # The rows that fall out after this segment: those of `[history, segment]` before the new bound
    after = [torch.cat([h, i]) for h, i in zip(histories, inputs)]
    now_evicted = rate * math.ceil(max(0, T + qlen - mem_len) / rate)
    reconstruction = sum(attention_reconstruction_loss(layer.dec_attn, model.compressed_memory.functions[n],
                                                       inputs[n], after[n][evicted:now_evicted])
                         for n, layer in enumerate(model.layers)) if now_evicted > evicted else 0.0
    return loss, inputs, reconstruction


@pytest.mark.parametrize('compression', ['conv', 'max_pool'])
@pytest.mark.parametrize('attn_type', [0, 'rotary', 'alibi', 't5_bias'])
def test_every_segment_equals_a_naive_loop_over_the_whole_history(attn_type, compression):
    """Segments of lengths that are not multiples of the rate (so whole groups are rounded up), over a stream long
    enough that rows fall out of the compressed memory too: loss, memories, compressed memories and reconstruction
    loss equal the naive recomputation from the history at every segment."""
    rate, mem_len, cmem_len = 3, 4, 3
    model = _model(attn_type=attn_type, mem_len=mem_len, cmem_len=cmem_len, compression_rate=rate,
                   compression=compression, seed=2)
    histories = [torch.zeros(0, 2, 16, dtype=torch.float64) for _ in range(2)]
    mems = []
    for data, target in _segments([3, 5, 2, 4, 1, 6, 5, 4]):
        loss, reconstruction, *mems = model(data, target, *mems, return_reconstruction_loss=True)
        naive_loss, inputs, naive_reconstruction = _naive_segment(model, histories, data, target, rate, mem_len,
                                                                  cmem_len)
        assert_same_function(loss, naive_loss)
        assert_same_function(reconstruction, torch.as_tensor(naive_reconstruction, dtype=torch.float64))
        histories = [torch.cat([h, i]) for h, i in zip(histories, inputs)]
        T = histories[0].shape[0]
        evicted = rate * math.ceil(max(0, T - mem_len) / rate)
        for n in range(2):
            # The memory: the history after what is compressed; the compressed memory: f_c of what is, in groups
            assert_same_function(mems[n], histories[n][evicted:])
            expected = _compress(model, n, histories[n][:evicted], cmem_len)
            assert_same_function(mems[3 + n], expected)
        assert mems[0].shape[0] <= mem_len and mems[3].shape[0] <= cmem_len
    assert mems[3].shape[0] == cmem_len and evicted > rate * cmem_len


def test_reconstruction_loss_trains_the_compression_only():
    """The reconstruction loss's gradient reaches the convolutions, and no other parameter (the paper stops it into
    the attention); it is zero before anything is compressed."""
    model = _model(mem_len=4, cmem_len=2, compression_rate=2).train()
    mems = []
    for step, (data, target) in enumerate(_segments([4, 4])):
        model.zero_grad()
        _, reconstruction, *mems = model(data, target, *mems, return_reconstruction_loss=True)
        if step == 0:
            assert reconstruction.item() == 0.0
            continue
        assert reconstruction.item() > 0.0
        reconstruction.backward()
        for name, p in model.named_parameters():
            reached = p.grad is not None and p.grad.abs().sum() > 0
            assert reached == name.startswith('compressed_memory.'), name


def _plain_and_fast(attn_type, **overrides):
    torch.manual_seed(0)
    config = small_config(attn_type=attn_type, mem_len=4, cmem_len=3, compression_rate=2, **overrides)
    plain = MemTransformerLM(**config, impl='reference').double()
    fast = MemTransformerLM(**config, impl='auto').double()
    fast.load_state_dict(plain.state_dict())
    return plain, fast


@pytest.mark.parametrize('attn_type', ALL_TYPES)
def test_fast_paths_equal_the_reference_with_a_compressed_memory(attn_type):
    """Evaluation (segments, then one-token steps, where the fast path keeps buffers and positions) and a training
    step (losses and every gradient, the reconstruction loss's included) of the dispatcher's paths against the
    reference."""
    plain, fast = _plain_and_fast(attn_type)
    for model in (plain, fast):
        model.eval()
    with torch.no_grad():
        plain_mems, fast_mems = [], []
        for data, target in _segments([5, 5, 5, 1, 1, 1, 1, 1]):
            plain_loss, *plain_mems = plain(data, target, *plain_mems)
            fast_loss, *fast_mems = fast(data, target, *fast_mems)
            assert_same_function(fast_loss, plain_loss)
            for a, b in zip(fast_mems, plain_mems, strict=True):
                assert_same_function(a, b)
    for model in (plain, fast):
        model.train()
    grads = []
    for model in (plain, fast):
        mems = []
        model.zero_grad()
        for data, target in _segments([5, 5, 5]):
            loss, reconstruction, *mems = model(data, target, *mems, return_reconstruction_loss=True)
        (loss.mean() + reconstruction).backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(k.startswith('compressed_memory') for k in grads[0])
    for name in grads[0]:
        assert_same_function(grads[1][name], grads[0][name], msg=name)


def test_settings_are_checked_with_what_is_accepted():
    with pytest.raises(ValueError, match='cmem_len'):
        MemTransformerLM(**small_config(cmem_len=-1))
    with pytest.raises(ValueError, match='compression_rate'):
        MemTransformerLM(**small_config(cmem_len=2, compression_rate=0))
    with pytest.raises(ValueError, match="compression='avg' is not accepted: one of 'conv', 'max_pool', 'mean_pool'"):
        MemTransformerLM(**small_config(compression='avg'))
    with pytest.raises(ValueError, match='mem_len must be at least compression_rate'):
        MemTransformerLM(**small_config(mem_len=3, cmem_len=2, compression_rate=4))
    model = MemTransformerLM(**small_config(mem_len=4, cmem_len=2, compression_rate=4))
    with pytest.raises(ValueError, match='mem_len must be at least compression_rate'):
        model.reset_length(5, 0, 2)
    assert model.mem_len == 4
    with pytest.raises(ValueError, match='return_reconstruction_loss=True is not accepted with cmem_len=0'):
        MemTransformerLM(**small_config())(_tokens(5), _tokens(5), return_reconstruction_loss=True)
    with pytest.raises(ValueError, match="no compressed memory"):
        MemTransformerLM(**small_config(cmem_len=2, compression_rate=2)).save_pretrained('/nonexistent')


def test_memories_are_checked_with_the_compressed_ones():
    model = _model(mem_len=4, cmem_len=2, compression_rate=2)
    data = _tokens(5)
    _, *mems = model(data, data)
    assert len(mems) == 3 + 2
    with pytest.raises(ValueError, match=r'then n_layer = 2 compressed memories \[cmlen, bsz, d_model\]'):
        model(data, data, *mems[:3])
    mems[4] = mems[4][:-1] if mems[4].shape[0] else torch.zeros(1, 2, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r'mems\[4\] has length .* but mems\[3\] has .*compressed memories'):
        model(data, data, *mems)


def test_generation_carries_the_compressed_memory():
    """Greedy sampling at rate 1 with an identity compression gives the tokens of Transformer-XL with the longer
    context: one-token steps compress what falls out of the memory and attend to it (a sampler that dropped the
    compressed memories would see `cmem_len` fewer positions once the memory is full)."""
    from labml_txl.xl.generation import generate
    # (weights large enough that the greedy token depends on the context: a tiny model's repeats one token)
    compressive = _model(attn_type='rotary', mem_len=4, cmem_len=6, compression_rate=1, compression='max_pool',
                         seed=3, init_std=0.5)
    xl = _model(attn_type='rotary', mem_len=10, seed=3)
    xl.load_state_dict(compressive.state_dict())
    prompt = _tokens(3, seed=4)
    ours = generate(compressive, prompt, 20, context=4, top_k=1)
    theirs = generate(xl, prompt, 20, context=10, top_k=1)
    assert torch.equal(ours, theirs)
    forgetful = _model(attn_type='rotary', mem_len=4, seed=3)
    forgetful.load_state_dict(compressive.state_dict())
    assert not torch.equal(generate(forgetful, prompt, 20, context=4, top_k=1), theirs)


def test_reset_length_changes_the_compressed_memory_and_checks_it():
    """A longer compressed memory for evaluation: the model then keeps (and, at rate 1 with an identity compression,
    equals Transformer-XL with) the longer one; a model without one refuses it."""
    compressive = _model(mem_len=4, cmem_len=2, compression_rate=1, compression='max_pool')
    compressive.reset_length(5, 0, 4, cmem_len=6)
    xl = _model(mem_len=10)
    xl.load_state_dict(compressive.state_dict())
    c_mems, xl_mems = [], []
    for data, target in _segments([5, 5, 5]):
        c_loss, *c_mems = compressive(data, target, *c_mems)
        xl_loss, *xl_mems = xl(data, target, *xl_mems)
        assert_same_function(c_loss, xl_loss)
    assert c_mems[3].shape[0] == 6
    with pytest.raises(ValueError, match='cmem_len=0 is not accepted by a model built with cmem_len=6'):
        compressive.reset_length(5, 0, 4, cmem_len=0)
    with pytest.raises(ValueError, match='cmem_len=2 is not accepted by a model built with cmem_len=0'):
        xl.reset_length(5, 0, 4, cmem_len=2)
    with pytest.raises(ValueError, match='mem_len must be at least compression_rate'):
        _model(mem_len=4, cmem_len=2, compression_rate=4).reset_length(5, 0, 3, cmem_len=3)
