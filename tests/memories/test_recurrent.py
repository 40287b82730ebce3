"""
The Recurrent Memory Transformer's memory tokens (`memories/recurrent.py`), in float64: off is Transformer-XL
exactly; the tokens carry information across segments by themselves; training's window of `bptt_segments` segments
gives the gradient of the window's loss through the memory (against finite differences, and against the segments
unrolled as one graph by hand); Transformer-XL's memory beside them keeps the token rows only; generation is the
segment-by-segment computation; a run resumes exactly.
"""
import signal

import pytest
import torch

from labml_txl.xl import MemTransformerLM
from labml_txl.xl.generation import generate
from tolerance import assert_same_function

from memories.sampling import greedy_by_recomputation
from xl.helpers import small_config


def _tokens(n: int, bsz: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 40, (n, bsz), generator=torch.Generator().manual_seed(seed))


def _model(seed: int = 0, **overrides) -> MemTransformerLM:
    torch.manual_seed(seed)
    return MemTransformerLM(**small_config(**overrides)).double()


def _segments(n: int = 3, length: int = 5, seed: int = 1):
    stream = _tokens(n * length + 1, seed=seed)
    return [(stream[i:i + length], stream[i + 1:i + length + 1]) for i in range(0, n * length, length)]


def _losses(model, segments, carry: bool):
    """Each segment's mean loss, the memory carried (with its graph where `carry`)."""
    mems, losses = [], []
    for j, (data, target) in enumerate(segments):
        loss, *mems = model(data, target, *mems, carry_gradient=carry and j < len(segments) - 1)
        losses.append(loss.mean())
    return losses


def test_off_is_transformer_xl_exactly():
    """`n_mem_tokens=0` builds nothing: the same parameters, losses and memories as a model without the setting,
    and `bptt_segments` alone changes nothing (the trainer's window is one segment)."""
    xl, off = _model(mem_len=5).eval(), _model(mem_len=5, n_mem_tokens=0, bptt_segments=3).eval()
    assert list(off.state_dict()) == list(xl.state_dict()) and off.memory_tokens is None
    assert off.gradient_segments() == 1 and not off.written_per_segment()
    mems_xl, mems_off = [], []
    for data, target in _segments():
        loss_xl, *mems_xl = xl(data, target, *mems_xl)
        loss_off, *mems_off = off(data, target, *mems_off)
        assert torch.equal(loss_xl, loss_off)
        assert all(torch.equal(a, b) for a, b in zip(mems_xl, mems_off, strict=True))


def test_the_memory_tokens_carry_information_by_themselves():
    """With `mem_len=0` a token of segment 1 changes the loss of segment 3 only through the memory tokens."""
    def third(n_mem_tokens: int, token: int) -> torch.Tensor:
        model = _model(mem_len=0, n_mem_tokens=n_mem_tokens).eval()
        segments = _segments()
        segments[0][0][0, 0] = token
        with torch.no_grad():
            return _losses(model, segments, carry=False)[2]
    assert not torch.equal(third(3, 1), third(3, 2))
    assert torch.equal(third(0, 1), third(0, 2))


def test_transformer_xl_memory_beside_them_keeps_the_token_rows():
    """RMT + XL: the memory of the first layer's input is the segment's word embeddings (dropout 0), not the memory
    tokens' rows; the state is `n_layer + 1` memories then the memory tokens."""
    model = _model(mem_len=5, n_mem_tokens=3).eval()
    (data, target), = _segments(1)
    with torch.no_grad():
        _, *mems = model(data, target)
    assert [m.shape[0] for m in mems] == [5, 5, 5, 3]
    assert_same_function(mems[0], model.word_emb(data))


def test_window_gradient_is_the_gradient_through_the_memory():
    """The gradient of the mean loss of 3 segments with the memory tokens' graph carried equals its central finite
    differences (float64), for the learned initial memory and a weight; detached (a window of 1), the gradient of
    segment 3's loss takes the memory it reads as a constant and misses what flows back through it. Without
    Transformer-XL's memory (`mem_len=0`): that memory is a stop-gradient by design (the paper's SG), so with it the
    true derivative that finite differences measure is not what training follows."""
    model = _model(mem_len=0, n_mem_tokens=2).train()
    segments = _segments()
    losses = _losses(model, segments, carry=True)
    torch.stack(losses).mean().backward()
    probes = [(model.memory_tokens.initial, (1, 3)), (model.layers[0].pos_ff.CoreNet[0].weight, (2, 5))]
    eps = 1e-6
    for param, index in probes:
        with torch.no_grad():
            original = param[index].item()
            values = []
            for shift in (eps, -eps):
                param[index] = original + shift
                values.append(torch.stack(_losses(model, segments, carry=False)).mean().item())
            param[index] = original
        # central differences: truncation ~eps^2, rounding ~1e-16 / eps
        assert param.grad[index].item() == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-6, abs=1e-9)
    # Detached: segment 3's loss does not reach the initial memory (read by segment 1 only)
    model.zero_grad()
    detached = _losses(model, segments, carry=False)
    detached[2].backward()
    assert model.memory_tokens.initial.grad is None or torch.count_nonzero(model.memory_tokens.initial.grad) == 0


def _trainer(tmp_path, monkeypatch, **overrides):
    from labml import experiment
    from labml_txl.train.configs import TrainXLConfigs
    from labml_txl.train.trainer import Trainer
    monkeypatch.chdir(tmp_path)
    conf = TrainXLConfigs()
    experiment.create(name='test', writers=set())
    experiment.configs(conf, {'n_layer': 2, 'd_model': 16, 'n_head': 2, 'd_head': 8, 'd_inner': 32, 'dropout': 0.0,
                              'tgt_len': 6, 'batch_size': 4, 'max_step': 4, 'clip': 1e9, **overrides})
    trainer = Trainer(conf)
    trainer.model.double()
    return trainer


@pytest.mark.parametrize('bptt_segments, batch_chunk', [(1, 1), (3, 1), (3, 2)])
def test_the_trainer_steps_on_a_window_unrolled_as_one_graph(tmp_path, monkeypatch, bptt_segments, batch_chunk):
    """One step of the trainer takes `bptt_segments` segments and computes the gradient of their mean loss through
    the memory tokens, as the segments unrolled by hand as one graph (in chunks of columns too); the memory it keeps
    after the window is detached and is the hand-computed one."""
    trainer = _trainer(tmp_path, monkeypatch, mem_len=6, n_mem_tokens=2, bptt_segments=bptt_segments,
                       batch_chunk=batch_chunk)
    model = trainer.model
    assert model.gradient_segments() == bptt_segments
    by_hand = MemTransformerLM(**{**small_config(), 'n_token': model.n_token, 'd_model': 16, 'tgt_len': 6,
                                  'mem_len': 6, 'n_mem_tokens': 2}).double().train()
    by_hand.load_state_dict(model.state_dict())
    segments = trainer._next_window()
    assert len(segments) == bptt_segments
    trainer.optimizer.param_groups[0]['lr'] = 0.0
    loss = trainer.train_window(segments)
    mems, losses = [], []
    for j, (data, target) in enumerate(segments):
        step_loss, *mems = by_hand(data, target, *mems, carry_gradient=j < len(segments) - 1)
        losses.append(step_loss.mean())
    expected = torch.stack(losses).mean()
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    for (name, ours), theirs in zip(model.named_parameters(), by_hand.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-10, atol=1e-13, msg=name)
    assert not any(m.requires_grad for m in trainer.mems)
    assert_same_function(trainer.mems[-1], mems[-1].detach())


def test_generation_is_the_segment_by_segment_computation():
    """Greedy tokens of `generate` with memory tokens are those of the text recomputed from its start, in segments
    of `tgt_len`, before every token; a sampler that updated the memory at every token would differ."""
    model = _model(mem_len=4, n_mem_tokens=2, tgt_len=4, init_std=0.5, seed=3).eval()
    prompt = _tokens(6, seed=4)
    ours = generate(model, prompt, 10, context=4, top_k=1)
    assert torch.equal(ours, greedy_by_recomputation(model, prompt, 10, 4))
    # (one token per call: the memory written after every token)
    with torch.no_grad():
        log_probs, mems = model.log_probs(prompt)
        per_token = []
        for _ in range(10):
            per_token.append(log_probs[-1].argmax(-1))
            log_probs, mems = model.log_probs(per_token[-1][None], mems)
    assert not torch.equal(ours, torch.stack(per_token))


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match='n_mem_tokens'):
        MemTransformerLM(**small_config(n_mem_tokens=-1))
    with pytest.raises(ValueError, match='bptt_segments'):
        MemTransformerLM(**small_config(bptt_segments=0))
    with pytest.raises(ValueError, match="n_mem_tokens=2 .*Hugging Face's TransfoXL has no Recurrent Memory "
                                         "Transformer's memory tokens"):
        MemTransformerLM(**small_config(n_mem_tokens=2)).save_pretrained(tmp_path / 'hf')
    assert not (tmp_path / 'hf').exists()


def test_resume_mid_run_with_a_window_of_three_equals_an_uninterrupted_run(tmp_path):
    """A run with memory tokens and `bptt_segments=3` killed after step 15's checkpoint resumes to the same losses and
    weights (a window is one step, so a checkpoint holds the memory between windows, detached)."""
    from labml import lab
    from train import test_resume
    import train_xl
    overrides = {**test_resume.OVERRIDES, 'mem_len': 8, 'n_mem_tokens': 2, 'bptt_segments': 3}
    lab.configure({'path': str(tmp_path)})
    try:
        stopped = test_resume._stopped_run(tmp_path, 'recurrent', signal.SIGKILL, overrides)
        assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-2000:]
        resumed = train_xl.train({}, resume='recurrent', screen=False)
        uninterrupted = train_xl.train(dict(overrides), screen=False)
    finally:
        lab.configure({'path': str(test_resume.REPO)})
    assert [step for step, _ in resumed.history] == list(range(16, 31))
    expected = dict(uninterrupted.history)
    assert [(step, expected[step]) for step, _ in resumed.history] == resumed.history
    assert 'memory_tokens.initial' in resumed.model.state_dict()
    for (name, ours), (_, theirs) in zip(resumed.model.state_dict().items(),
                                         uninterrupted.model.state_dict().items()):
        assert torch.equal(ours, theirs), name
