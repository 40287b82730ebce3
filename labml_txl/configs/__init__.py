"""
Configurations in labml's manner: every `@option`, `calculate` and `aggregate` an experiment can choose by name.

`from labml_txl.configs import TransformerConfigs` is the public path, the one labml_nn's scripts use.
"""
from .transformer import FeedForwardConfigs, TransformerConfigs
from .xl import TransformerXLConfigs

__all__ = ['FeedForwardConfigs', 'TransformerConfigs', 'TransformerXLConfigs']
