"""
# Error helpers

Every user error in this package names the argument, the value it got and what is accepted.
These helpers keep the wording of those messages the same everywhere.
"""
import difflib
from typing import Dict, Iterable


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


def require_bool(name: str, value) -> None:
    """Raise `TypeError` unless `value` is a bool: the string `'False'` is true, so it is never taken for one."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is not accepted: {name} must be a bool (True or False)")


def require_probability(name: str, value, *, allow_one: bool = True) -> None:
    """Raise `ValueError` unless `value` is a number in `[0, 1]` (`[0, 1)` without `allow_one`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1 \
            or (value == 1 and not allow_one):
        interval = '[0, 1]' if allow_one else '[0, 1)'
        raise ValueError(f"{name}={value!r} is not accepted: {name} must be a probability in {interval}")


def require_positive_int(name: str, value, *, allow_zero: bool = False) -> None:
    """Raise `ValueError` unless `value` is an integer above zero (or at least zero)."""
    lowest = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        accepted = 'a non-negative integer' if allow_zero else 'a positive integer'
        raise ValueError(f"{name}={value!r} is not accepted: {name} must be {accepted}")


def require_one_of(name: str, value, accepted: Dict[str, str]) -> str:
    """`value`, or a `ValueError` naming each accepted value with what it means (`accepted`: value to meaning)."""
    if not isinstance(value, str) or value not in accepted:
        choices = ' or '.join(f'{choice!r} ({meaning})' for choice, meaning in accepted.items())
        raise ValueError(f"{name}={value!r} is not accepted: {choices}")
    return value
