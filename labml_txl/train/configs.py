r"""
# Training configs of Transformer-XL

`TrainXLConfigs` extends `TransformerXLConfigs` (the model's items) with the data, the optimizer, the schedule and
the loop of the original `train.py`, with its defaults. Every item can be overridden by dictionary or as
`key=value` on the command line of `experiments/train_xl.py`; `preset` also sets the training columns of
`presets.md` (optimizer Adam, lr 0.00025, cosine schedule and clip 0.25 are the defaults already).
"""
import math
from typing import Dict, List, Optional

import torch
from labml.configs import aggregate, option

from ..configs.presets import PRESETS, TRAINING_COLUMNS
from ..configs.xl import TransformerXLConfigs
from ..data import Corpus, get_corpus
from ..errors import closest, describe_choices, require_positive_int
from ..memories import registry as memory_registry
from .schedules import SCHEDULES, make_scheduler

PRECISIONS = ('float32', 'bf16', 'fp16')


class TrainXLConfigs(TransformerXLConfigs):
    """The model, data, optimizer, schedule and loop of a Transformer-XL training run."""
    # The corpus: a name of `labml_txl.data.get_corpus`
    corpus_name: str = 'tiny_shakespeare'
    # The corpus's file or folder (none for the bundled Tiny Shakespeare)
    data_path: Optional[str] = None
    # The corpus, read from `data_path`
    corpus: Corpus
    # Vocabulary size, from the corpus
    n_token: int
    # Sequences per batch
    batch_size: int = 60
    # Split each batch into this many chunks and accumulate gradients (same result, less memory)
    batch_chunk: int = 1
    # Variable-length segments (the original's `varlen`)
    varlen: bool = False

    # Optimizer: 'adam', 'sgd' or 'adagrad'
    optimizer: torch.optim.Optimizer = 'adam'
    # Learning rate (peak of the schedule)
    lr: float = 0.00025
    # Momentum of SGD
    mom: float = 0.0
    # Schedule: 'cosine' (with warm-up), 'inv_sqrt', 'dev_perf' or 'constant'
    scheduler: object = 'cosine'
    # Steps of linear warm-up
    warmup_step: int = 0
    # Training steps
    max_step: int = 100000
    # Lowest learning rate of the cosine schedule
    eta_min: float = 0.0
    # Factor of `dev_perf`'s decay
    decay_rate: float = 0.5
    # Lowest learning rate of `dev_perf`
    lr_min: float = 0.0
    # Gradient-norm clipping
    clip: float = 0.25
    # Weight of the compressed memory's attention-reconstruction loss in the training loss (with `cmem_len > 0`)
    ar_loss_weight: float = 1.0
    # Weights of the memory mechanisms' auxiliary losses by name, e.g. {'reconstruction': 0.5} (1.0 where not given)
    aux_loss_weights: Dict[str, float] = {}

    # Modules of your own imported before the configs are built, e.g. a memory mechanism's (`docs/memories.md`);
    # kept with the run, so its resume, evaluation and sampling import them too
    imports: List[str] = []

    # 'float32', 'bf16' (autocast; on the CPU too) or 'fp16' (autocast with a gradient scaler; CUDA only)
    precision: str = 'float32'
    # 'cpu', 'cuda', 'cuda:1', ... or 'auto' (CUDA when there is one)
    device: str = 'auto'
    # Random seed of the weights, the data order and dropout
    seed: int = 1111

    # Evaluate on the validation split every this many steps
    eval_interval: int = 4000
    # Validation segments per evaluation (-1: all of the split)
    max_eval_steps: int = -1
    # Save a checkpoint every this many steps (0: only at the end)
    checkpoint_interval: int = 1000
    # Stop after this many seconds of training (0: no limit), evaluating and saving first
    time_limit: float = 0.0

    # The hyperparameters of an original run script, training columns included
    preset: str = 'none'


@option(TrainXLConfigs.corpus)
def _corpus(c: TrainXLConfigs) -> Corpus:
    """The corpus `corpus_name` read from `data_path`"""
    return get_corpus(c.corpus_name, c.data_path)


@option(TrainXLConfigs.n_token)
def _n_token(c: TrainXLConfigs) -> int:
    """The corpus's vocabulary size"""
    return c.corpus.n_token


def fused_adam(parameters, lr: float) -> torch.optim.Adam:
    """Adam with PyTorch's fused kernel where this torch has one for the parameters' device (the same update in one
    pass over all parameters, a third of the time; `docs/performance.md`), else the default Adam."""
    parameters = list(parameters)
    try:
        return torch.optim.Adam(parameters, lr=lr, fused=True)
    except RuntimeError:
        # A device without a fused Adam in this torch
        return torch.optim.Adam(parameters, lr=lr)


@option(TrainXLConfigs.optimizer, 'adam')
def _adam(c: TrainXLConfigs):
    """Adam (the original's default), fused where possible (`fused_adam`)"""
    return fused_adam(c.model.parameters(), c.lr)


@option(TrainXLConfigs.optimizer, 'sgd')
def _sgd(c: TrainXLConfigs):
    """SGD with momentum `mom`"""
    return torch.optim.SGD(c.model.parameters(), lr=c.lr, momentum=c.mom)


@option(TrainXLConfigs.optimizer, 'adagrad')
def _adagrad(c: TrainXLConfigs):
    """Adagrad"""
    return torch.optim.Adagrad(c.model.parameters(), lr=c.lr)


def _schedule_option(name: str):
    def schedule(c: TrainXLConfigs):
        return make_scheduler(name, c.optimizer, warmup_step=c.warmup_step, max_step=c.max_step, lr=c.lr,
                              eta_min=c.eta_min, decay_rate=c.decay_rate, lr_min=c.lr_min)

    schedule.__doc__ = {'cosine': 'Linear warm-up, then cosine annealing to `eta_min` at `max_step`',
                        'inv_sqrt': 'Linear warm-up, then $1/\\sqrt{step}$',
                        'dev_perf': 'Multiplied by `decay_rate` when the validation loss stops improving',
                        'constant': 'The learning rate `lr` throughout'}[name]
    option(TrainXLConfigs.scheduler, name)(schedule)


for _name in SCHEDULES:
    _schedule_option(_name)


def check_max_eval_steps(max_eval_steps: int) -> None:
    """A `ValueError` unless `max_eval_steps` is a number of segments to evaluate, or -1 (or 0) for the whole split
    (training's validation and `eval_xl.py` take it alike)."""
    if max_eval_steps < -1:
        raise ValueError(f"max_eval_steps={max_eval_steps} is not accepted: the number of segments evaluated, "
                         f"or -1 (or 0) for the whole split")


def check_training_configs(c: TrainXLConfigs) -> None:
    """Raise `ValueError` for choices that labml's options do not check, or that are only wrong together."""
    for name in ('checkpoint_interval', 'warmup_step', 'batch_size', 'batch_chunk'):
        require_positive_int(name, getattr(c, name), allow_zero=name in ('checkpoint_interval', 'warmup_step'))
    if c.precision not in PRECISIONS:
        raise ValueError(f"precision={c.precision!r} is not accepted.{closest(c.precision, PRECISIONS)} "
                         f"Accepted: {describe_choices(PRECISIONS)}")
    if c.batch_size % c.batch_chunk != 0:
        raise ValueError(f"batch_chunk={c.batch_chunk} is not accepted with batch_size={c.batch_size}: "
                         f"the batch is split into batch_chunk equal chunks, so batch_chunk must divide batch_size")
    if c.mem_len > 0 and c.eval_tgt_len > c.tgt_len + c.mem_len:
        raise ValueError(f"eval_tgt_len={c.eval_tgt_len} is not accepted with tgt_len={c.tgt_len} and "
                         f"mem_len={c.mem_len}: validation lengthens the memory by tgt_len - eval_tgt_len, so "
                         f"eval_tgt_len must be at most tgt_len + mem_len = {c.tgt_len + c.mem_len}")
    if c.mem_len == 0 and c.eval_tgt_len > c.tgt_len + c.ext_len:
        raise ValueError(f"eval_tgt_len={c.eval_tgt_len} is not accepted with tgt_len={c.tgt_len} and "
                         f"ext_len={c.ext_len}: without memory, validation lengthens ext_len by "
                         f"tgt_len - eval_tgt_len, so eval_tgt_len must be at most {c.tgt_len + c.ext_len}")
    if c.max_step < 1:
        raise ValueError(f"max_step={c.max_step} is not accepted: train for at least one step")
    if c.eval_interval < 1:
        raise ValueError(f"eval_interval={c.eval_interval} is not accepted: validation runs every eval_interval "
                         f"steps (and after the last), so it must be at least 1 (a large value validates rarely)")
    check_max_eval_steps(c.max_eval_steps)
    if not math.isfinite(c.ar_loss_weight) or c.ar_loss_weight < 0:
        raise ValueError(f"ar_loss_weight={c.ar_loss_weight} is not accepted: the weight of the attention-"
                         f"reconstruction loss, a finite number >= 0 (0 leaves the compression untrained)")
    aux_loss_weights(c)
    if c.time_limit < 0:
        raise ValueError(f"time_limit={c.time_limit} is not accepted: seconds of training, or 0 for no limit")


def aux_loss_weights(c: TrainXLConfigs) -> Dict[str, float]:
    """
    The weight of every registered mechanism's auxiliary loss, by name: `aux_loss_weights`' where it names it, else
    `ar_loss_weight` for the compressed memory's `'reconstruction'` (its name before the mechanisms had a seam), else
    1.0. A `ValueError` names a loss no mechanism has, a weight that is not a finite number >= 0, or the
    reconstruction's weight given twice. A loss of a mechanism that is off may be weighted (a sweep sets one value for
    every run).
    """
    given = c.aux_loss_weights
    if not isinstance(given, dict):
        raise ValueError(f"aux_loss_weights={given!r} is not accepted: a dict of loss name to weight, e.g. "
                         f"{{'reconstruction': 0.5}}")
    known = {name for cls in memory_registry.MEMORIES.values() for name in cls.losses}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"aux_loss_weights names {unknown}, which no memory mechanism has: the auxiliary losses are "
                         f"{', '.join(map(repr, sorted(known))) or 'none'}")
    for name, weight in given.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"aux_loss_weights[{name!r}]={weight!r} is not accepted: a finite number >= 0")
    if 'reconstruction' in given and c.ar_loss_weight != 1.0:
        raise ValueError(f"aux_loss_weights['reconstruction']={given['reconstruction']} and "
                         f"ar_loss_weight={c.ar_loss_weight} are not accepted together: both weigh the compressed "
                         f"memory's reconstruction loss; give one")
    defaults = {'reconstruction': c.ar_loss_weight}
    return {name: float(given.get(name, defaults.get(name, 1.0))) for name in sorted(known)}


def check_splits_fit(corpus: Corpus, batch_size: int) -> None:
    """A `ValueError` before training unless the validation and test splits each give a batch: evaluation cuts a
    split into `batch_size` columns of at least two tokens (an input and its target)."""
    if not corpus.ordered:
        return
    for split in ('valid', 'test'):
        tokens = getattr(corpus, split).numel()
        if tokens < 2 * batch_size:
            raise ValueError(f"the {split} split of {corpus.name} has {tokens} tokens, too few for "
                             f"batch_size={batch_size}: evaluation cuts it into batch_size columns of at least 2 "
                             f"tokens (an input and its target), so it needs at least {2 * batch_size}; use a "
                             f"batch_size of at most {tokens // 2} or a corpus with a larger {split} split")


def device_of_name(name: str) -> torch.device:
    """The device `name` names; `'auto'` is CUDA when there is one."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"device={name!r} is not accepted: {error}") from error
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} is not accepted: this machine has no CUDA device; use 'cpu' or 'auto'")
    return device


def device_of(c: TrainXLConfigs) -> torch.device:
    """The device of the configs' `device` item."""
    return device_of_name(c.device)


# ## Presets: the training columns of `presets.py`'s table

for _name, _row in PRESETS.items():
    aggregate(TrainXLConfigs.preset, _name, *((getattr(TrainXLConfigs, column), _row[column])
                                              for column in TRAINING_COLUMNS))
