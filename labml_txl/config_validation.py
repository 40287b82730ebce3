"""
# Eager checks of config overrides

labml's `BaseConfigs` accepts an option name it does not know and keeps the string as the value (the error
surfaces later, far from its cause), takes any value for an item whatever its type (the string `'False'` for a
`bool` is true), and rejects an unknown key without saying which keys exist. `ValidatedConfigs` checks each
override when it is given, including nested keys such as `'transformer.ffn.glu_variant'`: the key, an option
name against the registered options, and a value against the item's type where it is `bool`, `int`, `float` or
`str` (or `Optional` of one), raising an error that names the key, the value and what is accepted.

A `bool` item takes `True` or `False`, and the numbers 1 and 0 (which the command line gives for `1` and `0`);
nothing else, so a string is never read as a bool. A `float` item takes an integer too.
"""
import inspect
import numbers
import typing
from typing import Any, Dict, List, Optional

from labml.configs import BaseConfigs

from .errors import closest, describe_choices


class ConfigKeyError(KeyError):
    """An override names a config item that does not exist."""

    def __str__(self):
        return str(self.args[0])


class ConfigOptionError(ValueError):
    """An override picks an option that is not registered for that config item."""


class ConfigTypeError(TypeError):
    """An override's value is not of the config item's type."""


# What each checked type accepts, for the error message
_ACCEPTED = {bool: 'a bool: True or False (on the command line also true/false, yes/no or 1/0, in any case)',
             int: 'an integer', float: 'a number', str: 'a string'}


def _items(configs: BaseConfigs) -> Dict[str, Any]:
    """The config items of `configs` and their annotations (labml keeps them private)."""
    return configs._Configs__types


def accepted_options(configs: BaseConfigs, key: str) -> List[str]:
    """The option names a string value of `key` may take: its registered options, or its aggregates."""
    options = list(configs._Configs__options.get(key, {}).keys())
    aggregate_options = sorted(configs._Configs__aggregates_options.get(key, set()))
    if aggregate_options:
        default = configs._Configs__defaults.get(key)
        # Each name once, the default first (it may be one of the aggregates)
        return list(dict.fromkeys(([default] if isinstance(default, str) else []) + options + aggregate_options))
    return options


def chosen_option(configs: BaseConfigs, key: str) -> Any:
    """The value given for `key` (an override, else the default), before any option is computed: the option's name
    where it is one."""
    for values in (configs._Configs__values_override, configs._Configs__values, configs._Configs__defaults):
        if key in values:
            return values[key]
    return None


def _nested_configs(configs: BaseConfigs, key: str) -> Optional[BaseConfigs]:
    """A fresh instance of the configs class that `key` holds, to check nested keys against."""
    annotation = _items(configs).get(key)
    if inspect.isclass(annotation) and issubclass(annotation, BaseConfigs):
        return annotation()
    return None


def _optional(annotation) -> tuple:
    """`(T, True)` for `Optional[T]`, `(annotation, False)` otherwise."""
    arguments = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union and len(arguments) == 2 and type(None) in arguments:
        return next(a for a in arguments if a is not type(None)), True
    return annotation, False


def typed_value(annotation, value: Any, key: str, owner: str) -> Any:
    """`value` as the item `key` of `owner` (annotated `annotation`) holds it, or a `ConfigTypeError`: see the
    module's docstring for what each type accepts (integers and numbers of any kind, NumPy's among them). Items of
    other types take any value."""
    kind, optional = _optional(annotation)
    if kind not in _ACCEPTED or (optional and value is None):
        return value
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is bool and (isinstance(value, bool) or (number and value in (0, 1))):
        return bool(value)
    if kind is int and number and isinstance(value, numbers.Integral):
        return int(value)
    if kind is float and number:
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    accepted = _ACCEPTED[kind] + (', or None' if optional else '')
    raise ConfigTypeError(f"{key}={value!r} is not accepted: {owner}.{key.rsplit('.', 1)[-1]} takes {accepted}")


def check_override(configs: BaseConfigs, key: str, value: Any, prefix: str = '') -> Any:
    """
    The value `key = value` sets on `configs` (a `bool` item given 1 gets True, a `float` item given 2 gets 2.0),
    or a `ConfigKeyError`, `ConfigOptionError` or `ConfigTypeError` naming what is wrong. A nested key is checked
    against the nested configs, which convert it when they receive it.
    """
    items = _items(configs)
    name = type(configs).__name__
    head, _, rest = key.partition('.')
    if head not in items:
        valid = sorted(items)
        raise ConfigKeyError(f"unknown config key {prefix + key!r}: {name} has no item {head!r}."
                             f"{closest(head, valid)} Accepted keys of {name}: {', '.join(valid)}")
    if rest:
        nested = _nested_configs(configs, head)
        if nested is not None:
            check_override(nested, rest, value, prefix=f'{prefix}{head}.')
        return value
    accepted = accepted_options(configs, key) if isinstance(value, str) else []
    if value in accepted:
        return value
    if accepted:
        raise ConfigOptionError(f"{prefix + key}={value!r} is not an option of {name}.{key}."
                                f"{closest(value, accepted)} Accepted: {describe_choices(accepted)}")
    return typed_value(items[key], value, prefix + key, name)


class ValidatedConfigs(BaseConfigs):
    """`BaseConfigs` that checks every override (by dictionary or by attribute) when it is given."""

    def __init__(self):
        # No arguments, so labml builds nested configs of this class without a "pass kwargs" warning
        super().__init__()

    def _set_values(self, values: Dict[str, Any]):
        super()._set_values({key: check_override(self, key, value) for key, value in values.items()})

    def __setattr__(self, key, value):
        if not key.startswith('_'):
            value = check_override(self, key, value)
        super().__setattr__(key, value)
