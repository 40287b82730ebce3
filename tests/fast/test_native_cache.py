"""
The kernel cache (`labml_txl/fast/native/kernel_cache.py`) in separate processes, as users meet it: two checkouts share
one build; a build killed part-way (with its compiler) blocks nothing and the next run builds and finishes; a
process that waits for another's build says what it waits for.

A small pybind11 module stands in for a kernel (it compiles in seconds, through the same code path as ours); the
real kernels' names are checked to depend on their bytes and flags only.
"""
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labml_txl.fast.native import kernel_cache

TINY_KERNEL = r'''
#include <pybind11/pybind11.h>
int answer() { return ANSWER; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
'''

# Builds the kernel at argv[1] (a define ANSWER=argv[2]) through the cache and prints its answer and the file
# the cache keeps
BUILD_SCRIPT = r'''
import sys
from pathlib import Path
from torch.utils import cpp_extension
from labml_txl.fast.native import kernel_cache

def compile_in(name, source, folder):
    return cpp_extension.load(name, [str(source)], extra_cflags=cflags, build_directory=str(folder), verbose=False)

cflags = ['-O1', f'-DANSWER={sys.argv[2]}']
module = kernel_cache.cached_or_built('tiny', Path(sys.argv[1]), cflags, [], compile_in)
name = kernel_cache.module_name('tiny', Path(sys.argv[1]).read_bytes(), cflags, [])
print('answer', module.answer(), kernel_cache.cache_root() / name / f'{name}.so')
'''

NATIVE_DIR = Path(kernel_cache.__file__).parent


def _checkout(folder: Path, text: str = TINY_KERNEL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'tiny.cpp').write_text(text)
    return folder / 'tiny.cpp'


def _start(source: Path, cache: Path, answer: int = 42) -> subprocess.Popen:
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(cache))
    return subprocess.Popen([sys.executable, '-c', BUILD_SCRIPT, str(source), str(answer)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(process: subprocess.Popen, timeout: float = 300):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    answer, number, file = out.split()
    return int(number), Path(file), err


def test_two_checkouts_share_one_build(tmp_path):
    cache = tmp_path / 'cache'
    first = _checkout(tmp_path / 'checkout_a')
    answer, library, err = _finish(_start(first, cache))
    assert answer == 42 and 'compiling the tiny kernel' in err
    built = library.stat()
    # A second checkout, elsewhere and newer on disk: it imports the same file without compiling
    time.sleep(1.1)
    second = _checkout(tmp_path / 'checkout_b')
    answer, library_b, err = _finish(_start(second, cache))
    assert answer == 42 and 'compiling' not in err, err
    assert library_b == library and library.stat().st_mtime_ns == built.st_mtime_ns
    # and back: the first checkout still finds it
    assert 'compiling' not in _finish(_start(first, cache))[2]
    # A changed source, or a changed flag, is a build of its own
    changed = _checkout(tmp_path / 'checkout_c', TINY_KERNEL.replace('return ANSWER;', 'return ANSWER + 1;'))
    answer, library_c, err = _finish(_start(changed, cache))
    assert answer == 43 and library_c != library and 'compiling' in err
    answer, library_d, err = _finish(_start(first, cache, answer=7))
    assert answer == 7 and library_d not in (library, library_c) and 'compiling' in err


def test_the_kernels_names_depend_on_their_bytes_and_flags_only(tmp_path):
    source = (NATIVE_DIR / 'causal_relative_attention.cpp').read_bytes()
    copy = _checkout(tmp_path / 'elsewhere', source.decode())
    flags = ['-O3', '-march=native', '-fopenmp']
    name = kernel_cache.module_name('causal_relative_attention', source, flags, ['-fopenmp'])
    assert kernel_cache.module_name('causal_relative_attention', copy.read_bytes(), flags, ['-fopenmp']) == name
    assert kernel_cache.module_name('causal_relative_attention', source + b'\n', flags, ['-fopenmp']) != name
    assert kernel_cache.module_name('causal_relative_attention', source, flags + ['-DX'], ['-fopenmp']) != name
    assert kernel_cache.module_name('causal_relative_attention', source, flags, []) != name


def _wait_for_compiler(process: subprocess.Popen, cache: Path, timeout: float = 120) -> Path:
    """The build folder of `process` once its compiler has started writing there."""
    folder = cache / '__none__'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folders = list(cache.glob(f'*.build-{process.pid}'))
        if folders and (folders[0] / 'build.ninja').exists():
            folder = folders[0]
            break
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.05)
    assert folder.exists(), 'the build never started'
    return folder


@pytest.mark.parametrize('how', [signal.SIGKILL, signal.SIGTERM])
def test_a_build_killed_part_way_blocks_nothing(tmp_path, how):
    cache = tmp_path / 'cache'
    source = _checkout(tmp_path / 'checkout')
    killed = _start(source, cache)
    folder = _wait_for_compiler(killed, cache)
    os.killpg(killed.pid, how)  # the process and its ninja and compiler, as a closed terminal does
    killed.communicate(timeout=60)
    assert folder.exists() and not list(cache.glob('*/*.so'))
    answer, library, err = _finish(_start(source, cache), timeout=300)
    assert answer == 42 and 'compiling the tiny kernel' in err
    assert f'removing {folder.name}, an unfinished build' in err
    assert not folder.exists() and library.is_file()


def test_a_waiting_build_says_what_it_waits_for_and_then_uses_the_build(tmp_path):
    cache = tmp_path / 'cache'
    source = _checkout(tmp_path / 'checkout')
    builder = _start(source, cache)
    _wait_for_compiler(builder, cache)
    waiter = _start(source, cache)
    answer, library, builder_err = _finish(builder)
    waited, library_w, waiter_err = _finish(waiter)
    assert answer == waited == 42 and library_w == library
    assert f'waiting for process {builder.pid}, which is compiling the tiny kernel' in waiter_err, waiter_err
    assert 'compiling the tiny kernel for this machine' not in waiter_err


def test_a_lock_held_by_a_live_process_is_waited_for(tmp_path):
    """The lock is the operating system's: while a process holds it (here this one, with no build running), a
    builder waits and says so; once released, it builds."""
    cache = tmp_path / 'cache'
    source = _checkout(tmp_path / 'checkout')
    name = kernel_cache.module_name('tiny', source.read_bytes(), ['-O1', '-DANSWER=42'], [])
    cache.mkdir()
    with open(cache / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write('12345\n')
        lock.flush()
        waiter = _start(source, cache)
        time.sleep(5)
        assert waiter.poll() is None, waiter.communicate()[1]
    answer, _, err = _finish(waiter)
    assert answer == 42 and 'waiting for process 12345' in err and 'compiling the tiny kernel' in err


def test_a_kernel_is_keyed_and_built_with_the_files_it_includes(tmp_path, monkeypatch):
    """A kernel that includes files beside it (as `decoder_layer.cpp` includes the kernels it calls): its build
    folder holds them all, and a change to an included file alone is a build of its own."""
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', str(tmp_path / 'cache'))
    folder = tmp_path / 'checkout'
    folder.mkdir()
    (folder / 'main.cpp').write_text('#include "part.cpp"\nint main_part() { return part(); }\n')
    (folder / 'part.cpp').write_text('#include <vector>\n#include "leaf.cpp"\nint part() { return leaf(); }\n')
    (folder / 'leaf.cpp').write_text('int leaf() { return 1; }\n')
    assert list(kernel_cache.source_files(folder / 'main.cpp')) == ['main.cpp', 'part.cpp', 'leaf.cpp']
    builds = []

    def compile_in(name, source, build_folder):
        # (no compiler: what the build would compile is what matters here)
        builds.append((name, sorted(path.name for path in build_folder.iterdir())))
        (build_folder / f'{name}.so').write_bytes(b'')
        return name

    first = kernel_cache.cached_or_built('including', folder / 'main.cpp', [], [], compile_in)
    (folder / 'leaf.cpp').write_text('int leaf() { return 2; }\n')
    second = kernel_cache.cached_or_built('including', folder / 'main.cpp', [], [], compile_in)
    assert first != second
    assert builds == [(first, ['leaf.cpp', 'main.cpp', 'part.cpp']), (second, ['leaf.cpp', 'main.cpp', 'part.cpp'])]


def test_the_kernels_pass_their_first_checks_under_a_float64_default_dtype():
    """A kernel's first check runs float32 inputs whatever the default dtype: under `torch.set_default_dtype(
    torch.float64)` (a float64 experiment) the checks once compared float64 inputs, failed, and left every kernel
    off for the rest of the process. In a new process, since a process checks each kernel once."""
    script = ('import warnings, torch\n'
              'torch.set_default_dtype(torch.float64)\n'
              'from labml_txl.fast.native import prepare_kernels\n'
              'with warnings.catch_warnings():\n'
              '    warnings.simplefilter("error")\n'
              '    assert prepare_kernels()\n')
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
