"""
# What a script accepts as `key=value`, described from its configs

Every experiment script takes its settings as `key=value` (`cli.parse_overrides`): the items of one configs class
(nested ones with dotted keys, `transformer.ffn.d_ff`) and a few of the script's own. `Settings` describes them
once, from labml's registrations and the comments above the items in the class bodies, so `--help`,
`docs/options.md` and the suggestion for a mistyped key cannot drift from the code.
"""
import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from labml.configs import BaseConfigs

from .validation import accepted_options, default_of

# An item in a class body: four spaces, a name, a colon (`n_layer: int = 12`)
_ITEM = re.compile(r'^    (\w+)\s*:')


def item_docs(configs_class: type) -> Dict[str, str]:
    """
    The comment lines written directly above each item in the bodies of `configs_class` and its bases (a
    subclass's comment wins), and the documentation of items added outside a body (`_generated_item_docs`):

        # Number of layers
        n_layer: int = 12
    """
    docs = {}
    for cls in reversed(configs_class.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseConfigs)) or cls is BaseConfigs:
            continue
        # Items added to the class outside its body (a memory mechanism's settings), with their documentation
        docs.update(cls.__dict__.get('_generated_item_docs', {}))
        try:
            lines = textwrap.dedent(inspect.getsource(cls)).splitlines()[1:]
        except (OSError, TypeError):
            continue
        comment = []
        for line in lines:
            match = _ITEM.match(line)
            if line.startswith('    #'):
                comment.append(line.strip().lstrip('#').strip())
                continue
            if match and comment:
                docs[match.group(1)] = ' '.join(comment)
            comment = []
    return docs


def type_name(annotation) -> str:
    """`int` for `int`, `Optional[int]` for `typing.Optional[int]`."""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace('typing.', '')


def first_doc_line(func) -> str:
    """The first line of `func`'s docstring, or `''`."""
    doc = inspect.getdoc(func) or ''
    return doc.splitlines()[0] if doc else ''


@dataclass
class Setting:
    """One `key=value` a script takes."""
    key: str
    type: str
    # The default's text: a value's repr, an option's name, or how it is computed
    default: str
    doc: str
    options: List[str] = field(default_factory=list)


def _default_text(conf: BaseConfigs, key: str, script_default: Any) -> str:
    if script_default is not _MISSING:
        return repr(script_default)
    default = default_of(conf, key)
    options = conf._Configs__options.get(key, {})
    if default is None or (isinstance(default, str) and default.startswith('_')):
        return 'computed' if options else 'None'
    if isinstance(default, str) and default in options:
        return default
    if isinstance(default, BaseConfigs) or inspect.isclass(default):
        return type_name(default)
    return repr(default)


_MISSING = object()


def describe_items(configs_class: type, script_defaults: Optional[Dict[str, Any]] = None,
                   prefix: str = '', nested: bool = True) -> List[Setting]:
    """Every item of `configs_class` as a `Setting`, nested configs' items under `prefix + item + '.'` (or, without
    `nested`, the item holding them as one setting of the nested class's type)."""
    script_defaults = script_defaults or {}
    conf = configs_class()
    docs = item_docs(configs_class)
    options = conf._Configs__options
    settings = []
    for key, annotation in conf._Configs__types.items():
        if nested and isinstance(annotation, type) and issubclass(annotation, BaseConfigs):
            settings += describe_items(annotation, script_defaults, prefix=f'{prefix}{key}.')
            continue
        doc = docs.get(key, '')
        if not doc and key in options:
            doc = first_doc_line(next(iter(options[key].values())).func)
        # (options named `_like_this` are how an item is computed, not names to choose)
        names = [name for name in accepted_options(conf, key) if not name.startswith('_')]
        settings.append(Setting(prefix + key, type_name(annotation),
                                _default_text(conf, key, script_defaults.get(prefix + key, _MISSING)),
                                doc, names))
    return settings


@dataclass
class Settings:
    """
    The settings of one script.

    Args:
        configs: the configs class whose items the script takes (`TrainXLConfigs`), or `None`.
        defaults: the script's own values for some of them (a demo's small model), which replace the class's.
        extra: the script's settings that are not config items: key to `(type, default, one line of doc)`.
    """
    configs: Optional[type] = None
    defaults: Dict[str, Any] = field(default_factory=dict)
    extra: Dict[str, Tuple[str, Any, str]] = field(default_factory=dict)

    def describe(self) -> List[Setting]:
        extra = [Setting(key, kind, repr(default), doc) for key, (kind, default, doc) in self.extra.items()]
        return extra + (describe_items(self.configs, self.defaults) if self.configs is not None else [])

    def keys(self) -> List[str]:
        return [setting.key for setting in self.describe()]

    def help(self) -> str:
        """One line per setting: key, type, default, doc, and the options an item accepts."""
        rows = self.describe()
        key_width = max(len(s.key) for s in rows)
        type_width = max(len(s.type) for s in rows)
        default_width = min(max(len(s.default) for s in rows), 24)
        lines = []
        for s in rows:
            options = f" [{' | '.join(s.options)}]" if s.options else ''
            lines.append(f'  {s.key:<{key_width}}  {s.type:<{type_width}}  {s.default:<{default_width}}  '
                         f'{s.doc}{options}'.rstrip())
        return 'Settings (key=value; type, default, what it is, [options]):\n' + '\n'.join(lines)
