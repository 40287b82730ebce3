"""
# Error helpers

Every user error in this package names the argument, the value it got and what is accepted.
These helpers keep the wording of those messages the same everywhere.
"""
import difflib
from typing import Iterable


def describe_choices(accepted: Iterable[str]) -> str:
    """`'a', 'b' or 'c'` for an error message."""
    names = [repr(a) for a in accepted]
    if len(names) <= 1:
        return ''.join(names)
    return ', '.join(names[:-1]) + ' or ' + names[-1]


def closest(name: str, accepted: Iterable[str]) -> str:
    """A `' Did you mean ...?'` suffix naming the accepted value closest to `name`, or `''`."""
    matches = difflib.get_close_matches(name, list(accepted), n=1, cutoff=0.5)
    return f" Did you mean {matches[0]!r}?" if matches else ''


def require_positive_int(name: str, value, *, allow_zero: bool = False) -> None:
    """Raise `ValueError` unless `value` is an integer above zero (or at least zero)."""
    lowest = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        accepted = 'a non-negative integer' if allow_zero else 'a positive integer'
        raise ValueError(f"{name}={value!r} is not accepted: {name} must be {accepted}")
