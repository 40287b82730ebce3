"""Schedules against torch's own schedulers and the original's formulas at chosen points."""
import math

import pytest
import torch

from labml_txl.train.schedules import make_scheduler


def _optimizer(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lrs(scheduler, optimizer, steps):
    values = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        values.append(optimizer.param_groups[0]['lr'])
    return values


def test_cosine_after_warmup_equals_torchs_cosine_annealing():
    ours_opt, torch_opt = _optimizer(), _optimizer()
    ours = make_scheduler('cosine', ours_opt, warmup_step=0, max_step=50, lr=0.1, eta_min=0.01)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(torch_opt, T_max=50, eta_min=0.01)
    for a, b in zip(_lrs(ours, ours_opt, 50), _lrs(reference, torch_opt, 50)):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)


def test_cosine_warmup_is_linear_then_continues_the_cosine():
    optimizer = _optimizer()
    lrs = _lrs(make_scheduler('cosine', optimizer, warmup_step=10, max_step=100, lr=0.1), optimizer, 100)
    assert lrs[:10] == pytest.approx([0.1 * t / 10 for t in range(1, 11)])
    # Step 11 is on the cosine over the whole run, as in the original
    assert lrs[10] == pytest.approx(0.05 * (1 + math.cos(math.pi * 11 / 100)))
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_inverse_square_root():
    optimizer = _optimizer(1.0)
    lrs = _lrs(make_scheduler('inv_sqrt', optimizer, warmup_step=4, max_step=0, lr=1.0), optimizer, 16)
    assert lrs[:4] == pytest.approx([t / 4 ** 1.5 for t in range(1, 5)])
    assert lrs[4:] == pytest.approx([1 / math.sqrt(t) for t in range(5, 17)])


def test_dev_perf_halves_on_no_improvement():
    optimizer = _optimizer(0.4)
    scheduler = make_scheduler('dev_perf', optimizer, warmup_step=0, max_step=0, lr=0.4, lr_min=0.1)
    for loss in (3.0, 2.0, 2.5, 2.5, 2.5, 2.5):
        scheduler.step(loss)
    # Three evaluations without improvement: 0.4 -> 0.2 -> 0.1, then held at lr_min
    assert optimizer.param_groups[0]['lr'] == pytest.approx(0.1)


def test_unknown_schedule_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"scheduler='cosin' is not accepted\. Did you mean 'cosine'\? "
                                         r"Accepted: 'cosine', 'inv_sqrt', 'dev_perf' or 'constant'"):
        make_scheduler('cosin', _optimizer(), warmup_step=0, max_step=1, lr=0.1)
