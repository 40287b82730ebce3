r"""
# Paths that moved

On 2026-12-04 the modules moved into folders that show the architecture (`attention/`, `positions/`, `transformer/`,
`fast/`, `configs/`, `dashboard/`, `xl/formats/`), and on 2026-12-07 the compressed memory moved into `memories/`.
Each old path imports for one more release: its file calls `redirect`, which warns with a `DeprecationWarning` that
names the new path and puts the new module in the old one's place, so `from labml_txl.mha import MultiHeadAttention`
gives the very class of `labml_txl.transformer.mha`, and `python -m labml_txl.xl.tf_checkpoint` runs the new module.

`MOVED` is the one list of them: the shims, their test and the README's "What changed" are checked against it.
"""
import importlib
import pkgutil
import runpy
import sys
import warnings
from typing import Any, Dict

MOVED: Dict[str, str] = {
    'labml_txl.attention_heads': 'labml_txl.attention.composite',
    'labml_txl.attention_mask': 'labml_txl.attention.masks',
    'labml_txl.relative_attention': 'labml_txl.attention.reference',
    'labml_txl.config_validation': 'labml_txl.configs.validation',
    'labml_txl.options_doc': 'labml_txl.configs.options_doc',
    'labml_txl.presets': 'labml_txl.configs.presets',
    'labml_txl.settings': 'labml_txl.configs.settings',
    'labml_txl.dashboard_app': 'labml_txl.dashboard',
    'labml_txl.dispatch': 'labml_txl.fast.dispatch',
    'labml_txl.dropout': 'labml_txl.fast.dropout',
    'labml_txl.native': 'labml_txl.fast.native',
    'labml_txl.parameter_versions': 'labml_txl.fast.parameter_versions',
    'labml_txl.prepacked_linear': 'labml_txl.fast.prepacked_linear',
    'labml_txl.alibi_mha': 'labml_txl.positions.alibi',
    'labml_txl.positional_encoding': 'labml_txl.positions.encoding',
    'labml_txl.relative_mha': 'labml_txl.positions.relative',
    'labml_txl.rotary_mha': 'labml_txl.positions.rotary',
    'labml_txl.t5_bias_mha': 'labml_txl.positions.t5_bias',
    'labml_txl.feed_forward': 'labml_txl.transformer.feed_forward',
    'labml_txl.interop': 'labml_txl.transformer.interop',
    'labml_txl.mha': 'labml_txl.transformer.mha',
    'labml_txl.models': 'labml_txl.transformer.models',
    'labml_txl.norms': 'labml_txl.transformer.norms',
    'labml_txl.generation': 'labml_txl.xl.generation',
    'labml_txl.published_models': 'labml_txl.xl.formats.published',
    'labml_txl.xl.hf_format': 'labml_txl.xl.formats.hf',
    'labml_txl.xl.tf_checkpoint': 'labml_txl.xl.formats.tf_checkpoint',
    'labml_txl.xl.compression': 'labml_txl.memories.compression',
    'labml_txl.xl.compressed_memory': 'labml_txl.memories.compressed',
}


def redirect(namespace: Dict[str, Any]) -> None:
    """Called by the module at an old path with its `globals()`: warns, then puts the new module in its place (its
    submodules too, where it is a package, so that none is loaded twice under two names), or, run as `python -m`, runs
    the new module as `__main__`."""
    old = namespace['__spec__'].name
    new = MOVED[old]
    # stacklevel 3: the warning names the line that imported the old path (the import machinery's frames are skipped)
    warnings.warn(f"{old} moved to {new}: import {new} instead; the old path goes away in the next release",
                  DeprecationWarning, stacklevel=3)
    if namespace['__name__'] == '__main__':
        runpy.run_module(new, run_name='__main__', alter_sys=True)
        return
    module = importlib.import_module(new)
    for submodule in pkgutil.iter_modules(getattr(module, '__path__', [])):
        if submodule.name != '__main__':
            sys.modules[f'{old}.{submodule.name}'] = importlib.import_module(f'{new}.{submodule.name}')
    sys.modules[old] = module
