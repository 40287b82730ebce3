"""Shared pytest fixtures."""
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
