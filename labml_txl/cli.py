"""
# `key=value` overrides from the command line

`python experiments/demo.py transformer.d_model=128 steps=200` gives labml the dictionary
`{'transformer.d_model': 128, 'steps': 200}`. Values are read as Python literals where they parse
(`128`, `0.5`, `True`, `[1, 2]`) and kept as strings otherwise (`SwiGLU`).
"""
import ast
from typing import Any, Dict, List


def parse_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_overrides(argv: List[str]) -> Dict[str, Any]:
    """`['a=1', 'b.c=x']` to `{'a': 1, 'b.c': 'x'}`; anything not of the form `key=value` is an error."""
    overrides = {}
    for arg in argv:
        key, sep, value = arg.partition('=')
        if not sep or not key:
            raise SystemExit(f"argument {arg!r} is not accepted: give overrides as key=value, "
                             f"for example transformer.d_model=128")
        overrides[key] = parse_value(value)
    return overrides
