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
that does not is reported by name, and the one before it tried.

Checkpoints written before this format (`<step>/checkpoint.pt`, a `torch.save` file, with no checksum) are still
read, with `torch.load(weights_only=True)`, which loads tensors and plain data only.
"""
import errno
import hashlib
import json
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


def _is_complete(folder: Path) -> bool:
    return (folder / CHECKSUMS_FILE).is_file() or (folder / LEGACY_FILE).is_file()


def checkpoint_steps(directory: Path) -> List[int]:
    """Steps that have a complete checkpoint in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and _is_complete(p))


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
            shutil.rmtree(target)
        os.replace(partial, target)
        _fsync_directory(directory)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        intact = checkpoint_steps(directory)
        left = f'the checkpoint of step {intact[-1]} is intact' if intact else 'no earlier checkpoint exists'
        full = ' (the disk is full: free space, then resume the run)' if error.errno == errno.ENOSPC else ''
        raise CheckpointError(f"could not write the checkpoint of step {step} in {directory}: {error}{full}; "
                              f"{left}") from error
    if keep is not None:
        for old in checkpoint_steps(directory)[:-keep]:
            shutil.rmtree(directory / str(old))
    return target


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
        if not (folder / CHECKSUMS_FILE).is_file() and (folder / LEGACY_FILE).is_file():
            return torch.load(folder / LEGACY_FILE, map_location='cpu', weights_only=True)
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
    Unreadable or damaged checkpoints are reported by a warning that names the file, and skipped.
    """
    steps = checkpoint_steps(directory)
    for step in reversed(steps):
        try:
            return step, read_checkpoint(directory / str(step))
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
