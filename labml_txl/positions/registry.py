"""
# The positional schemes by name

One line per scheme: its name, its class (a `PositionScheme`, one module of `labml_txl/positions/`) and, for the
original Transformer-XL's types and the schemes that came with their integers, its `attn_type`. The names are the
options of `TransformerConfigs`' attentions (`encoder_attn`, `decoder_attn`, `decoder_mem_attn`; the schemes whose
positions the model gives excepted) and of `TransformerXLConfigs.attention`, and `MemTransformerLM(attn_type=...)`
takes either the name or the integer.
"""
from typing import Callable, Dict, List, Optional, Type, Union

from ..errors import closest
from .absolute import Absolute
from .alibi import Alibi
from .learned_relative import LearnedRelative
from .relative import Relative
from .rotary import Rotary
from .scheme import PositionScheme, SchemeSettings
from .t5_bias import T5Bias

# Name to scheme class, and name to `attn_type` where it has one
SCHEMES: Dict[str, Type[PositionScheme]] = {}
ATTN_TYPES: Dict[str, int] = {}
# Called with each name registered (`labml_txl.configs` adds its options so, whenever the scheme is registered)
LISTENERS: List[Callable[[str], None]] = []


def register(name: str, scheme: Type[PositionScheme], attn_type: Optional[int] = None) -> None:
    """Add the scheme `scheme` under `name` (and its `attn_type`, where it has one): a name of
    `MemTransformerLM(attn_type=...)` and an option of the configs."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name={name!r} is not accepted: a scheme's name is an identifier, e.g. 'distance_penalty'")
    if not (isinstance(scheme, type) and issubclass(scheme, PositionScheme)):
        raise TypeError(f"scheme={scheme!r} is not accepted for {name!r}: a subclass of PositionScheme "
                        f"(labml_txl/positions/scheme.py)")
    if name in SCHEMES or attn_type in ATTN_TYPES.values():
        raise ValueError(f"{name!r} (attn_type={attn_type!r}) is not accepted: a scheme has that name or number "
                         f"already ({describe()})")
    SCHEMES[name] = scheme
    if attn_type is not None:
        ATTN_TYPES[name] = attn_type
    for listener in LISTENERS:
        listener(name)


register('relative', Relative, attn_type=0)
register('learnable', LearnedRelative, attn_type=1)
register('absolute', Absolute, attn_type=2)
register('absolute_deeper', Absolute, attn_type=3)
register('rotary', Rotary, attn_type=4)
register('alibi', Alibi, attn_type=5)
register('t5_bias', T5Bias, attn_type=6)


def describe() -> str:
    """Every name, after its `attn_type` where it has one, for an error message: `0 (relative), ..., 'name'`."""
    return ', '.join(f"{ATTN_TYPES[name]} ({name})" if name in ATTN_TYPES else repr(name) for name in SCHEMES)


def scheme_name(attn_type: Union[int, str]) -> str:
    """The name of the scheme `attn_type` (a name, or the integer of one), or a `ValueError` naming every one."""
    if isinstance(attn_type, str) and attn_type in SCHEMES:
        return attn_type
    if isinstance(attn_type, int) and not isinstance(attn_type, bool):
        for name, number in ATTN_TYPES.items():
            if number == attn_type:
                return name
    hint = closest(attn_type, SCHEMES) if isinstance(attn_type, str) else ''
    raise ValueError(f"attn_type={attn_type!r} is not accepted: {describe()}.{hint}")


def build(name: str, settings: SchemeSettings) -> PositionScheme:
    """A new scheme `name` (for one attention) with `settings`."""
    return SCHEMES[scheme_name(name)].from_settings(settings)
