"""`ParameterSnapshot`: what counts as a change of a module's parameters, against a plain module tree."""
import torch
from torch import nn

from labml_txl.fast.parameter_versions import ParameterSnapshot


def _tree():
    return nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2, bias=False)))


def test_nothing_changed():
    module = _tree()
    snapshot = ParameterSnapshot(module)
    module(torch.randn(2, 3))
    assert snapshot.unchanged()


def test_changes_of_the_parameters_are_seen():
    def in_place(m):
        with torch.no_grad():
            m[1][1].weight.add_(1)

    def loaded(m):
        m.load_state_dict(_tree().state_dict())

    def replaced_parameter(m):
        m[1][0].weight = nn.Parameter(torch.ones(4))

    def removed_parameter(m):
        m[0].bias = None

    def replaced_module(m):
        m[1][1] = nn.Linear(4, 2, bias=False)

    def added_parameter(m):
        m[1][0].extra = nn.Parameter(torch.ones(1))

    def added_module(m):
        m.append(nn.Linear(2, 2))

    for change in (in_place, loaded, replaced_parameter, removed_parameter, replaced_module, added_parameter,
                   added_module):
        module = _tree()
        snapshot = ParameterSnapshot(module)
        change(module)
        assert not snapshot.unchanged(), change.__name__
