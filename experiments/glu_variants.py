"""
# GLU variants on Tiny Shakespeare

*GLU Variants Improve Transformer* compares gated feed-forward layers. This trains the character Transformer of
`char_transformer.py` once per variant, with the same seed, data order and time budget, and prints the
validation loss of each:

    python experiments/glu_variants.py time_limit=60 steps=400

Overrides after the script name apply to every run. `d_ff` is scaled by 2/3 for the gated variants, as the
paper does, so every variant has about the same number of parameters.
"""
import math
import sys

from char_transformer import Corpus, run
from labml_txl.cli import parse_overrides

VARIANTS = ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']


def main(argv):
    overrides = parse_overrides(argv)
    d_ff = overrides.pop('transformer.ffn.d_ff', 512)
    corpus = Corpus()
    results = {}
    for variant in VARIANTS:
        gated_d_ff = d_ff if variant == 'none' else d_ff * 2 // 3
        results[variant] = run({**overrides, 'transformer.ffn.glu_variant': variant,
                                'transformer.ffn.d_ff': gated_d_ff}, name=f'glu_{variant}', corpus=corpus)
    print('\n| variant | validation loss (nats/char) | bits/char |\n| --- | --- | --- |')
    for variant, loss in results.items():
        print(f'| {variant} | {loss:.3f} | {loss / math.log(2):.3f} |')


if __name__ == '__main__':
    main(sys.argv[1:])
