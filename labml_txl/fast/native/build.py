r"""
# Kernels of our own, compiled on first use

A kernel here is one C++ file beside this module (which may include others beside it: `decoder_layer.cpp` calls
the kernels it includes), compiled by `torch.utils.cpp_extension.load` the first time it is needed (about half a
minute) for the machine it runs on (`-march=native`; `LABML_TXL_NATIVE_ARCH=x86-64-v3` builds for another target,
as the suite's AVX2 pass does on an AVX-512 machine), and kept in a cache on disk (`kernel_cache.py`: keyed by the
sources, the flags, the CPU and the versions of PyTorch and Python; never left half-built or locked by a process
that died), so later processes, from any checkout, only load it.

Building needs a C++ compiler with OpenMP (`g++`) and `ninja` (a dependency of this package; its binary is found
even where the environment's `bin` is not on `PATH`). Where either is missing or the build fails, `load_kernel`
warns once, saying why, and returns None; each kernel's wrapper also checks its first result against PyTorch.
Either way the callers then run the PyTorch path they had before: slower, the same numbers.
`LABML_TXL_NATIVE=0` skips building altogether.
"""
import contextlib
import os
import re
import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, Optional, Tuple

import torch

from . import kernel_cache

# The environment variable that turns the kernels off, and the value that does it
DISABLE_VARIABLE = 'LABML_TXL_NATIVE'
# The environment variable that names the instruction set the kernels are compiled for (`-march=`), and its default
ARCH_VARIABLE, DEFAULT_ARCH = 'LABML_TXL_NATIVE_ARCH', 'native'

# Each kernel's module (or None where it could not be built), by name and defines, once tried
_loaded: Dict[Tuple[str, ...], Optional[ModuleType]] = {}
# Each kernel's module once it passed its first check (or None), by name
_checked: Dict[str, Optional[ModuleType]] = {}


# How many `disabled()` blocks are open
_disabled_blocks = 0


def _environment_allows() -> bool:
    return os.environ.get(DISABLE_VARIABLE, '1').strip() != '0'


def native_kernels_enabled() -> bool:
    """False when `LABML_TXL_NATIVE=0` asks for PyTorch's paths only, or inside `disabled()`."""
    return _disabled_blocks == 0 and _environment_allows()


@contextlib.contextmanager
def disabled():
    """Within the block every caller runs its PyTorch path, as with `LABML_TXL_NATIVE=0` (to compare the two in
    one process; built kernels stay loaded)."""
    global _disabled_blocks
    _disabled_blocks += 1
    try:
        yield
    finally:
        _disabled_blocks -= 1


def _ensure_ninja_on_path() -> None:
    """`cpp_extension` runs `ninja` from `PATH`; the `ninja` package's binary may sit outside it (a virtual
    environment used without activating it)."""
    if shutil.which('ninja') is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ['PATH'] = ninja.BIN_DIR + os.pathsep + os.environ.get('PATH', '')


def first_result_matches(what: str, run: Callable[[], torch.Tensor], expected: Callable[[], torch.Tensor]) -> bool:
    """A kernel's first check: whether `run()` (the kernel on a small input) gives `expected()` (PyTorch's result)
    to float rounding; warns, naming the kernel (`what`), when it fails or differs."""
    try:
        out = run()
    except RuntimeError as error:
        warnings.warn(f"labml_txl's {what} kernel failed its first check ({error}); the PyTorch path runs instead",
                      RuntimeWarning)
        return False
    if not torch.allclose(out, expected(), rtol=1e-4, atol=1e-5):
        warnings.warn(f"labml_txl's {what} kernel gave other results than PyTorch in its first check; the PyTorch "
                      f"path runs instead", RuntimeWarning)
        return False
    return True


def checked_kernel(name: str, check: Callable[[ModuleType], bool]) -> Optional[ModuleType]:
    """`load_kernel(name)` once it has passed `check` (run on its first call in this process; `check` warns when it
    fails), else None."""
    if name not in _checked:
        module = load_kernel(name)
        _checked[name] = module if module is not None and check(module) else None
    return _checked[name]


def load_kernel(name: str, defines: Tuple[str, ...] = ()) -> Optional[ModuleType]:
    """
    The compiled module of `labml_txl/fast/native/{name}.cpp`, built on the first call in this process (and cached on
    disk), or None where it cannot be built or `LABML_TXL_NATIVE=0`; a failed build warns once with the reason.
    `defines` are preprocessor macros for a variant of the kernel (a build of its own).
    """
    key = (name,) + tuple(defines)
    if key in _loaded:
        return _loaded[key]
    module = None
    if _environment_allows():
        module = _build(name, tuple(defines))
    _loaded[key] = module
    return module


def target_arch() -> str:
    """The compiler's `-march=` target: `LABML_TXL_NATIVE_ARCH`, else `native` (this machine's every feature)."""
    arch = os.environ.get(ARCH_VARIABLE, '').strip() or DEFAULT_ARCH
    if not re.fullmatch(r'[A-Za-z0-9][A-Za-z0-9_.+-]*', arch):
        raise ValueError(f'{ARCH_VARIABLE}={arch!r} is not a -march= target; give one gcc accepts, such as '
                         f'native (the default), x86-64-v3 (AVX2) or x86-64-v4 (AVX-512)')
    return arch


def _build(name: str, defines: Tuple[str, ...]) -> Optional[ModuleType]:
    from torch.utils import cpp_extension

    def compile_in(module_name: str, source: Path, folder: Path) -> ModuleType:
        return cpp_extension.load(module_name, [str(source)], extra_cflags=cflags, extra_ldflags=ldflags,
                                  build_directory=str(folder), verbose=False)

    cflags = ['-O3', f'-march={target_arch()}', '-fopenmp'] + [f'-D{define}' for define in defines]
    ldflags = ['-fopenmp', '-ldl']
    _ensure_ninja_on_path()
    try:
        return kernel_cache.cached_or_built(name, Path(__file__).with_name(f'{name}.cpp'), cflags, ldflags,
                                            compile_in)
    except Exception as error:  # a missing compiler or ninja, a failed compile, link or import: all mean "not here"
        warnings.warn(f"labml_txl could not build its {name} kernel ({_reason(error)}); the PyTorch path runs "
                      f"instead (same results, slower). It needs a C++ compiler with OpenMP (g++) and ninja; set "
                      f"{DISABLE_VARIABLE}=0 to skip the build.", RuntimeWarning)
        return None


def _reason(error: Exception) -> str:
    """The telling line of a failed build: the compiler's first error, else the exception's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines[1:] if 'error' in line.lower()]
    reason = (errors or lines or [type(error).__name__])[0]
    return reason if len(reason) <= 300 else reason[:297] + '...'
