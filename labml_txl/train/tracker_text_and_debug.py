"""
# labml 0.4's `tracker.set_text` and `tracker.debug`, on labml 0.5's tracker

`tracker.set_text(name, is_print=False)` declared an indicator whose values are strings, so that
`tracker.add(name, text)` is accepted: labml_nn's language-model trainer declares `'sampled'` and adds each sample
it generates. labml 0.5 dropped text indicators, and its tracker refuses a string for any other kind ("Unknown
type"). `set_text` here declares a `TextIndicator`, which collects the strings added between two
`tracker.save()` calls and, with `is_print=True`, prints each as it arrives. labml 0.5's writers (the screen's
line of numbers, the log file, the app) write numeric indicators only, so a text goes to no writer: labml_nn prints
its samples itself.

`tracker.debug(...)` kept values for inspection: `debug(True)` / `debug(False)` switch collecting on and off,
`debug(name, value)` adds a value under a name, `debug(name)` returns what was collected under it. labml_nn's
attention calls `tracker.debug('attn', attn)` at every forward pass. labml 0.4 kept every value whether switched on
or not (memory that grows with each step); here `debug(name, value)` does nothing until `debug(True)`, which
starts an empty collection, and tensors are kept detached from the graph.
"""
from typing import Any, Dict, List

import torch
from labml import logger
from labml.internal.tracker import tracker_singleton
from labml.internal.tracker.indicators import Indicator


class TextIndicator(Indicator):
    """An indicator whose values are strings: the ones added since the last `tracker.save()`, in `values`."""

    def __init__(self, name: str, is_print: bool = False):
        super().__init__(name=name, is_print=is_print, options=None)
        self.values: List[str] = []

    def collect_value(self, value: Any) -> None:
        if not isinstance(value, str):
            raise TypeError(f"indicator {self.name!r} was declared with tracker.set_text and takes strings; it got "
                            f"a {type(value).__name__}")
        self.values.append(value)
        if self.is_print:
            logger.log([(f'{self.name}: ', logger.Text.key), (value, logger.Text.value)])

    def clear(self) -> None:
        self.values = []

    def is_empty(self) -> bool:
        return not self.values

    def copy(self, key: str) -> 'TextIndicator':
        return TextIndicator(key, self.is_print)


def set_text(name: str, is_print: bool = False) -> None:
    """
    Declare the indicator `name` (or a pattern, `'sampled.*'`) as text, so `tracker.add(name, text)` takes strings.

    Args:
        name: the indicator's name, as `tracker.set_scalar` takes it
        is_print: print each text as it is added
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"set_text(name={name!r}) is not accepted: the indicator's name must be a non-empty string")
    if not isinstance(is_print, bool):
        raise TypeError(f"set_text(is_print={is_print!r}) is not accepted: is_print must be a bool (True or False)")
    tracker_singleton().add_indicator(TextIndicator(name, is_print))


class DebugValues:
    """The values `debug(name, value)` collected by name, while `collecting`."""

    def __init__(self):
        self.collecting = False
        self.values: Dict[str, List[Any]] = {}


_debug = DebugValues()


def debug(*args) -> Any:
    """
    `debug(True)` starts collecting (afresh) and `debug(False)` stops; `debug(name, value)` adds `value` under
    `name` while collecting (a tensor detached); `debug(name)` returns the list collected under `name` (empty when
    none).
    """
    if len(args) == 1 and isinstance(args[0], bool):
        if args[0]:
            _debug.values = {}
        _debug.collecting = args[0]
        return None
    if len(args) == 1 and isinstance(args[0], str):
        return list(_debug.values.get(args[0], []))
    if len(args) == 2 and isinstance(args[0], str):
        if _debug.collecting:
            value = args[1].detach() if isinstance(args[1], torch.Tensor) else args[1]
            _debug.values.setdefault(args[0], []).append(value)
        return None
    raise TypeError(f"tracker.debug{args!r} is not accepted: call debug(True) or debug(False), debug(name) or "
                    f"debug(name, value), with name a string")
