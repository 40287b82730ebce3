"""What the tests of the dispatcher's operations share."""
from typing import Callable, Optional, Tuple

import torch

from labml_txl.fast import dispatch
from labml_txl.fast.dispatch import Plan


def one_choice(operation: str, call: Callable[[], torch.Tensor]) -> Tuple[torch.Tensor, dispatch.Choice]:
    """`call()`'s result and the one `Choice` it recorded, which must be of `operation`."""
    with dispatch.recording() as choices:
        result = call()
    (choice,) = choices
    assert choice.operation == operation
    return result, choice


def dispatched_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, relu: bool = False,
                      impl: str = 'auto') -> Tuple[torch.Tensor, dispatch.Choice]:
    """`dispatch.linear` in the caller's state, with the `Choice` it records."""
    return one_choice('linear', lambda: dispatch.linear(Plan.now(x.device, impl), x, weight, bias, relu))
