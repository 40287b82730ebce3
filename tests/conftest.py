"""Shared pytest fixtures, the markers of the optional extras (`tf`, `faiss`), and the header that names the vector paths a run takes.

How close results must be is `tolerance.py`'s policy (float64 for two implementations of one function, bounds
derived from the dtype's epsilon where float32 is the point).
"""
import importlib.util
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

# The optional extras some tests need, by marker: the module, the option that runs them, why they are deselected
# without it, and how to get it. Without its option a marker's tests are deselected (never skipped one by one, never
# passed without the extra), and the summary says why.
EXTRAS = {
    'tf': dict(module='tensorflow', option='--with-tf',
               reason='they test the TensorFlow checkpoint converter and need the tf extra (TensorFlow, about 1.4 GB, '
                      "not in `make test`'s environment); `make test-tf` installs it and runs them",
               install="`make test-tf` installs requirements/tf.lock, or pip install -e '.[tf]'"),
    'faiss': dict(module='faiss', option='--with-faiss',
                  reason="they test the kNN memory's faiss index and need the faiss extra (faiss-cpu, not in `make "
                         "test`'s environment); `make test-faiss` installs it and runs them",
                  install="`make test-faiss` installs requirements/faiss.lock, or pip install -e '.[faiss]'"),
}
_DESELECTED = pytest.StashKey[dict]()


def pytest_addoption(parser):
    for marker, extra in EXTRAS.items():
        parser.addoption(extra['option'], action='store_true',
                         help=f"run the tests marked {marker}; {extra['module']} must be installed ({extra['install']})")


def pytest_configure(config):
    for marker, extra in EXTRAS.items():
        config.addinivalue_line('markers', f"{marker}: needs {extra['module']} (the {marker} extra); deselected "
                                           f"unless {extra['option']}")
        if config.getoption(extra['option']) and importlib.util.find_spec(extra['module']) is None:
            raise pytest.UsageError(f"{extra['option']} runs the tests marked {marker}, and {extra['module']} is not "
                                    f"installed here: {extra['install']}")


def pytest_collection_modifyitems(config, items):
    """The tests of each extra whose option is not given are deselected, and the summary says why."""
    deselected = {}
    for marker, extra in EXTRAS.items():
        if config.getoption(extra['option']):
            continue
        needing = [item for item in items if item.get_closest_marker(marker)]
        if needing:
            config.hook.pytest_deselected(items=needing)
            items[:] = [item for item in items if not item.get_closest_marker(marker)]
            deselected[marker] = len(needing)
    config.stash[_DESELECTED] = deselected


def pytest_terminal_summary(terminalreporter, config):
    for marker, count in config.stash.get(_DESELECTED, {}).items():
        terminalreporter.write_line(f"{count} tests marked {marker} deselected: {EXTRAS[marker]['reason']}",
                                    yellow=True)


def _cpu_model() -> str:
    try:
        lines = Path('/proc/cpuinfo').read_text().splitlines()
    except OSError:
        return 'unknown CPU'
    return next((line.split(':', 1)[1].strip() for line in lines if line.startswith('model name')), 'unknown CPU')


def pytest_report_header(config):
    """Which vector paths this run takes: the same suite runs a second time with AVX2's (`make test-avx2`)."""
    from labml_txl.fast.native import build
    onednn = os.environ.get('ONEDNN_MAX_CPU_ISA', 'unlimited')
    return [f'cpu: {_cpu_model()}; ATen kernels: {torch.backends.cpu.get_cpu_capability()}; oneDNN max ISA: '
            f'{onednn}; our kernels: -march={build.target_arch()}']


@pytest.fixture
def labml_experiment(tmp_path, monkeypatch):
    """A labml experiment that writes nothing, created in a temporary folder so no `logs/` lands in the repo."""
    from labml import experiment
    monkeypatch.chdir(tmp_path)
    experiment.create(name='test', writers=set())
    return experiment


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _labml_project_chosen_per_test():
    """
    Each test's runs lie in the labml project its own working directory chooses: `use_working_directory_project`
    keeps the first choice of a process (a program's own `lab.configure` wins), and a test runs in a process of
    many tests. Forgetting the chosen path before every test lets each choose again.
    """
    from labml.internal.lab import lab_singleton
    configs = lab_singleton().custom_configs
    configs[:] = [c for c in configs if 'path' not in c]


@pytest.fixture
def count_calls(monkeypatch):
    """`count_calls(module, names)`: wraps each named attribute of `module` so that its calls are counted in the
    returned dict, by name (the originals still run)."""
    def wrap(module, names):
        counts = {}
        for name in names:
            original = getattr(module, name)

            def counting(*args, _name=name, _original=original, **kwargs):
                counts[_name] = counts.get(_name, 0) + 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, counting)
        return counts
    return wrap


@pytest.fixture
def hf_on_current_torch(monkeypatch):
    """transformers 4.44.2's `TransfoXLModel.forward` calls `torch.arange(...).type_as(dtype=word_emb.dtype)`,
    which current torch refuses (`type_as` takes a tensor, not a dtype). For these tests only, `type_as` also takes
    `dtype=` and converts to it, which is what that one line means; nothing else changes."""
    type_as = torch.Tensor.type_as

    def type_as_or_dtype(self, other=None, *, dtype=None):
        return self.to(dtype) if dtype is not None else type_as(self, other)

    monkeypatch.setattr(torch.Tensor, 'type_as', type_as_or_dtype)


@pytest.fixture
def hf_in_float64(hf_on_current_torch, monkeypatch):
    """Hugging Face's TransfoXL in float64: transformers 4.44.2 fills the masked scores of a float32 copy with the
    lowest float64 (`attn_score.float().masked_fill(mask, torch.finfo(attn_score.dtype).min)`), which torch refuses
    (overflow). For these tests only, a finite fill beyond a tensor's range fills with its dtype's lowest (highest)
    value: what that line means, a score of probability zero; nothing else changes."""
    masked_fill = torch.Tensor.masked_fill

    def masked_fill_within_range(self, mask, value):
        if isinstance(value, float) and math.isfinite(value) and self.is_floating_point() \
                and abs(value) > torch.finfo(self.dtype).max:
            value = math.copysign(torch.finfo(self.dtype).max, value)
        return masked_fill(self, mask, value)

    monkeypatch.setattr(torch.Tensor, 'masked_fill', masked_fill_within_range)

@pytest.fixture
def count_kernel_calls(monkeypatch):
    """`count_kernel_calls(wrapper, function, record)`: the list of `record(*args)` for every call of the compiled
    kernel's `function` that `wrapper` (a module of `labml_txl.fast.native`) reaches through its `checked_kernel`; the
    kernel still runs."""
    def wrap(wrapper, function, record):
        calls = []
        checked = wrapper.checked_kernel

        def counting_checked_kernel(name, check):
            module = checked(name, check)
            if module is None:
                return None

            def counted(*args):
                calls.append(record(*args))
                return getattr(module, function)(*args)
            return SimpleNamespace(**{function: counted})

        monkeypatch.setattr(wrapper, 'checked_kernel', counting_checked_kernel)
        return calls
    return wrap
