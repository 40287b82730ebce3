"""
# Reading a JSON object the library wrote

Files such as a run's `overrides.json` or a Hugging Face folder's `config.json` hold one JSON object. One that is
damaged (cut short, edited, not UTF-8) or holds something else is an error naming the file and what it should hold,
not the JSON parser's position alone.
"""
import json
from pathlib import Path
from typing import Any, Dict


def read_json_object(path: Path, expected: str) -> Dict[str, Any]:
    """
    The JSON object in `path`, or a `ValueError` naming the file, what is wrong and `expected` (what it should hold).

    Args:
        path: the file.
        expected: what the file should hold, for the message (`'the TransfoXLConfig Hugging Face writes'`).
    """
    try:
        value = json.loads(Path(path).read_text(encoding='utf-8'))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e}): expected {expected}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a {type(value).__name__}: expected {expected}")
    return value
