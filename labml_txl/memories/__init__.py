"""
# Memory mechanisms

What a layer of Transformer-XL's recurrence remembers of the segments before: one module per mechanism, each a
`MemoryMechanism` (`mechanism.py`: the contract), registered by name in `registry.py`. See `docs/memories.md`.
"""
from .mechanism import MemoryMechanism, ModelSizes, Segment, Setting, State

__all__ = ['MemoryMechanism', 'ModelSizes', 'Segment', 'Setting', 'State']
