"""
# Checkpoints

A checkpoint holds everything a run needs to continue as if it had never stopped: model, optimizer, schedule,
data position, memories and random-number-generator states. It is a folder `checkpoints/<step>/` in the labml run:

| file | holds |
| --- | --- |
| `tensors.safetensors` | every tensor of the state |
| `state.json` | the rest, with references to the tensors (`state_files.py`) |
| `SHA256SUMS` | the SHA-256 of the two files above (`sha256sum -c SHA256SUMS` checks them by hand) |

Neither data file can execute code when loaded. A checkpoint is written into a folder of its own beside the others
and renamed to `<step>` once complete and flushed to disk, so a run killed mid-write leaves the previous
checkpoints intact (and the unfinished folder is removed by the next save). Loading verifies every checksum:
damage anywhere in a file, not only a truncation, is found. The newest checkpoint that verifies is used; each one
that does not (a file damaged, `SHA256SUMS` missing or unreadable) is reported by name, and the one before it
tried. A save never removes a folder that does not verify: its files may be intact, so it is renamed
`<step>.unverified` (with a warning) for a person to look at.

A training state that is not finite is refused by `check_finite_state` (the trainer calls it on resume, and
checks the same before every save): weights, optimizer state, the schedule's learning rate or the memories holding
NaN or infinity would give `loss nan` from the first step on.

Checkpoints written before this format (`<step>/checkpoint.pt`, a `torch.save` file, with no checksum) are still
read, with `torch.load(weights_only=True)`, which loads tensors and plain data only.
"""
import errno
import hashlib
import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import safetensors.torch
import torch

from .state_files import join_state, split_state

TENSORS_FILE = 'tensors.safetensors'
STATE_FILE = 'state.json'
CHECKSUMS_FILE = 'SHA256SUMS'
# The single file of the earlier format
LEGACY_FILE = 'checkpoint.pt'
# Prefix of a checkpoint folder being written
PARTIAL_PREFIX = '.partial-'


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read, or that does not fit the model."""


# Suffix of a checkpoint folder that did not verify, set aside by a save of its step
UNVERIFIED_SUFFIX = '.unverified'


def _is_complete(folder: Path) -> bool:
    return (folder / CHECKSUMS_FILE).is_file() or (folder / LEGACY_FILE).is_file()


def _step_folders(directory: Path) -> List[int]:
    """Steps with a folder in `directory`, complete or not, oldest first. A folder only becomes `<step>` once it is
    complete (see the module's docstring), so one without `SHA256SUMS` lost it afterwards: it is damaged."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def checkpoint_steps(directory: Path) -> List[int]:
    """Steps that have a complete checkpoint in `directory`, oldest first."""
    return [step for step in _step_folders(directory) if _is_complete(directory / str(step))]


def _write(path: Path, data: bytes) -> None:
    with open(path, 'wb') as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(directory: Path, step: int, state: Dict[str, Any], keep: Optional[int] = 2) -> Path:
    """
    Write `state` as the checkpoint of `step` (atomically, see the module's docstring) and keep only the newest
    `keep` checkpoints (every one with `keep=None`); returns its folder. A failed write (a full disk, say) removes
    what it wrote and raises a `CheckpointError` naming the step, the reason and the newest checkpoint left
    intact.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for unfinished in directory.glob(PARTIAL_PREFIX + '*'):
        shutil.rmtree(unfinished, ignore_errors=True)
    partial = directory / f'{PARTIAL_PREFIX}{step}-{os.getpid()}'
    target = directory / str(step)
    try:
        partial.mkdir()
        encoded, tensors = split_state(state)
        files = {TENSORS_FILE: safetensors.torch.save(tensors),
                 STATE_FILE: json.dumps({'format': 1, 'step': step, 'state': encoded}).encode()}
        for name, data in files.items():
            _write(partial / name, data)
        sums = ''.join(f'{hashlib.sha256(data).hexdigest()}  {name}\n' for name, data in files.items())
        _write(partial / CHECKSUMS_FILE, sums.encode())
        if target.exists():
            _set_aside_or_remove(target)
        os.replace(partial, target)
        _fsync_directory(directory)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        full = ' (the disk is full: free space, then resume the run)' if error.errno == errno.ENOSPC else ''
        raise CheckpointError(f"could not write the checkpoint of step {step} in {directory}: {error}{full}; "
                              f"{newest_intact(directory)}") from error
    if keep is not None:
        for old in checkpoint_steps(directory)[:-keep]:
            shutil.rmtree(directory / str(old))
    return target


def newest_intact(directory: Path) -> str:
    """Which checkpoint of `directory` a resume starts from, for a message: `the checkpoint of step 40 is intact
    (DIR/40)`, or that there is none."""
    intact = checkpoint_steps(directory)
    return (f'the checkpoint of step {intact[-1]} is intact ({directory / str(intact[-1])})' if intact else
            f'no checkpoint exists yet in {directory}')


class RunFileSystemError(OSError):
    """What the system refused a training (a full disk while its `log.jsonl` is written, say), naming the file,
    the checkpoint a resume starts from and the command that resumes."""

    def __init__(self, error: OSError, checkpoint_dir: Path, resume_command: str):
        super().__init__(error.errno, f"{error.filename or 'a file of the run'}: {error.strerror or error}; "
                                      f"{newest_intact(checkpoint_dir)}: once the cause is mended (for a full disk, "
                                      f"space freed), resume with: {resume_command}")

    def __str__(self):
        return self.strerror


def _set_aside_or_remove(folder: Path) -> None:
    """
    Make way for a new checkpoint in `folder`: an older one that verifies is removed (a checkpoint of the same step
    saved again); one that does not verify is renamed `<step>.unverified` (`-2`, `-3`, ... where taken) with a
    warning, as its files may be intact (only `SHA256SUMS` lost, say) and a person should decide.
    """
    try:
        read_checkpoint(folder)
    except CheckpointError as error:
        aside = folder.with_name(folder.name + UNVERIFIED_SUFFIX)
        n = 1
        while aside.exists():
            n += 1
            aside = folder.with_name(f'{folder.name}{UNVERIFIED_SUFFIX}-{n}')
        os.replace(folder, aside)
        warnings.warn(f"{error}; it is kept as {aside} instead of being overwritten by the new checkpoint of the same "
                      f"step: check its files (or delete the folder) by hand", RuntimeWarning)
        return
    shutil.rmtree(folder)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (a no-op where folders cannot be opened, as on Windows)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _verified_files(folder: Path) -> Dict[str, bytes]:
    """The bytes of every file `SHA256SUMS` lists, each checked against its checksum."""
    listed = {}
    for line in (folder / CHECKSUMS_FILE).read_text().splitlines():
        digest, _, name = line.partition('  ')
        listed[name] = digest
    if set(listed) != {TENSORS_FILE, STATE_FILE}:
        raise CheckpointError(f"checkpoint {folder}: {CHECKSUMS_FILE} lists {sorted(listed)}, expected "
                              f"{TENSORS_FILE} and {STATE_FILE}; it is corrupt")
    files = {}
    for name, digest in listed.items():
        data = (folder / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise CheckpointError(f"checkpoint {folder / name} does not match its checksum in {CHECKSUMS_FILE}: "
                                  f"the file is corrupt")
        files[name] = data
    return files


def read_checkpoint(folder: Path) -> Dict[str, Any]:
    """The state in the checkpoint `folder`, or a `CheckpointError` naming the file when it cannot be read or is
    damaged."""
    try:
        if not (folder / CHECKSUMS_FILE).exists():
            if (folder / LEGACY_FILE).is_file():
                return torch.load(folder / LEGACY_FILE, map_location='cpu', weights_only=True)
            raise CheckpointError(f"checkpoint {folder} has no {CHECKSUMS_FILE}, so its files cannot be verified: "
                                  f"it is damaged (a complete checkpoint always has one)")
        files = _verified_files(folder)
        tensors = safetensors.torch.load(files[TENSORS_FILE])
        return join_state(json.loads(files[STATE_FILE])['state'], tensors)
    except CheckpointError:
        raise
    except Exception as error:  # a missing or truncated file, unparsable data: all mean an unreadable checkpoint
        raise CheckpointError(f"checkpoint {folder} cannot be read ({type(error).__name__}: {error}); it is "
                              f"truncated or corrupt") from error


def load_latest_checkpoint(directory: Path) -> Optional[Tuple[int, Dict[str, Any]]]:
    """
    `(step, state)` of the newest readable checkpoint in `directory`, or `None` when there is none.
    Unreadable or damaged checkpoints (a folder without `SHA256SUMS` too) are reported by a warning that names the
    file, and skipped.
    """
    steps = _step_folders(directory)
    for step in reversed(steps):
        try:
            return step, read_checkpoint(directory / str(step))
        except CheckpointError as error:
            warnings.warn(f"{error}; falling back to the previous checkpoint", RuntimeWarning)
    if steps:
        raise CheckpointError(f"no readable checkpoint in {directory}: every one of steps {steps} is corrupt")
    return None


def _first_non_finite(value: Any) -> Optional[str]:
    """The first value of `value` (a tensor, a number, or a list or tuple of them) that is NaN or infinite, as text;
    `None` where all are finite (or it holds no numbers)."""
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() or value.is_complex()):
            return None
        bad = value.detach()[~torch.isfinite(value.detach())]
        return str(bad.flatten()[0].item()) if bad.numel() else None
    if isinstance(value, float):
        return None if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)) and any(_first_non_finite(v) is not None for v in value):
        return '[' + ', '.join(str(v) for v in value[:4]) + (', ...' if len(value) > 4 else '') + ']'
    return None


def non_finite_values(state: Dict[str, Any]) -> List[str]:
    """
    What in a trainer's `state` (`Trainer.state_dict`) is NaN or infinite, each as `the <what> (<value>)`: the
    model's weights, the optimizer's state and settings (its learning rate), the schedule's learning rates and the
    memories. From any of them, training gives `loss nan` from its first step. Values that may be infinite are not
    looked at: `ReduceLROnPlateau`'s `best` starts at infinity, the best validation loss is a record.
    """
    found = []

    def look(what: str, value: Any) -> None:
        first = _first_non_finite(value)
        if first is not None:
            found.append(f"{what} ({first})")

    for name, tensor in (state.get('model') or {}).items():
        look(f"the model's weight {name}", tensor)
    optimizer = state.get('optimizer') or {}
    for index, group in enumerate(optimizer.get('param_groups', [])):
        for key, value in group.items():
            what = "the learning rate (lr)" if key == 'lr' else f"the {key}"
            look(f"{what} of the optimizer's param group {index}", value)
    for parameter, parameter_state in (optimizer.get('state') or {}).items():
        for key, value in parameter_state.items():
            look(f"the optimizer's {key} of parameter {parameter}", value)
    for key, value in (state.get('scheduler') or {}).items():
        if 'lr' in key:
            look(f"the schedule's {key}", value)
    for index, memory in enumerate(state.get('mems') or []):
        # (the n_layer + 1 memories, then the compressed memories where the model has them)
        look(f"the memories' mems[{index}]", memory)
    return found


def check_finite_state(state: Dict[str, Any], source: str) -> None:
    """A `CheckpointError` naming the checkpoint `source` and what in its `state` is not finite (see
    `non_finite_values`), where anything is; a resume from it would only give `loss nan`."""
    found = non_finite_values(state)
    if found:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ''
        raise CheckpointError(f"checkpoint {source} holds values that are not finite: {', '.join(found[:3])}{more}; "
                              f"training from it would give loss nan. The run diverged before it was saved: move "
                              f"this folder out of {Path(source).parent} to resume from the checkpoint before it")


def load_model_state(model: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    """`model.load_state_dict(state)` with an error that names the checkpoint and the first mismatched tensor."""
    check_model_state(model, state, source)
    model.load_state_dict(state)


def check_model_state(model: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    """A `CheckpointError` naming the checkpoint `source` and the first tensor of `state` that `model` has not, lacks
    or has of another shape, where there is one."""
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
