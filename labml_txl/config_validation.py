"""
# Eager checks of config overrides

labml's `BaseConfigs` accepts an option name it does not know and keeps the string as the value (the error
surfaces later, far from its cause), and rejects an unknown key without saying which keys exist.
`ValidatedConfigs` checks each override when it is given, including nested keys such as
`'transformer.ffn.glu_variant'`, and raises an error that names the key, the value and what is accepted.
"""
import inspect
from typing import Any, Dict, List, Optional

from labml.configs import BaseConfigs

from .errors import closest, describe_choices


class ConfigKeyError(KeyError):
    """An override names a config item that does not exist."""

    def __str__(self):
        return str(self.args[0])


class ConfigOptionError(ValueError):
    """An override picks an option that is not registered for that config item."""


def _items(configs: BaseConfigs) -> Dict[str, Any]:
    """The config items of `configs` and their annotations (labml keeps them private)."""
    return configs._Configs__types


def accepted_options(configs: BaseConfigs, key: str) -> List[str]:
    """The option names a string value of `key` may take: its registered options, or its aggregates."""
    options = list(configs._Configs__options.get(key, {}).keys())
    aggregate_options = sorted(configs._Configs__aggregates_options.get(key, set()))
    if aggregate_options:
        default = configs._Configs__defaults.get(key)
        return ([default] if isinstance(default, str) else []) + options + aggregate_options
    return options


def _nested_configs(configs: BaseConfigs, key: str) -> Optional[BaseConfigs]:
    """A fresh instance of the configs class that `key` holds, to check nested keys against."""
    annotation = _items(configs).get(key)
    if inspect.isclass(annotation) and issubclass(annotation, BaseConfigs):
        return annotation()
    return None


def check_override(configs: BaseConfigs, key: str, value: Any, prefix: str = '') -> None:
    """Raise `ConfigKeyError` or `ConfigOptionError` unless `key = value` is a valid override of `configs`."""
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
        return
    if not isinstance(value, str):
        # A value given directly (a module, a number, ...) is used as it is
        return
    accepted = accepted_options(configs, key)
    if accepted and value not in accepted:
        raise ConfigOptionError(f"{prefix + key}={value!r} is not an option of {name}.{key}."
                                f"{closest(value, accepted)} Accepted: {describe_choices(accepted)}")


class ValidatedConfigs(BaseConfigs):
    """`BaseConfigs` that checks every override (by dictionary or by attribute) when it is given."""

    def __init__(self):
        # No arguments, so labml builds nested configs of this class without a "pass kwargs" warning
        super().__init__()

    def _set_values(self, values: Dict[str, Any]):
        for key, value in values.items():
            check_override(self, key, value)
        super()._set_values(values)

    def __setattr__(self, key, value):
        if not key.startswith('_'):
            check_override(self, key, value)
        super().__setattr__(key, value)
