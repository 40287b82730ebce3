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

`resolved(conf)` gives what a configs object computed as plain data (`ResolvedItem`: value, overridden or not),
nested configs under dotted keys, never computing anything; `print(conf)` of a `ValidatedConfigs` shows it as a
`key = value` table (`config_table`), overridden items marked `*`, the items not computed yet named at the end.
"""
import inspect
import numbers
import sys
import typing
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from labml.configs import BaseConfigs

from ..errors import closest, describe_choices


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


def default_of(configs: BaseConfigs, key: str) -> Any:
    """
    The value item `key` takes when nothing overrides it: its class default, else its first option's name; `None`
    where neither is there. A dotted key (`ffn.d_ff`) is the nested configs class's default.
    """
    head, _, rest = key.partition('.')
    if rest:
        nested = _nested_configs(configs, head)
        return default_of(nested, rest) if nested is not None else None
    default = configs._Configs__defaults.get(key)
    options = configs._Configs__options.get(key)
    if default is None and options:
        return next(iter(options))
    return default


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


def _called_by_labml_value_string() -> bool:
    """Whether the caller of the `__str__` that calls this is labml's `Value.to_str`."""
    from labml.internal.configs.utils import Value
    try:
        return sys._getframe(2).f_code is Value.to_str.__code__
    except (AttributeError, ValueError):
        return False


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

    def __repr__(self):
        """The computed items as a `key = value` table (`config_table`), overridden ones marked `*`."""
        try:
            return config_table(self)
        except Exception as error:  # a repr must not raise
            return f'<{type(self).__name__}: its table failed: {error!r}>'

    def __str__(self):
        # labml writes a nested configs item to configs.yaml as `str(value)` (`Value.to_str`), and as the class's
        # path where that is the default repr: that one call gets the default, so configs.yaml stays as labml
        # writes it (the nested items are there already, under dotted keys; a table there would be stale)
        if _called_by_labml_value_string():
            return object.__repr__(self)
        return self.__repr__()


# ## The resolved configs, as data
#
# labml keeps what it computed in private dictionaries of each `BaseConfigs` (`_Configs__cached`, and the nested
# configs it computed in `_Configs__cached_configs`) and writes them to a run's `configs.yaml` (`_to_json`): there,
# objects are only strings. `resolved` reads the same dictionaries, never computing anything, and gives every item
# as plain data with dotted keys for nested configs (`ffn.d_ff`); `config_table` (and so `print(conf)` for a
# `ValidatedConfigs`) shows it as a `key = value` table.

# labml's marker of a value that an aggregate sets
_AGGREGATE = '__aggregate__'


@dataclass(frozen=True)
class ResolvedItem:
    """
    One config item of a configs object, as `resolved` gives it.

    Args:
        key: the item's key; `a.b` for item `b` of the nested configs that item `a` computed.
        value: the computed value where it is plain data (`None`, a bool, number or string, or a list or dict of
            these); else the name of the option that computed it (`'alibi'`, `'default'`); else labml's string of
            the object (`'SiLU()'`, as `configs.yaml` has it). An item not computed has the value it was given (an
            override, an assignment, a class default or its first option's name), or `None` where a function would
            give it.
        overridden: labml's `is_explicitly_specified`: the item was given in the overrides (`experiment.configs(conf,
            overrides)`); an assignment in code (`conf.d_model = 64`, or by the option that built a nested configs)
            is not an override.
        computed: the item was computed (labml's `configs.yaml` has `order` other than -1 for it).
        option: the name of the option that computed (or would compute) it, where one does.
    """
    key: str
    value: Any
    overridden: bool
    computed: bool
    option: Optional[str] = None


def is_plain_data(value: Any) -> bool:
    """Whether `value` is `None`, a bool, number or string, or a list, tuple or dict of such values."""
    if value is None or isinstance(value, (bool, str, numbers.Real)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain_data(v) for k, v in value.items())
    return False


def _to_plain(value: Any) -> Any:
    """Plain data (`is_plain_data`) with NumPy's numbers as Python's and tuples as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return {k: _to_plain(v) for k, v in value.items()}


def _object_string(value: Any) -> str:
    """labml's string of an object, as `configs.yaml` has it: `str(value)`, or its class's path where that is the
    default `<... object at 0x...>`."""
    from labml.internal.configs.utils import Value
    try:
        return Value.to_str(value)
    except Exception:  # a broken __str__ must not break a table
        return f'{type(value).__module__}.{type(value).__name__}'


def _given_value(configs: BaseConfigs, key: str) -> Tuple[Any, bool]:
    """`(value, known)`: the value labml takes for `key` before computing it (an override, an assignment, a default
    set by the parent configs, an aggregate's value, the class default or the first option's name), as
    `Configs.__get_value` finds it but without computing anything: a default given by a function is not known."""
    for values in (configs._Configs__values_override, configs._Configs__values):
        if key in values and not _is_aggregate_marker(values[key]):
            return values[key], True
    if key in configs._Configs__default_overrides:
        value, function = configs._Configs__default_overrides[key]
        if function is not None:
            return None, False
        if not _is_aggregate_marker(value):
            return value, True
    for aggregate_key, options in configs._Configs__aggregates.get(key, {}).items():
        cached = configs._Configs__cached
        chosen, known = (cached[aggregate_key], True) if aggregate_key in cached \
            else _given_value(configs, aggregate_key)
        try:
            if known and chosen in options:
                return options[chosen], True
        except TypeError:  # an unhashable value is no aggregate's option
            pass
    if key in configs._Configs__defaults:
        return configs._Configs__defaults[key], True
    if configs._Configs__options.get(key):
        return next(iter(configs._Configs__options[key])), True
    return None, False


def _is_aggregate_marker(value: Any) -> bool:
    return isinstance(value, str) and value == _AGGREGATE


def _option_of(configs: BaseConfigs, key: str, given: Any, known: bool) -> Optional[str]:
    """The name of the option of `key` that `given` picks, or None."""
    if known and isinstance(given, str) and given in configs._Configs__options.get(key, {}):
        return given
    return None


def resolved(configs: BaseConfigs, include_uncomputed: bool = False) -> Dict[str, ResolvedItem]:
    """
    The items of `configs` that were computed, as plain data (`ResolvedItem`), by key in alphabetical order; the
    items of nested configs that were computed (`transformer.ffn.d_ff`) too. Nothing is computed by this: it works
    on a configs object that `experiment.configs(conf, overrides)` set up, before, during or after a run, and on one
    that computed only some of its items (labml computes an item on first use).

    Args:
        configs: any labml `BaseConfigs`.
        include_uncomputed: also give the items never computed (`computed=False`, with the value given for them),
            including overrides waiting for a nested configs that was not computed (`ffn.d_ff` before `ffn`).

    The values agree with the `computed` values of the `configs.yaml` labml writes for a run, where those are plain
    data; where labml writes an object's string, this gives the name of the option that computed it.
    """
    items: Dict[str, ResolvedItem] = {}
    _collect(configs, '', include_uncomputed, items)
    return dict(sorted(items.items()))


def _collect(configs: BaseConfigs, prefix: str, include_uncomputed: bool, items: Dict[str, ResolvedItem]) -> None:
    cached = configs._Configs__cached
    explicit = configs._Configs__explicitly_specified
    for key in _items(configs):
        given, known = _given_value(configs, key)
        option = _option_of(configs, key, given, known)
        if key in cached:
            value = cached[key]
            shown = _to_plain(value) if is_plain_data(value) else option or _object_string(value)
            items[prefix + key] = ResolvedItem(prefix + key, shown, key in explicit, True, option)
        elif include_uncomputed:
            if not known:
                shown = None
            elif is_plain_data(given):
                shown = _to_plain(given)
            else:
                shown = option or _object_string(given)
            items[prefix + key] = ResolvedItem(prefix + key, shown, key in explicit, False, option)
    for key, nested in configs._Configs__cached_configs.items():
        _collect(nested, f'{prefix}{key}.', include_uncomputed, items)
    if include_uncomputed:
        # Overrides of nested configs not computed yet (labml keeps them until it computes them)
        for key, values in configs._Configs__secondary_values.items():
            for nested_key, value in values.items():
                full = f'{prefix}{key}.{nested_key}'
                shown = _to_plain(value) if is_plain_data(value) else _object_string(value)
                items.setdefault(full, ResolvedItem(full, shown, True, False, None))


# The longest value `config_table` shows on its line
_TABLE_VALUE_WIDTH = 60


def short_value(value: Any, width: int = _TABLE_VALUE_WIDTH) -> str:
    """`value` on one line of at most `width` characters: strings as they are, other values as Python writes them,
    cut with `…`."""
    text = value if isinstance(value, str) else repr(value)
    text = ' '.join(text.split()) if '\n' in text else text
    return text if len(text) <= width else text[:width - 1] + '…'


def config_table(configs: BaseConfigs) -> str:
    """
    `configs` as a readable table: a first line naming its class, then one line `key = value` for every computed
    item (`resolved`), marked `*` where it was overridden, then the items not computed yet (`*` where overridden).
    This is what `print(conf)` shows for a `ValidatedConfigs`.
    """
    import textwrap
    items = resolved(configs, include_uncomputed=True)
    computed = [item for item in items.values() if item.computed]
    waiting = [item for item in items.values() if not item.computed]
    name = type(configs).__name__
    if not computed:
        lines = [f'{name}: nothing computed yet (* overridden)']
    else:
        lines = [f'{name}: {len(computed)} items computed (* overridden)']
        width = max(len(item.key) for item in computed)
        lines += [f"{'*' if item.overridden else ' '} {item.key:<{width}} = {short_value(item.value)}"
                  for item in computed]
    if waiting:
        names = ', '.join(item.key + ('*' if item.overridden else '') for item in waiting)
        lines += textwrap.wrap(f'not computed: {names}', width=110, initial_indent='  ',
                               subsequent_indent='    ', break_on_hyphens=False)
    return '\n'.join(lines)
