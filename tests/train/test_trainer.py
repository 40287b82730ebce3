"""The training step: gradient accumulation, precision, optimizers, and errors for bad settings."""
import sys
from pathlib import Path

import pytest
import torch
from labml import experiment

from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import train_xl  # noqa: E402
from tolerance import assert_same_function, rounding_bound  # noqa: E402

SMALL = {'n_layer': 2, 'd_model': 32, 'n_head': 2, 'd_head': 16, 'd_inner': 64, 'tgt_len': 8, 'mem_len': 8,
         'batch_size': 4, 'max_step': 4, 'eval_interval': 2, 'max_eval_steps': 2, 'checkpoint_interval': 0}


def make_trainer(tmp_path, monkeypatch, **overrides) -> Trainer:
    monkeypatch.chdir(tmp_path)
    conf = TrainXLConfigs()
    experiment.create(name='test', writers=set())
    experiment.configs(conf, {**SMALL, **overrides})
    return Trainer(conf)


def test_batch_chunk_gives_the_gradient_and_memories_of_the_whole_batch(tmp_path, monkeypatch):
    whole = make_trainer(tmp_path, monkeypatch)
    chunked = make_trainer(tmp_path, monkeypatch, batch_chunk=2)
    chunked.model.load_state_dict(whole.model.state_dict())
    for trainer in (whole, chunked):
        trainer.model.double()
    for trainer in (whole, chunked):
        # Compare gradients, not updates: the optimizer does nothing
        trainer.optimizer.param_groups[0]['lr'] = 0.0
        trainer.scheduler.base_lrs = [0.0]
    data, target, _ = whole._next_batch()
    for step in range(2):
        # Two steps, so the second uses memories that were split and joined again
        loss_whole = whole.train_step(data, target)
        loss_chunked = chunked.train_step(data, target)
        assert loss_chunked == pytest.approx(loss_whole, rel=1e-12)
        for (name, p), q in zip(whole.model.named_parameters(), chunked.model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=name)
        for a, b in zip(whole.mems, chunked.mems):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_bf16_autocast_trains_on_the_cpu_close_to_float32(tmp_path, monkeypatch):
    full = make_trainer(tmp_path, monkeypatch)
    half = make_trainer(tmp_path, monkeypatch, precision='bf16')
    half.model.load_state_dict(full.model.state_dict())
    data, target, _ = full._next_batch()
    with torch.no_grad():
        logits = full.model.logits(data)[0].abs().max().item()
    loss_full, loss_half = full.train_step(data, target), half.train_step(data, target)
    # bf16 really ran (the numbers differ) and stays within the precision bf16 allows (tolerance.py's rule 2):
    # autocast rounds each product's inputs and output (3 roundings), 13 products on the longest path (per layer: the
    # projections, the scores, the weights times the values, the output, the two of the feed-forward; the softmax
    # layer's); the loss carries its logits' error at most twice (log-softmax)
    bound = rounding_bound(torch.bfloat16, depth=3 * (6 * SMALL['n_layer'] + 1), magnitude=2 * logits)
    assert loss_half != loss_full and abs(loss_half - loss_full) <= bound
    half.run()
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in half.history)


@pytest.mark.parametrize('optimizer,kind', [('adam', torch.optim.Adam), ('sgd', torch.optim.SGD),
                                            ('adagrad', torch.optim.Adagrad)])
def test_optimizers_lower_the_training_loss(optimizer, kind, tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, monkeypatch, optimizer=optimizer, lr=0.05 if optimizer != 'adam' else 0.005,
                           mom=0.9, max_step=30, eval_interval=100, scheduler='constant')
    assert isinstance(trainer.optimizer, kind)
    data, target, _ = trainer._next_batch()
    first = trainer.train_step(data, target)
    for _ in range(20):
        trainer.mems = None
        last = trainer.train_step(data, target)
    assert last < first - 0.5


def test_adam_is_fused_and_steps_as_plain_adam_does(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, monkeypatch, optimizer='adam', lr=0.01)
    assert trainer.optimizer.defaults['fused']
    # In float64, the same function (tolerance.py's rule 1): the parameters converted in place, as the optimizer
    # holds them
    params = list(trainer.model.parameters())
    trainer.model.double()
    assert all(p is q and p.dtype == torch.float64 for p, q in zip(params, trainer.model.parameters()))
    twins = [p.detach().clone().requires_grad_() for p in params]
    plain = torch.optim.Adam(twins, lr=0.01)
    torch.manual_seed(0)
    for _ in range(3):
        for p, twin in zip(params, twins):
            p.grad = torch.randn_like(p)
            twin.grad = p.grad.clone()
        trainer.optimizer.step()
        plain.step()
    for p, twin in zip(params, twins):
        assert_same_function(p.detach(), twin.detach())


def test_fp16_on_the_cpu_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"precision='fp16' is not accepted on device cpu.*use 'bf16'"):
        make_trainer(tmp_path, monkeypatch, precision='fp16', device='cpu')


def test_batch_chunk_must_divide_the_batch(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"batch_chunk=3 is not accepted with batch_size=4"):
        make_trainer(tmp_path, monkeypatch, batch_chunk=3)


def test_command_line_unknown_key_names_the_closest_key(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train_xl.main(['n_layr=3']) == 2
    assert "unknown config key 'n_layr'" in capsys.readouterr().err
    assert train_xl.main(['n_layr=3']) == 2
    assert "Did you mean 'n_layer'?" in capsys.readouterr().err


def test_command_line_unknown_corpus_names_the_corpora(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train_xl.main(['corpus_name=enwik9', 'max_step=1']) == 2
    err = capsys.readouterr().err
    assert "Unknown corpus name 'enwik9'" in err and "'enwik8'" in err


def test_kernels_are_prepared_before_the_time_limit_starts(tmp_path, monkeypatch):
    """Compiling the evaluation kernels (about a minute on a new machine) must not count against `time_limit`:
    `run` prepares them before it starts the clock."""
    from labml_txl.fast import native
    from labml_txl.train import trainer as trainer_module

    events = []
    monkeypatch.setattr(native, 'prepare_kernels', lambda: events.append('prepare') or True)
    clock = trainer_module.time.time

    def recording_time():
        events.append('clock')
        return clock()

    trainer = make_trainer(tmp_path, monkeypatch, max_step=1)
    monkeypatch.setattr(trainer_module.time, 'time', recording_time)
    trainer.run()
    assert events[0] == 'prepare' and events.count('prepare') == 1 and 'clock' in events


def test_prepare_kernels_says_whether_every_kernel_is_there(monkeypatch):
    from labml_txl.fast import native
    from labml_txl.fast.native import build

    assert native.prepare_kernels()
    monkeypatch.setenv(build.DISABLE_VARIABLE, '0')
    assert not native.prepare_kernels()


COMPRESSIVE = {'mem_len': 8, 'cmem_len': 4, 'compression_rate': 2}


def test_compressed_memory_trains_its_reconstruction_loss_with_its_weight(tmp_path, monkeypatch):
    """With `cmem_len > 0` the step minimises the language-model loss plus `ar_loss_weight` (or
    `aux_loss_weights['reconstruction']`) times the reconstruction loss: doubling the weight doubles the compression's
    gradients and leaves every other gradient, the language-model loss and the reconstruction loss as they are; chunks
    give the whole batch's gradients and memories, compressed ones included."""
    # (no clipping: the gradients are compared as computed)
    trainers = [make_trainer(tmp_path, monkeypatch, **COMPRESSIVE, clip=1e9, **extra)
                for extra in ({}, {'ar_loss_weight': 2.0}, {'batch_chunk': 2},
                              {'aux_loss_weights': {'reconstruction': 2.0}})]
    for trainer in trainers:
        trainer.model.load_state_dict(trainers[0].model.state_dict())
        trainer.model.double()
        trainer.optimizer.param_groups[0]['lr'] = 0.0
        trainer.scheduler.base_lrs = [0.0]
    one, two, chunked, by_name = trainers
    data, target, _ = one._next_batch()
    for step in range(3):
        losses = [trainer.train_step(data, target) for trainer in trainers]
        assert losses[1] == losses[0] == losses[3] and losses[2] == pytest.approx(losses[0], rel=1e-12)
        reconstruction = [trainer.aux_losses['reconstruction'] for trainer in trainers]
        if step == 0:
            # Nothing fell out of the memory yet
            assert reconstruction[0] == 0.0
            continue
        assert reconstruction[0] > 0.0 and reconstruction[1] == reconstruction[0] == reconstruction[3]
        assert reconstruction[2] == pytest.approx(reconstruction[0], rel=1e-12)
        for (name, p), q, r, b in zip(one.model.named_parameters(), two.model.parameters(), chunked.model.parameters(),
                                      by_name.model.parameters()):
            weight = 2.0 if name.startswith('compressed_memory.') else 1.0
            torch.testing.assert_close(q.grad, weight * p.grad, rtol=1e-12, atol=0, msg=name)
            torch.testing.assert_close(b.grad, q.grad, rtol=0, atol=0, msg=name)
            torch.testing.assert_close(r.grad, p.grad, rtol=1e-10, atol=1e-12, msg=name)
    assert len(one.mems) == 3 + 2 and one.mems[3].shape[0] == 4
    for a, b in zip(one.mems, chunked.mems, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_auxiliary_loss_weights_are_checked(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"aux_loss_weights names \['recon'\], which no memory mechanism has: .*"
                                         r"'reconstruction'"):
        make_trainer(tmp_path, monkeypatch, **COMPRESSIVE, aux_loss_weights={'recon': 1.0})
    with pytest.raises(ValueError, match=r"aux_loss_weights\['reconstruction'\]=-2.0 is not accepted"):
        make_trainer(tmp_path, monkeypatch, **COMPRESSIVE, aux_loss_weights={'reconstruction': -2.0})
    with pytest.raises(ValueError, match='both weigh .* give one'):
        make_trainer(tmp_path, monkeypatch, **COMPRESSIVE, ar_loss_weight=0.5,
                     aux_loss_weights={'reconstruction': 2.0})


def test_bad_reconstruction_weight_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match='ar_loss_weight=-1.0 is not accepted: .* a finite number >= 0'):
        make_trainer(tmp_path, monkeypatch, **COMPRESSIVE, ar_loss_weight=-1.0)
