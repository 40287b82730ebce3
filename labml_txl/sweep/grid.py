"""
# A sweep's grid from the command line

`attention=relative,rotary,alibi mem_len=0,64 max_step=500` is the product of the lists: six settings
dictionaries, each with `max_step=500`. A value is split into alternatives at the commas outside brackets and
quotes, so `cutoffs=[20000,40000]` stays one value and `cutoffs=[10],[20]` is two; each alternative is read as
`cli.parse_value` reads a setting.
"""
import itertools
from typing import Any, Dict, List

from ..cli import parse_overrides, parse_value

_OPENING, _CLOSING = '([{', ')]}'


def alternatives(text: str) -> List[str]:
    """`text` split at the commas outside brackets and quotes; a `ValueError` for unbalanced brackets."""
    parts, current, depth, quote = [], '', 0, None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in '\'"':
            quote = char
        elif char in _OPENING:
            depth += 1
        elif char in _CLOSING:
            depth -= 1
            if depth < 0:
                raise ValueError(f"{text!r} is not accepted: a closing {char!r} without its opening bracket")
        elif char == ',' and depth == 0:
            parts.append(current)
            current = ''
            continue
        current += char
    if depth or quote:
        raise ValueError(f"{text!r} is not accepted: a bracket or quote is not closed")
    return parts + [current]


def parse_grid(argv: List[str]) -> Dict[str, List[Any]]:
    """`['a=1,2', 'b=x']` to `{'a': [1, 2], 'b': ['x']}`; a key given twice or an empty alternative is an error."""
    grid = {}
    for arg in argv:
        key = next(iter(parse_overrides([arg])))
        if key in grid:
            raise ValueError(f"{key} is given twice: give its values once, separated by commas ({key}=a,b)")
        values = alternatives(arg.partition('=')[2])
        if any(not v.strip() for v in values):
            raise ValueError(f"{arg!r} is not accepted: an empty value between commas")
        grid[key] = [parse_value(v) for v in values]
    return grid


def grid_points(grid: Dict[str, List[Any]]) -> List[Dict[str, Any]]:
    """The product of the lists as settings dictionaries, the last key varying fastest."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
