"""
# GLU variants on Tiny Shakespeare

*GLU Variants Improve Transformer* compares gated feed-forward layers. This is a sweep (`labml_txl.sweep`) of
`char_transformer.py` over the variants, with the same seed, data order and time budget; it ends with the
comparison of the runs and a plot of their validation loss:

    python experiments/glu_variants.py time_limit=60 max_step=400

Settings after the script name apply to every run (`char_transformer.py --help` lists them). `d_ff` is scaled by
2/3 for the gated variants, as the paper does, so every variant has about the same number of parameters; so the
sweep is a list of points, not a product. Started again with the same settings, it continues where it stopped.
"""
import sys
from pathlib import Path
from typing import Any, Dict, List

from labml_txl.cli import parse_overrides, run_script
from labml_txl.sweep import run_sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))

import char_transformer  # noqa: E402

VARIANTS = ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']
SETTINGS = char_transformer.SETTINGS
SCRIPT = Path(char_transformer.__file__)


def points(overrides: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One point per variant, `d_ff` scaled by 2/3 for the gated ones."""
    overrides = dict(overrides)
    d_ff = overrides.pop('transformer.ffn.d_ff', char_transformer.DEFAULT_OVERRIDES['transformer.ffn.d_ff'])
    return [{**overrides, 'transformer.ffn.glu_variant': variant,
             'transformer.ffn.d_ff': d_ff if variant == 'none' else d_ff * 2 // 3} for variant in VARIANTS]


def main(args: List[str]) -> int:
    overrides = parse_overrides(args, SETTINGS)
    if 'transformer.ffn.glu_variant' in overrides:
        raise ValueError('transformer.ffn.glu_variant is what this sweep varies: run char_transformer.py for one')
    return run_sweep(SCRIPT, points(overrides)).exit_code


if __name__ == '__main__':
    sys.exit(run_script(main, sys.argv[1:], __doc__, settings=SETTINGS) or 0)
