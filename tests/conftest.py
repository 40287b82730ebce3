"""Shared pytest fixtures."""
from types import SimpleNamespace

import pytest
import torch


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
def count_kernel_calls(monkeypatch):
    """`count_kernel_calls(wrapper, function, record)`: the list of `record(*args)` for every call of the compiled
    kernel's `function` that `wrapper` (a module of `labml_txl.native`) reaches through its `checked_kernel`; the
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
