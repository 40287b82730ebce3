r"""
# The Transformer-XL training loop

The loop of the original `train.py`, on labml: segments are read in order, each continuing the one before, and
the memories of one step are the context of the next (reset at the end of each pass over the data). A step is

1. the loss of the segment given the memories, averaged over positions and the batch (in `batch_chunk` chunks,
   each with its own columns of the memories, gradients accumulated: the same gradient as the whole batch);
2. gradient-norm clipping at `clip`, an optimizer step and a schedule step.

A step whose loss or gradient norm is not finite (NaN or infinite) is not taken: training stops with
`TrainingDiverged`, naming the step, and the checkpoints already written, all of finite weights, stay. (Under
fp16 an infinite gradient is the gradient scaler's to handle: it skips that step and lowers its scale.) A
checkpoint is never written from a state that is not finite, and one read on resume is refused
(`checkpoint.check_finite_state`).

Every `eval_interval` steps the model is evaluated on the validation split with segments of `eval_tgt_len` (the
memory grown by `tgt_len - eval_tgt_len` so every position sees as much context as in training), and every
`checkpoint_interval` steps the whole state is saved: model, optimizer, schedule, data position, memories and
random states, so a resumed run continues exactly as if it had never stopped.

Tracked: `loss.train`, `bpc.train` (character and byte corpora) or `ppl.train` (word corpora), `lr`,
`grad_norm`, `tokens_per_sec`, and the same losses `.valid`. Where a memory mechanism that is on has auxiliary losses
(the compressed memory's attention-reconstruction loss, `cmem_len > 0`), the step minimises the language-model loss
plus each weighted by its name's `aux_loss_weights` (the reconstruction's by `ar_loss_weight`), each tracked apart
as its mechanism's series (`ar_loss.train`); `loss.train` stays the language model's, comparable with runs without
one.
"""
import contextlib
import math
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from labml import monit, tracker

from ..fast import native
from .checkpoint import (CheckpointError, checkpoint_steps, check_finite_state, check_model_state, non_finite_values,
                         save_checkpoint)
from .configs import TrainXLConfigs, aux_loss_weights, check_splits_fit, check_training_configs, device_of
from .distributed import DistributedContext, check_divisible
from .interruption import StopSignals, TrainingInterrupted


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """fp16 and bf16 losses are averaged in float32; float64 stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


@torch.no_grad()
def mean_loss_over_stream(model, iterator, max_steps: int = 0, columns: Optional[slice] = None) -> float:
    r"""
    The mean loss per position over the segments of `iterator` (at most `max_steps` when positive), each segment
    continuing the memories of the one before, as the original evaluates: $\sum_s n_s \bar{\ell}_s / \sum_s n_s$
    for segments of $n_s$ positions and mean loss $\bar{\ell}_s$. `columns` restricts it to those batch columns.
    """
    total_loss, total_len, mems = 0.0, 0, []
    for i, (data, target, seq_len) in enumerate(iterator):
        if 0 < max_steps <= i:
            break
        if columns is not None:
            data, target = data[:, columns], target[:, columns]
        loss, *mems = model(data, target, *mems)
        total_loss += seq_len * loss.double().mean().item()
        total_len += seq_len
    return total_loss / max(total_len, 1)


class TrainingDiverged(ValueError):
    """
    Training stopped because its loss, gradient norm or weights stopped being finite at `step`. A `ValueError`: the
    settings' values (`lr`, `clip`, the schedule) made it diverge, and the scripts report it as `error: ...`.
    """

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def quality(loss: float, level: str) -> Dict[str, float]:
    """Bits per character for character and byte corpora, perplexity for word corpora."""
    if level == 'word':
        return {'ppl': math.exp(min(loss, 50.0))}
    return {'bpc': loss / math.log(2)}


class Trainer:
    """
    Trains `conf.model` on `conf.corpus` as the original `train.py` does, with exact resume.

    Args:
        conf: the run's configs (computed lazily: building the trainer builds the model and the optimizer).
        checkpoint_dir: where checkpoints go (the labml run's `checkpoints/` folder); `None` saves none.
        distributed: this process's rank in a `torchrun` launch (see `distributed.py`); `None` for one process.
    """

    def __init__(self, conf: TrainXLConfigs, checkpoint_dir: Optional[Path] = None,
                 distributed: Optional[DistributedContext] = None, device: Optional[torch.device] = None):
        check_training_configs(conf)
        self.conf = conf
        self.distributed = distributed
        self.device = device or device_of(conf)
        if conf.precision == 'fp16' and self.device.type != 'cuda':
            raise ValueError(f"precision='fp16' is not accepted on device {self.device}: fp16 training needs CUDA "
                             f"(its gradient scaler); use 'bf16' on the CPU")
        torch.manual_seed(conf.seed)
        random.seed(conf.seed)
        self.corpus = conf.corpus
        check_splits_fit(self.corpus, conf.batch_size)
        self.model = conf.model.to(self.device)
        # The module that computes the forward pass: the model itself, or its DistributedDataParallel wrapper
        self.forward_module = self.model
        if distributed is not None:
            check_divisible(conf.batch_size, distributed.world_size, conf.batch_chunk)
            if self.model.gradient_segments() > 1:
                raise ValueError(f"bptt_segments={self.model.gradient_segments()} is not accepted under torchrun: a "
                                 f"step of several segments runs several forward passes before one backward, which "
                                 f"this trainer has not proven under DistributedDataParallel; train in one process, "
                                 f"or with bptt_segments=1")
            self.forward_module = torch.nn.parallel.DistributedDataParallel(self.model)
        self.optimizer = conf.optimizer
        self.scheduler = conf.scheduler
        # The weight of each memory mechanism's auxiliary loss, by name
        self.aux_loss_weights = aux_loss_weights(conf)
        # `dev_perf` follows the validation loss; the others follow the step count
        self._steps_on_validation = isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.scaler = torch.amp.GradScaler('cuda', enabled=conf.precision == 'fp16')
        self.train_iter = self.corpus.get_iterator('train', conf.batch_size, conf.tgt_len, device=self.device,
                                                   ext_len=conf.ext_len, seed=conf.seed)
        self.checkpoint_dir = checkpoint_dir
        self.step = 0
        self.epoch = 0
        self.mems: Optional[List[torch.Tensor]] = None
        self.best_valid: Optional[float] = None
        self.last_valid: Optional[float] = None
        self._pass = None
        self._pass_ends = False
        # (step, training loss) of every step this trainer ran
        self.history: List[Tuple[int, float]] = []
        # The auxiliary losses of the last step by name (the compressed memory's 'reconstruction'), of the mechanisms
        # that are on
        self.aux_losses: Dict[str, float] = {}
        # The step of the last checkpoint `save` wrote, and its folder
        self._saved_step: Optional[int] = None
        self._saved_folder: Optional[Path] = None

    # ## Data

    def _new_pass(self):
        if self.conf.varlen and hasattr(self.train_iter, 'get_varlen_iter'):
            return self.train_iter.get_varlen_iter()
        return iter(self.train_iter)

    def _next_batch(self):
        """The next training segment; marks the end of a pass so memories reset after its step."""
        while True:
            if self._pass is None:
                self._pass = self._new_pass()
            try:
                batch = next(self._pass)
            except StopIteration:
                self._pass = None
                self._end_pass()
                continue
            # The ordered iterator goes back to row 0 after the last segment of a pass
            if getattr(self.train_iter, 'position', None) == 0:
                self._pass, self._pass_ends = None, True
            return batch

    def _next_window(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """The segments of the next step: `model.gradient_segments()` of them (one, unless a mechanism is trained
        through the recurrence), fewer where the pass ends first, as the memories start afresh after it."""
        segments = []
        while len(segments) < self.model.gradient_segments() and not self._pass_ends:
            data, target, _ = self._next_batch()
            segments.append((data, target))
        return segments

    def _end_pass(self):
        self.epoch += 1
        self.mems = None

    # ## Steps

    def _autocast_dtype(self) -> Optional[torch.dtype]:
        """The dtype the steps run in under autocast (`precision`), None for float32."""
        return {'float32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}[self.conf.precision]

    def _autocast(self):
        dtype = self._autocast_dtype()
        return contextlib.nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def train_step(self, data: torch.Tensor, target: torch.Tensor) -> float:
        """One optimizer step on a segment; returns its mean loss."""
        return self.train_window([(data, target)])

    def train_window(self, segments: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> float:
        """
        One optimizer step on consecutive segments `(data, target)` of the same columns; returns their mean loss.
        Within the window the states of mechanisms trained through the recurrence keep their graph
        (`carry_gradient`: the Recurrent Memory Transformer's memory tokens), so each segment's loss back-propagates
        into the segments before it in the window; the state after the last is detached. One segment is the usual
        step.
        """
        conf = self.conf
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.distributed is not None:
            # This rank's columns; DistributedDataParallel averages the gradients over the ranks
            columns = self.distributed.columns(segments[0][0].shape[1])
            segments = [(data[:, columns], target[:, columns]) for data, target in segments]
        chunks = conf.batch_chunk
        size = segments[0][0].shape[1] // chunks
        # Each segment's mean loss counts `1 / (chunks * len(segments))` of the step's
        parts = chunks * len(segments)
        # The model also returns the auxiliary losses of its mechanisms (the compressed memory's reconstruction loss),
        # each trained with its weight and tracked apart
        weights = self.aux_loss_weights
        total, aux_totals, new_mems = 0.0, {}, []
        for i in range(chunks):
            columns = slice(i * size, (i + 1) * size)
            chunk_mems = [] if self.mems is None else [m[:, columns] for m in self.mems]
            # Gradients are averaged over the ranks once, after the last chunk
            last = i == chunks - 1
            sync = contextlib.nullcontext() if last or self.distributed is None else self.forward_module.no_sync()
            with sync:
                objective = 0.0
                for j, (data, target) in enumerate(segments):
                    with self._autocast():
                        loss, aux, *chunk_mems = self.forward_module(
                            data[:, columns], target[:, columns], *chunk_mems, return_aux_losses=True,
                            carry_gradient=j < len(segments) - 1)
                    # Mean over positions and this chunk's columns, in at least float32; divided by `parts` so the
                    # sum is the window's mean
                    loss = _at_least_float32(loss).mean() / parts
                    objective = objective + loss
                    for name, value in aux.items():
                        value = _at_least_float32(value) / parts
                        objective = objective + weights[name] * value
                        aux_totals[name] = aux_totals.get(name, 0.0) + value.item()
                    total += loss.item()
                self.scaler.scale(objective).backward()
            new_mems.append(chunk_mems)
        self.mems = [torch.cat(layer, dim=1) for layer in zip(*new_mems)] if new_mems[0] else None
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), conf.clip)
        self.grad_norm = grad_norm.item()
        if self.distributed is not None:
            # Before the optimizer step, so every rank judges the same loss (the gradient norm is the same already)
            total, *sums = (s / self.distributed.world_size for s in self.distributed.sum(total, *aux_totals.values()))
            aux_totals = dict(zip(aux_totals, sums))
        self.aux_losses = aux_totals
        self._check_finite_step(total)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if not self._steps_on_validation:
            self.scheduler.step()
        return total

    def _check_finite_step(self, loss: float) -> None:
        """A `TrainingDiverged` naming this step where its loss or gradient norm is not finite, before the optimizer
        step, so the weights stay finite. Under fp16 an infinite or NaN gradient is the gradient scaler's overflow,
        whose step it skips: only the loss counts there."""
        gradient_counts = not self.scaler.is_enabled()
        if math.isfinite(loss) and (math.isfinite(self.grad_norm) or not gradient_counts):
            return
        step = self.step + 1
        lr = self.optimizer.param_groups[0]['lr']
        if not math.isfinite(loss):
            what = f"the loss is {loss} (gradient norm {self.grad_norm}, learning rate {lr})"
        else:
            what = f"the gradient norm is {self.grad_norm} (loss {loss}, learning rate {lr})"
        raise TrainingDiverged(f"training diverged at step {step}: {what}; the step was not taken and nothing was "
                               f"saved after it; {self._newest_checkpoint()}. A lower lr, a smaller clip or a "
                               f"longer warm-up usually keeps a run from diverging", step)

    def _newest_checkpoint(self) -> str:
        """The newest checkpoint on disk, as words for a message."""
        steps = checkpoint_steps(self.checkpoint_dir) if self.checkpoint_dir is not None else []
        if not steps:
            return 'no checkpoint was written before it'
        return f"the newest checkpoint, of step {steps[-1]} ({self.checkpoint_dir / str(steps[-1])}), is kept"

    @torch.no_grad()
    def evaluate(self, split: str = 'valid', max_steps: Optional[int] = None,
                 lengths: Optional[Tuple[int, int, int]] = None) -> float:
        """Mean loss per token over `split`, with segments of `eval_tgt_len` as the original evaluates; or with the
        segment, extended-context and memory lengths `lengths = (tgt_len, ext_len, mem_len)` (longer ones than in
        training, say)."""
        conf = self.conf
        max_steps = conf.max_eval_steps if max_steps is None else max_steps
        model = self.model
        model.eval()
        if lengths is not None:
            model.reset_length(*lengths)
        # Keep the context of each position as in training: a longer memory, or a longer extended context
        elif conf.mem_len == 0:
            model.reset_length(conf.eval_tgt_len, conf.ext_len + conf.tgt_len - conf.eval_tgt_len, conf.mem_len)
        else:
            model.reset_length(conf.eval_tgt_len, conf.ext_len, conf.mem_len + conf.tgt_len - conf.eval_tgt_len)
        iterator = self.corpus.get_iterator(split, conf.batch_size, model.tgt_len, device=self.device,
                                            ext_len=model.ext_len)
        columns = None if self.distributed is None else self.distributed.columns(conf.batch_size)
        with self._autocast():
            loss = mean_loss_over_stream(model, iterator, max_steps, columns)
        model.reset_length(conf.tgt_len, conf.ext_len, conf.mem_len)
        if self.distributed is not None:
            # Every rank scored as many positions, so the mean over ranks is the mean over the whole batch
            loss = self.distributed.sum(loss)[0] / self.distributed.world_size
        return loss

    # ## State for exact resume

    def state_dict(self) -> Dict[str, Any]:
        return {
            'step': self.step, 'epoch': self.epoch, 'best_valid': self.best_valid,
            'model': self.model.state_dict(), 'optimizer': self.optimizer.state_dict(),
            'scheduler': self.scheduler.state_dict(), 'scaler': self.scaler.state_dict(),
            'train_iterator': self.train_iter.state_dict(),
            'mems': None if self.mems is None else [m.cpu() for m in self._all_columns(self.mems)],
            'rng': {'torch': torch.get_rng_state(), 'python': random.getstate(),
                    'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        }

    def load_state_dict(self, state: Dict[str, Any], source: str) -> None:
        """Continue from `state`, read from the checkpoint `source`; a `CheckpointError` naming it where its state
        is not finite (training from it would only give `loss nan`) or does not fit the model, before anything is
        changed."""
        check_finite_state(state, source)
        check_model_state(self.model, state['model'], source)
        self._check_resumed_memories(state['mems'], source)
        self.model.load_state_dict(state['model'])
        self.optimizer.load_state_dict(state['optimizer'])
        self.scheduler.load_state_dict(state['scheduler'])
        self.scaler.load_state_dict(state['scaler'])
        self.train_iter.load_state_dict(state['train_iterator'])
        mems = state['mems']
        if mems is not None and self.distributed is not None:
            columns = self.distributed.columns(mems[0].shape[1])
            mems = [m[:, columns] for m in mems]
        self.mems = None if mems is None else [m.to(self.device) for m in mems]
        self.step, self.epoch, self.best_valid = state['step'], state['epoch'], state['best_valid']
        torch.set_rng_state(state['rng']['torch'])
        random.setstate(state['rng']['python'])
        if state['rng']['cuda'] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['rng']['cuda'])

    def _check_resumed_memories(self, mems: Optional[List[torch.Tensor]], source: str) -> None:
        """A `CheckpointError` naming the checkpoint `source` where its memories (every column's) are not the states
        this model keeps with the settings it has now, as its first step would find them. Settings given with
        `resume=` can change that layout without changing a weight (`mem_len=0`, `cmem_len` with
        `compression=max_pool`, `precision`), so the check on the weights' shapes does not see it; the run would fail
        at its first step after recording the settings, and every later resume the same way."""
        if mems is None:  # a new stream: the memories start empty, whatever the model keeps
            return
        try:
            self.model.check_mems([m.to(self.device) for m in mems], self.conf.batch_size, self._autocast_dtype())
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint {source} holds memories this model cannot continue from: {error}. "
                                  f"The settings given with resume= change what the model keeps between segments "
                                  f"(mem_len=0 or not, cmem_len, compression, a memory mechanism, precision): "
                                  f"resume with the run's own, or start a new run with them") from error

    def _all_columns(self, mems: List[torch.Tensor]) -> List[torch.Tensor]:
        """The memories of every column of the batch (gathered from the ranks when distributed)."""
        return mems if self.distributed is None else self.distributed.gather_columns(mems)

    def save(self) -> Optional[Path]:
        """Write a checkpoint of this step (once: a second call at the same step writes nothing); every rank takes
        part (the memories are gathered), rank 0 writes. Returns its folder (None where none is written).

        A state that is not finite is never written (it would replace the last good checkpoints under the keep-two
        policy): that is a `TrainingDiverged` naming what is not finite and the newest checkpoint, which is kept."""
        if self._saved_step == self.step:
            return self._saved_folder
        state = self.state_dict()
        found = non_finite_values(state)
        if found:
            more = f" and {len(found) - 3} more" if len(found) > 3 else ''
            verb = 'is' if len(found) == 1 else 'are'
            raise TrainingDiverged(f"training diverged by step {self.step}: {', '.join(found[:3])}{more} {verb} not "
                                   f"finite; its checkpoint was not written; {self._newest_checkpoint()}. A lower "
                                   f"lr, a smaller clip or a longer warm-up usually keeps a run from diverging",
                                   self.step)
        folder = None
        if self.checkpoint_dir is not None and (self.distributed is None or self.distributed.is_main):
            folder = save_checkpoint(self.checkpoint_dir, self.step, state)
        self._saved_step, self._saved_folder = self.step, folder
        return folder

    # ## The loop

    def _track_validation(self):
        valid = self.evaluate('valid')
        if self._steps_on_validation:
            self.scheduler.step(valid)
        self.best_valid = valid if self.best_valid is None else min(self.best_valid, valid)
        self.last_valid = valid
        tracker.save({'loss.valid': valid, **{f'{k}.valid': v for k, v in quality(valid, self.corpus.level).items()}})
        return valid

    def _stop_signal(self, signals: StopSignals) -> int:
        """The signal that asks this run to stop after this step (0: none); under `torchrun` the ranks agree, so
        all stop at the same step even when only one of them got the signal."""
        received = signals.received or 0
        return received if self.distributed is None else self.distributed.max(received)

    def run(self) -> Optional[float]:
        """
        Train from `self.step` to `max_step` (or `time_limit`); returns the last validation loss. On SIGINT or
        SIGTERM it finishes the step, saves its checkpoint and raises `TrainingInterrupted` (`interruption.py`).
        """
        conf = self.conf
        if self.device.type == 'cpu':
            # Our C++ kernels (attention, dropout, layer norm) are compiled now (once per machine), not inside the
            # time limit
            native.prepare_kernels()
        started = time.time()
        valid = None
        with StopSignals() as signals:
            for step in monit.loop(range(self.step, conf.max_step)):
                step_started = time.time()
                segments = self._next_window()
                loss = self.train_window(segments)
                if self._pass_ends:
                    self._pass_ends = False
                    self._end_pass()
                self.step = step + 1
                self.history.append((self.step, loss))
                tracker.save({'loss.train': loss,
                              **{f'{k}.train': v for k, v in quality(loss, self.corpus.level).items()},
                              'lr': self.optimizer.param_groups[0]['lr'], 'grad_norm': self.grad_norm,
                              'tokens_per_sec': sum(target.numel() for _, target in segments)
                                                / max(time.time() - step_started, 1e-9),
                              **{f'{series}.train': self.aux_losses[name]
                                 for name, series in self.model.aux_loss_series().items() if name in self.aux_losses}})
                out_of_time = 0 < conf.time_limit <= time.time() - started
                if self.step % conf.eval_interval == 0 or self.step == conf.max_step or out_of_time:
                    valid = self._track_validation()
                stop = self._stop_signal(signals)
                if (conf.checkpoint_interval > 0 and self.step % conf.checkpoint_interval == 0) \
                        or self.step == conf.max_step or out_of_time or stop:
                    self.save()
                if stop:
                    raise TrainingInterrupted(stop, self.step, self._saved_folder)
                if out_of_time:
                    break
        return valid
