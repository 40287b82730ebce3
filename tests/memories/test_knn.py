"""
The Memorizing Transformer's kNN memory (`memories/knn.py`, `memories/retrieval.py`), in float64: off (or its gate
closed) is Transformer-XL exactly; with `knn_k` at least the store's size, and a store as long as Transformer-XL's
memory, the retrieval is dense attention over that memory, and with fewer it is attention over each query's nearest
keys as a sort finds them; a token still in the store reaches a later segment and an evicted one does not; faiss's
exact index finds the neighbours torch's does; generation is the segment-by-segment computation; a run resumes
exactly with its store.
"""
import signal

import pytest
import torch

from labml_txl.fast import dispatch
from labml_txl.memories import knn
from labml_txl.memories.retrieval import attend_to_nearest
from labml_txl.memories.state import StateLayout
from labml_txl.xl import MemTransformerLM
from labml_txl.xl.generation import generate

from memories.sampling import greedy_by_recomputation
from xl.helpers import small_config


def _tokens(n: int, bsz: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 40, (n, bsz), generator=torch.Generator().manual_seed(seed))


def _model(seed: int = 0, **overrides) -> MemTransformerLM:
    torch.manual_seed(seed)
    return MemTransformerLM(**small_config(**overrides)).double().eval()


def _segments(n: int = 4, length: int = 5, seed: int = 1, stream=None):
    stream = _tokens(n * length + 1, seed=seed) if stream is None else stream
    return [(stream[i:i + length], stream[i + 1:i + length + 1]) for i in range(0, n * length, length)]


def _run(model, segments):
    """Each segment's loss, and the state after the last."""
    mems, losses = [], []
    with torch.no_grad():
        for data, target in segments:
            loss, *mems = model(data, target, *mems)
            losses.append(loss)
    return losses, mems


def test_off_and_closed_are_transformer_xl_exactly():
    """`knn_mem_size=0` builds nothing; with the store on and its gate closed ($g_h = \\sigma(-10^4) = 0$ in float64)
    the losses are Transformer-XL's to the last bit, though the store fills."""
    xl = _model()
    off = _model(knn_mem_size=0, knn_k=3, knn_layers=[1])
    assert list(off.state_dict()) == list(xl.state_dict()) and off.knn_memory is None
    closed = _model(knn_mem_size=10, knn_k=3)
    assert set(closed.state_dict()) - set(xl.state_dict()) == {'knn_memory.gate', 'knn_memory.scale'}
    with torch.no_grad():
        closed.knn_memory.gate.fill_(-1e4)
    segments = _segments()
    expected, _ = _run(xl, segments)
    for model in (off, closed):
        losses, mems = _run(model, segments)
        assert all(torch.equal(a, b) for a, b in zip(losses, expected, strict=True))
    assert mems[-1].shape == (10, 2, 2, 8)


def _naive_retrieval(queries, keys, values, scale, k):
    """Attention of each query over its `k` nearest normalised keys, found by sorting, one query at a time."""
    out = torch.zeros_like(queries)
    for b in range(queries.shape[0]):
        for h in range(queries.shape[1]):
            for i in range(queries.shape[2]):
                q = queries[b, h, i] / queries[b, h, i].norm()
                similarity = keys[b, h] @ q
                chosen = similarity.argsort(descending=True)[:k]
                weights = torch.softmax(scale[h] * similarity[chosen], dim=0)
                out[b, h, i] = weights @ values[b, h, chosen]
    return out


@pytest.mark.parametrize('knn_k', [10, 3])
def test_the_branch_is_attention_over_what_transformer_xls_memory_holds(knn_k):
    """After segments of 5 with `mem_len = knn_mem_size = 10`, the store holds layer 1's normalised keys and values
    of what Transformer-XL's memory holds, and the branch is $g\\, \\mathop{softmax}(s\\, \\hat{q}^\\top \\hat{k})\\, v +
    (1 - g)\\, v_c$ over it: dense attention with `knn_k = 10`, attention over the 3 nearest (by a sort) with 3."""
    model = _model(mem_len=10, knn_mem_size=10, knn_k=knn_k, knn_layers=[1])
    with torch.no_grad():
        model.knn_memory.gate.copy_(torch.tensor([[0.3, -1.1]], dtype=torch.float64))
        model.knn_memory.scale.copy_(torch.tensor([[2.0, 5.0]], dtype=torch.float64))
    _, flat = _run(model, _segments(3))
    states = StateLayout(model.memories_on()).unflatten(flat)
    memory = states[model.xl_memory]['mem'][1]
    assert memory.shape[0] == 10
    attention = model.layers[1].dec_attn
    # $[W_k; W_v] m$ of layer 1's memory, `[2, bsz, n_head, mlen, d_head]`
    kv = attention._kv_heads(memory @ attention.qkv_net.weight[16:].T)
    keys, values = torch.nn.functional.normalize(kv[0], dim=-1), kv[1]
    generator = torch.Generator().manual_seed(5)
    queries = torch.randn(2, 2, 4, 8, generator=generator, dtype=torch.float64)
    local = torch.randn(4, 2, 16, generator=generator, dtype=torch.float64)
    gate = torch.sigmoid(torch.tensor([0.3, -1.1], dtype=torch.float64))
    retrieved = _naive_retrieval(queries, keys, values, torch.tensor([2.0, 5.0], dtype=torch.float64), knn_k)
    expected = (gate[:, None] * retrieved.permute(2, 0, 1, 3)
                + (1 - gate[:, None]) * local.unflatten(-1, (2, 8))).flatten(-2)
    branch = model.knn_memory.attention_branch(states[model.knn_memory], 1)
    with torch.no_grad():
        ours = branch(queries, local)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)
    assert model.knn_memory.attention_branch(states[model.knn_memory], 0) is None


def test_a_stored_token_reaches_later_segments_and_an_evicted_one_does_not():
    """With `mem_len=0` and one kNN layer, a token of segment 1 changes segment 3's losses while segment 1 is in the
    store (`knn_mem_size=10`, two segments of 5), and not at all once it is evicted (5), nor without the store."""
    def third(token: int, **knn_settings) -> torch.Tensor:
        stream = _tokens(16, seed=2)
        stream[1] = token
        losses, _ = _run(_model(mem_len=0, init_std=0.3, **knn_settings), _segments(3, stream=stream))
        return losses[2]

    kept = dict(knn_mem_size=10, knn_k=4, knn_layers=[-1])
    assert not torch.allclose(third(3, **kept), third(7, **kept), rtol=0, atol=1e-6)
    evicted = dict(knn_mem_size=5, knn_k=4, knn_layers=[-1])
    assert torch.equal(third(3, **evicted), third(7, **evicted))
    assert torch.equal(third(3), third(7))


def test_the_fast_path_refuses_the_decoder_kernel_with_a_reason():
    """In evaluation, a layer with a second attention runs by its modules, and the dispatcher says why."""
    model = _model(knn_mem_size=10, knn_k=3).float()
    with torch.no_grad(), dispatch.recording() as decisions:
        mems = []
        for data, _ in _segments(2):
            _, mems = model.log_probs(data[:1], mems)
    refusals = [d for d in decisions if d.operation == 'decoder layers']
    assert refusals and 'kNN memory' in dict(refusals[-1].refused)['fused']


def test_generation_is_the_segment_by_segment_computation():
    """Greedy tokens of `generate` with a kNN memory are those of the text recomputed from its start in segments of
    `tgt_len` before every token: a query retrieves among earlier segments only."""
    model = _model(mem_len=4, tgt_len=4, knn_mem_size=8, knn_k=3, init_std=0.5, seed=3)
    with torch.no_grad():
        model.knn_memory.gate.fill_(2.0)
    prompt = _tokens(6, seed=4)
    ours = generate(model, prompt, 10, context=4, top_k=1)
    assert torch.equal(ours, greedy_by_recomputation(model, prompt, 10, 4))


def test_bad_settings_are_refused(tmp_path, monkeypatch):
    for settings, message in [(dict(knn_mem_size=-1), 'knn_mem_size'), (dict(knn_k=0), 'knn_k'),
                              (dict(knn_index='annoy'), "knn_index='annoy' is not accepted: 'torch'"),
                              (dict(knn_layers=2), 'knn_layers=2 is not accepted: a list'),
                              (dict(knn_mem_size=4, knn_layers=[2]), r'\[2\] are not layers; indices -2 to 1'),
                              (dict(knn_mem_size=4, knn_layers=[1, -1]), 'names a layer twice')]:
        with pytest.raises(ValueError, match=message):
            MemTransformerLM(**small_config(**settings))
    with pytest.raises(ValueError, match="knn_mem_size=4 .*Hugging Face's TransfoXL has no kNN memory"):
        MemTransformerLM(**small_config(knn_mem_size=4)).save_pretrained(tmp_path / 'hf')
    monkeypatch.setattr('importlib.util.find_spec', lambda name, *args: None)
    with pytest.raises(ImportError, match="knn_index='faiss' needs faiss-cpu.*make test-faiss"):
        MemTransformerLM(**small_config(knn_mem_size=4, knn_index='faiss'))
    assert knn.default_knn_layer(12) == 8 and knn.default_knn_layer(2) == 0


@pytest.mark.faiss
def test_faiss_finds_the_neighbours_torch_finds():
    r"""faiss's exact inner-product index returns the neighbours of torch's scan (keys far enough apart that float32
    cannot reorder them: the 8 best scores of each query differ by more than 1e-5, where float32's error on a product
    of two unit vectors of 8 features, rounded on input, is below $(8 + 2) \cdot 2^{-24} < 10^{-6}$), so the outputs
    agree in float64; and a model's losses do too."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(2, 3, 40, 8, generator=generator, dtype=torch.float64), dim=-1)
    values = torch.randn(2, 3, 40, 8, generator=generator, dtype=torch.float64)
    queries = torch.randn(2, 3, 6, 8, generator=generator, dtype=torch.float64)
    similarity = torch.einsum('bhqd,bhld->bhql', torch.nn.functional.normalize(queries, dim=-1), keys)
    assert similarity.sort(dim=-1).values.diff(dim=-1)[..., -8:].min() > 1e-5
    scale = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64)
    by_torch = attend_to_nearest(queries, keys, values, scale, 7, 'torch')
    by_faiss = attend_to_nearest(queries, keys, values, scale, 7, 'faiss')
    torch.testing.assert_close(by_faiss, by_torch, rtol=0, atol=1e-12)
    segments = _segments()
    expected, _ = _run(_model(knn_mem_size=10, knn_k=3), segments)
    losses, _ = _run(_model(knn_mem_size=10, knn_k=3, knn_index='faiss'), segments)
    for ours, theirs in zip(losses, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)


def test_resume_mid_run_keeps_the_store_and_equals_an_uninterrupted_run(tmp_path):
    """A run with a kNN memory killed after step 15's checkpoint resumes to the same losses and weights: the
    checkpoint holds each store, `[knn_mem_size, batch_size, n_head, d_head]` of keys and of values (here 2 x 16 KiB
    in float32)."""
    from labml import lab
    from labml_txl.train.checkpoint import load_latest_checkpoint
    from train import test_resume
    import train_xl
    overrides = {**test_resume.OVERRIDES, 'knn_mem_size': 32, 'knn_k': 4}
    lab.configure({'path': str(tmp_path)})
    try:
        stopped = test_resume._stopped_run(tmp_path, 'knn', signal.SIGKILL, overrides)
        assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-2000:]
        (checkpoints,) = [path for path in tmp_path.rglob('checkpoints') if 'knn' in str(path)]
        step, state = load_latest_checkpoint(checkpoints)
        assert step == 15
        stores = [m for m in state['mems'] if m.dim() == 4]
        assert [tuple(m.shape) for m in stores] == [(32, 4, 2, 16)] * 2
        assert sum(m.numel() * m.element_size() for m in stores) == 2 * 16 * 1024
        resumed = train_xl.train({}, resume='knn', screen=False)
        uninterrupted = train_xl.train(dict(overrides), screen=False)
    finally:
        lab.configure({'path': str(test_resume.REPO)})
    assert [step for step, _ in resumed.history] == list(range(16, 31))
    expected = dict(uninterrupted.history)
    assert [(step, expected[step]) for step, _ in resumed.history] == resumed.history
    for (name, ours), (_, theirs) in zip(resumed.model.state_dict().items(),
                                         uninterrupted.model.state_dict().items()):
        assert torch.equal(ours, theirs), name
