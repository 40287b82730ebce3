"""
# A training state as JSON and safetensors, which load without running code

A trainer's state is nested dictionaries, lists and tuples of numbers, strings, booleans, None and tensors (the
model's and optimizer's tensors, memories, random-number-generator states). `split_state` separates it into a
JSON-ready structure and a flat `{name: tensor}` dictionary for safetensors; `join_state` puts them back. Reading
either file parses data only: unlike a pickle (`torch.save`), neither can execute code when loaded.

In the JSON, a tensor is `{"__tensor__": name}`, a tuple `{"__tuple__": [...]}`, a dictionary whose keys are not
all strings (the optimizer's per-parameter state is keyed by integers) or that start with `__`
`{"__items__": [[key, value], ...]}`, and a float that JSON cannot spell (`inf`, `nan`) `{"__float__": "inf"}`.
"""
import math
from typing import Any, Dict, Tuple

import torch

TENSOR, TUPLE, ITEMS, FLOAT = '__tensor__', '__tuple__', '__items__', '__float__'


def split_state(state: Any) -> Tuple[Any, Dict[str, torch.Tensor]]:
    """`(json_ready, tensors)`: every tensor of `state` replaced by a reference into `tensors` (CPU copies, so tied
    parameters, which share memory, are stored apart and safetensors accepts them)."""
    tensors: Dict[str, torch.Tensor] = {}

    def encode(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            name = f't{len(tensors)}'
            tensors[name] = value.detach().to('cpu', copy=True).contiguous()
            return {TENSOR: name}
        if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {FLOAT: repr(value)}
        if isinstance(value, tuple):
            return {TUPLE: [encode(v, f'{path}[{i}]') for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [encode(v, f'{path}[{i}]') for i, v in enumerate(value)]
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith('__') for k in value):
                return {k: encode(v, f'{path}.{k}') for k, v in value.items()}
            return {ITEMS: [[encode(k, f'{path} key'), encode(v, f'{path}[{k!r}]')] for k, v in value.items()]}
        raise TypeError(f"the training state holds a {type(value).__name__} at {path}, which a checkpoint cannot "
                        f"store: it stores tensors, numbers, strings, booleans, None, lists, tuples and dicts")

    return encode(state, 'state'), tensors


def join_state(encoded: Any, tensors: Dict[str, torch.Tensor]) -> Any:
    """The state `split_state` split into `(encoded, tensors)`."""
    if isinstance(encoded, list):
        return [join_state(v, tensors) for v in encoded]
    if not isinstance(encoded, dict):
        return encoded
    if TENSOR in encoded:
        return tensors[encoded[TENSOR]]
    if TUPLE in encoded:
        return tuple(join_state(v, tensors) for v in encoded[TUPLE])
    if ITEMS in encoded:
        return {join_state(k, tensors): join_state(v, tensors) for k, v in encoded[ITEMS]}
    if FLOAT in encoded:
        return float(encoded[FLOAT])
    return {k: join_state(v, tensors) for k, v in encoded.items()}
