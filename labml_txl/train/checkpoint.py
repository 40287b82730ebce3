"""
# Checkpoints

A checkpoint is one file holding everything a run needs to continue as if it had never stopped: model,
optimizer, schedule, data position, memories and random-number-generator states. Files are written atomically
(to a temporary file, flushed to disk, then renamed over the target), so a run killed mid-write leaves the
previous checkpoint intact. Loading takes the newest checkpoint that reads back; one that is truncated or corrupt
is reported by name and the one before it is used.

The files sit in the labml run's `checkpoints/` folder: `checkpoints/<step>/checkpoint.pt`.
"""
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

FILE_NAME = 'checkpoint.pt'


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read, or that does not fit the model."""


def checkpoint_steps(directory: Path) -> List[int]:
    """Steps that have a checkpoint file in `directory`, oldest first."""
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and (p / FILE_NAME).exists())


def save_checkpoint(directory: Path, step: int, state: Dict[str, Any], keep: int = 2) -> Path:
    """Write `state` as the checkpoint of `step` atomically, and keep only the newest `keep` checkpoints."""
    target = directory / str(step) / FILE_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(FILE_NAME + '.tmp')
    with open(temporary, 'wb') as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, target)
    for old in checkpoint_steps(directory)[:-keep]:
        (directory / str(old) / FILE_NAME).unlink()
        (directory / str(old)).rmdir()
    return target


def read_checkpoint(path: Path) -> Dict[str, Any]:
    """The state in `path`, or a `CheckpointError` naming the file when it cannot be read."""
    try:
        return torch.load(path, map_location='cpu', weights_only=False)
    except Exception as error:  # truncated zip, pickling errors, ...: all mean an unreadable file
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); "
                              f"it is truncated or corrupt") from error


def load_latest_checkpoint(directory: Path) -> Optional[Tuple[int, Dict[str, Any]]]:
    """
    `(step, state)` of the newest readable checkpoint in `directory`, or `None` when there is none.
    Unreadable checkpoints are reported by a warning that names the file, and skipped.
    """
    steps = checkpoint_steps(directory)
    for step in reversed(steps):
        try:
            return step, read_checkpoint(directory / str(step) / FILE_NAME)
        except CheckpointError as error:
            warnings.warn(f"{error}; falling back to the previous checkpoint", RuntimeWarning)
    if steps:
        raise CheckpointError(f"no readable checkpoint in {directory}: every one of steps {steps} is corrupt")
    return None


def load_model_state(model: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    """`model.load_state_dict(state)` with an error that names the checkpoint and the first mismatched tensor."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in own
                  if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        details = []
        if mismatched:
            k, theirs, ours = mismatched[0]
            details.append(f"{k} has shape {list(theirs)} in the checkpoint but {list(ours)} in the model"
                           + (f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ''))
        if missing:
            details.append(f"missing from the checkpoint: {missing[:3]}")
        if unexpected:
            details.append(f"not in the model: {unexpected[:3]}")
        raise CheckpointError(f"checkpoint {source} is from a model of another shape: " + '; '.join(details))
    model.load_state_dict(state)
