r"""
# Learning-rate schedules of the original Transformer-XL

`train.py` of the original offers four schedules; the learning rate at step $t$ (counted from 1) is

- `cosine`: a linear warm-up $\eta \, t / T_{warm}$ for $t \le T_{warm}$, then cosine annealing
  $\eta_{min} + \frac{1}{2}(\eta - \eta_{min})(1 + \cos(\pi \, t / T_{max}))$ (the original anneals over the
  step count itself, warm-up steps included);
- `inv_sqrt`: $\eta \, t / T_{warm}^{1.5}$ during warm-up, then $\eta / \sqrt{t}$;
- `dev_perf`: $\eta$ halved (by `decay_rate`) whenever the validation loss does not improve, down to $\eta_{min}$;
- `constant`: $\eta$.

Each is a `torch.optim.lr_scheduler` object, so its `state_dict` goes into checkpoints as it is.
"""
import math

import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from ..errors import closest, describe_choices

SCHEDULES = ('cosine', 'inv_sqrt', 'dev_perf', 'constant')


def cosine_with_warmup(step: int, warmup_step: int, max_step: int, eta_min_ratio: float) -> float:
    """The multiplier of the base learning rate for the `cosine` schedule at `step`."""
    if warmup_step > 0 and step <= warmup_step:
        # $t / T_{warm}$
        return step / warmup_step
    # $\eta_{min}/\eta + \frac{1}{2}(1 - \eta_{min}/\eta)(1 + \cos(\pi t / T_{max}))$
    progress = min(step, max_step) / max_step
    return eta_min_ratio + 0.5 * (1 - eta_min_ratio) * (1 + math.cos(math.pi * progress))


def inverse_square_root(step: int, warmup_step: int) -> float:
    """The multiplier of the base learning rate for the `inv_sqrt` schedule at `step`."""
    if step == 0 and warmup_step == 0:
        return 1.0
    if step > warmup_step:
        # $1 / \sqrt{t}$
        return 1.0 / math.sqrt(step)
    # $t / T_{warm}^{1.5}$
    return step / warmup_step ** 1.5


def make_scheduler(name: str, optimizer: torch.optim.Optimizer, *, warmup_step: int, max_step: int,
                   lr: float, eta_min: float = 0.0, decay_rate: float = 0.5, lr_min: float = 0.0):
    """
    The scheduler `name` for `optimizer`. Step-based schedulers are stepped once per training step;
    `dev_perf` is stepped with the validation loss after each evaluation.
    """
    if name not in SCHEDULES:
        raise ValueError(f"scheduler={name!r} is not accepted.{closest(name, SCHEDULES)} "
                         f"Accepted: {describe_choices(SCHEDULES)}")
    if name == 'cosine':
        if max_step < 1:
            raise ValueError(f"max_step={max_step} is not accepted for the cosine schedule: it must be at least 1")
        return LambdaLR(optimizer, lambda step: cosine_with_warmup(step, warmup_step, max_step, eta_min / lr))
    if name == 'inv_sqrt':
        return LambdaLR(optimizer, lambda step: inverse_square_root(step, warmup_step))
    if name == 'dev_perf':
        return ReduceLROnPlateau(optimizer, factor=decay_rate, patience=0, min_lr=lr_min)
    return LambdaLR(optimizer, lambda step: 1.0)
