r"""
# The on-disk cache of compiled kernels: one build per machine, never a hang

A kernel is compiled once per machine and kind of build, whichever checkout or environment asks for it:

* **Keyed by what was compiled.** A build's module name is `labml_txl_{kernel}_{key}`, where the key hashes the
  source's bytes and those of the files beside it that it includes (`#include "other.cpp"`), the compiler and
  linker flags (the defines of a variant among them), the CPU's kind and feature flags and the versions of
  PyTorch and Python. Two checkouts with the same source share one build, wherever they lie and whatever their
  files' times; a changed source or flag gets a build of its own, and a cache shared by different machines holds
  one build per kind of CPU rather than one that crashes on the others.
* **Complete or absent.** A build runs in a folder of its own process (`{module}.build-{pid}`), on a copy of the
  files that were hashed, and only its finished library is moved into `{module}/{module}.so`, by an atomic rename.
  A later process that finds that file imports it at once: no compiler, no ninja, no lock.
* **Locks that die with their process.** While it builds, a process holds the lock `{module}.lock`
  (`labml_txl.file_lock`: an `flock`, released by the operating system when the process ends in any way), so no
  lock outlives its builder. Whoever takes the lock next removes the unfinished build folders it finds (their
  builders are gone) and builds again. A process that finds the lock held says which process it waits for, and
  says so again every minute. The lock only saves duplicated work (where it
  guards nothing, off POSIX, two builds at once each write their own folder, and the second rename replaces the
  first's identical file).

The cache's folder is `TORCH_EXTENSIONS_DIR` where it is set, else PyTorch's (`~/.cache/torch_extensions`).
"""
import contextlib
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, Iterator, Sequence

import torch

from ...file_lock import FileLock

# Seconds between two "still waiting" lines of a process waiting for another's build
WAIT_REPORT_INTERVAL = 60.0


def cache_root() -> Path:
    """The folder that holds every build: `TORCH_EXTENSIONS_DIR`, else PyTorch's default."""
    from torch.utils import cpp_extension
    return Path(os.environ.get('TORCH_EXTENSIONS_DIR') or cpp_extension.get_default_build_root())


def machine_description() -> str:
    """What a build is good for beyond its source and flags: the CPU's kind and feature flags (Linux's
    `/proc/cpuinfo`; elsewhere the platform), PyTorch's version and Python's."""
    try:
        lines = Path('/proc/cpuinfo').read_text().splitlines()
        described = '\n'.join(sorted({line for line in lines if line.startswith(('flags', 'model name'))}))
    except OSError:
        described = platform.platform() + platform.processor()
    return described + f'\ntorch {torch.__version__}\npython {sys.version}'


def module_name(kernel: str, source: bytes, cflags: Sequence[str], ldflags: Sequence[str]) -> str:
    """`labml_txl_{kernel}_{key}`, the key a hash of everything the build depends on (the module docstring)."""
    described = '\0'.join([machine_description(), ' '.join(cflags), ' '.join(ldflags)]).encode() + b'\0' + source
    return f'labml_txl_{kernel}_{hashlib.sha256(described).hexdigest()[:16]}'


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"/]+)"', re.MULTILINE)


def source_files(source: Path) -> Dict[str, bytes]:
    """`source` and the files beside it that it includes (`#include "name"`, and what they include in turn), by name,
    `source` first: what a build compiles."""
    files: Dict[str, bytes] = {}
    pending = [source.name]
    while pending:
        name = pending.pop(0)
        if name not in files:
            files[name] = (source.parent / name).read_bytes()
            pending += [included.decode() for included in _LOCAL_INCLUDE.findall(files[name])]
    return files


def cached_or_built(kernel: str, source: Path, cflags: Sequence[str], ldflags: Sequence[str],
                    compile_in: Callable[[str, Path, Path], ModuleType]) -> ModuleType:
    """
    The module of `source` compiled with `cflags` and `ldflags`: imported from the cache when it holds the build,
    else compiled by `compile_in(name, source_copy, build_folder)` (which returns the imported module and leaves
    `{name}.so` in `build_folder`) and added to the cache. Raises what `compile_in` raises.
    """
    files = source_files(source)
    # (the source's bytes, then each included file's name and bytes: a kernel without includes hashes its bytes)
    code = b''.join([files[source.name]] + [b'\0' + name.encode() + b'\0' + data
                                             for name, data in files.items() if name != source.name])
    name = module_name(kernel, code, cflags, ldflags)
    root = cache_root()
    library = root / name / f'{name}.so'
    if library.is_file():
        return _import(name, library)
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f'{name}.lock', kernel):
        if library.is_file():  # built by the process we waited for
            return _import(name, library)
        _remove_unfinished_builds(root, name)
        folder = root / f'{name}.build-{os.getpid()}'
        folder.mkdir()
        for file_name, data in files.items():
            (folder / file_name).write_bytes(data)
        copy = folder / source.name
        print(f'labml_txl: compiling the {kernel} kernel for this machine (once, about half a minute)',
              file=sys.stderr, flush=True)
        try:
            module = compile_in(name, copy, folder)
            library.parent.mkdir(exist_ok=True)
            os.replace(folder / f'{name}.so', library)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return module


def _import(name: str, library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _remove_unfinished_builds(root: Path, name: str) -> None:
    """Build folders left by processes that ended before finishing (the caller holds the lock, so no build of
    `name` is running)."""
    for folder in root.glob(f'{name}.build-*'):
        print(f'labml_txl: removing {folder.name}, an unfinished build of a process that is gone',
              file=sys.stderr, flush=True)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _build_lock(path: Path, kernel: str) -> Iterator[None]:
    """Holds the lock `path` for the block; waits for it with a line on stderr when another process holds it, and
    says so again every `WAIT_REPORT_INTERVAL` seconds."""
    with FileLock(path) as lock:
        if not lock.acquire():
            holder = lock.holder() or 'unknown'
            started = reported = time.monotonic()
            print(f'labml_txl: waiting for process {holder}, which is compiling the {kernel} kernel (lock {path}; '
                  f'it is released when that process ends)', file=sys.stderr, flush=True)
            while not lock.acquire():
                time.sleep(0.2)
                if time.monotonic() - reported >= WAIT_REPORT_INTERVAL:
                    reported = time.monotonic()
                    print(f'labml_txl: still waiting for process {holder} to finish compiling the {kernel} '
                          f'kernel ({reported - started:.0f} s)', file=sys.stderr, flush=True)
        yield
