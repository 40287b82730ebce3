"""The vector paths a run takes are the ones its environment asks for.

The suite runs twice in CI (`make test`, then `make test-avx2` with `ATEN_CPU_CAPABILITY=avx2`,
`ONEDNN_MAX_CPU_ISA=AVX2` and `LABML_TXL_NATIVE_ARCH=x86-64-v3`), so that on an AVX-512 machine the numerically
sensitive tests also run the kernels of an AVX2 machine. These tests show, in either pass, that each library
really took the paths the environment names: ATen's dispatch, oneDNN's matmul (from its own verbose log) and
the target our kernels are compiled for. MKL's `sgemm` takes its AVX2 path on AMD processors either way (its
results are bitwise the same under `MKL_ENABLE_INSTRUCTIONS=AVX2` here), so it needs no setting.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labml_txl.fast.native import build


def _cpu_flags() -> set:
    try:
        lines = Path('/proc/cpuinfo').read_text().splitlines()
    except OSError:
        pytest.fail('/proc/cpuinfo is unreadable: the vector paths cannot be compared with the CPU\'s')
    return set(next(line for line in lines if line.startswith('flags')).split(':', 1)[1].split())


def test_aten_dispatches_to_the_capability_asked_for_else_the_cpus_best():
    asked = os.environ.get('ATEN_CPU_CAPABILITY')
    if asked:
        expected = asked.upper()
    else:
        flags = _cpu_flags()
        expected = 'AVX512' if {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'} <= flags else 'AVX2'
    assert torch.backends.cpu.get_cpu_capability() == expected


def test_onednn_runs_the_isa_asked_for_else_the_cpus_best():
    """oneDNN's verbose log of one packed product (the op `prepacked_linear` runs) names the ISA it dispatched to;
    it is never wider than `ONEDNN_MAX_CPU_ISA`, and AVX-512's where the CPU has it and nothing limits it."""
    script = ('import torch\n'
              'x, w = torch.randn(64, 256), torch.randn(256, 256)\n'
              'packed = torch.ops.mkldnn._reorder_linear_weight(w, None)\n'
              'with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):\n'
              '    torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")\n')
    log = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=True).stdout
    executed = [line for line in log.splitlines() if ',primitive,exec,cpu,' in line]
    assert executed, f'oneDNN logged no executed primitive:\n{log}'
    implementation = executed[0].split(',')[6]  # e.g. brg_matmul:avx512_core
    limit = os.environ.get('ONEDNN_MAX_CPU_ISA', '').upper()
    if limit == 'AVX2' or 'avx512f' not in _cpu_flags():
        assert re.search(r':avx2\b', implementation), implementation
    else:
        assert 'avx512' in implementation, implementation


def test_our_kernels_are_compiled_for_the_target_asked_for(monkeypatch):
    asked = os.environ.get(build.ARCH_VARIABLE, '').strip()
    assert build.target_arch() == (asked or 'native')
    monkeypatch.setenv(build.ARCH_VARIABLE, 'native; rm -rf /')
    with pytest.raises(ValueError, match='LABML_TXL_NATIVE_ARCH=.* is not a -march= target'):
        build.target_arch()
