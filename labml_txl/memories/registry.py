"""
# The memory mechanisms by name

One line per mechanism: its name and its class (a `MemoryMechanism`, one module of `labml_txl/memories/`). The order
of registration is the order of their states in the flat list of `model(data, target, *mems)`. Every mechanism's
settings are keywords of `MemTransformerLM` and items of `TransformerXLConfigs` (which adds them as each mechanism
is registered, `LISTENERS`).
"""
from typing import Any, Callable, Dict, List, Mapping, Type

from .compressed import CompressedMemory
from .knn import KnnMemory
from .mechanism import MemoryMechanism, Setting
from .recurrent import RecurrentMemoryTokens
from .transformer_xl import TransformerXLMemory

# Name to mechanism class, in the order of registration
MEMORIES: Dict[str, Type[MemoryMechanism]] = {}
# Called with each name registered (`labml_txl.configs.xl` adds its settings so, whenever it is registered)
LISTENERS: List[Callable[[str], None]] = []
# The model's own settings that a mechanism may take as its size
MODEL_SETTINGS = ('mem_len',)


def register(name: str, mechanism: Type[MemoryMechanism]) -> None:
    """Add the memory mechanism `mechanism` under `name`: its settings become keywords of `MemTransformerLM` and
    items of `TransformerXLConfigs`."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name={name!r} is not accepted: a memory mechanism's name is an identifier, e.g. "
                         f"'sliding_summary'")
    if not (isinstance(mechanism, type) and issubclass(mechanism, MemoryMechanism)):
        raise TypeError(f"mechanism={mechanism!r} is not accepted for {name!r}: a subclass of MemoryMechanism "
                        f"(labml_txl/memories/mechanism.py)")
    if name in MEMORIES:
        raise ValueError(f"{name!r} is not accepted: a memory mechanism has that name already "
                         f"({', '.join(map(repr, MEMORIES))})")
    if mechanism.size not in set(mechanism.settings) | set(MODEL_SETTINGS):
        raise ValueError(f"{mechanism.__name__}.size={mechanism.size!r} is not accepted: the name of the setting "
                         f"that turns it on, one of its settings ({', '.join(mechanism.settings) or 'none'}) or "
                         f"the model's {', '.join(MODEL_SETTINGS)}")
    taken = {setting: other for other, cls in MEMORIES.items() for setting in cls.settings}
    clashes = sorted(set(mechanism.settings) & (set(taken) | set(MODEL_SETTINGS)))
    if clashes:
        owners = ', '.join(f"{setting}: {taken.get(setting, 'the model')}" for setting in clashes)
        raise ValueError(f"the settings {clashes} of {name!r} are not accepted: a mechanism or the model has them "
                         f"already ({owners})")
    attributes = {cls.attribute: other for other, cls in MEMORIES.items()}
    if not mechanism.attribute.isidentifier() or mechanism.attribute in attributes:
        raise ValueError(f"{mechanism.__name__}.attribute={mechanism.attribute!r} is not accepted: an identifier "
                         f"no other mechanism has ({', '.join(map(repr, attributes))})")
    MEMORIES[name] = mechanism
    for listener in LISTENERS:
        listener(name)


register('transformer_xl', TransformerXLMemory)
register('compressed', CompressedMemory)
register('recurrent', RecurrentMemoryTokens)
register('knn', KnnMemory)


def settings() -> Dict[str, Setting]:
    """Every registered mechanism's settings, by keyword."""
    return {name: setting for cls in MEMORIES.values() for name, setting in cls.settings.items()}


def with_defaults(given: Mapping[str, Any]) -> Dict[str, Any]:
    """Every mechanism's settings, `given` or their defaults; a `TypeError` naming an unknown one."""
    known = settings()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"MemTransformerLM got unexpected keyword arguments {unknown}: the memory mechanisms' "
                        f"settings are {', '.join(known)} (labml_txl/memories/registry.py)")
    return {name: given.get(name, setting.default) for name, setting in known.items()}
