"""
Sample text from a trained Transformer-XL run, one token at a time with memories.

    python experiments/generate_xl.py RUN_UUID [prompt="ROMEO:"] [n_tokens=500] [temperature=0.8] [top_k=0]
                                               [top_p=0.95] [context=512] [seed=0]
"""
import sys
from typing import Any, Dict, List

import torch

from labml_txl.cli import parse_overrides, run_script
from labml_txl.generation import generate
from labml_txl.train.runs import load_trained_run

SETTINGS = ('prompt', 'n_tokens', 'temperature', 'top_k', 'top_p', 'context', 'seed')


def sample_run(run_uuid: str, settings: Dict[str, Any]) -> str:
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}: generate_xl.py accepts {', '.join(SETTINGS)}")
    conf, _ = load_trained_run(run_uuid)
    return sample_text(conf.model, conf.corpus, **settings)


def sample_text(model, corpus, prompt: str = '\n', n_tokens: int = 500, temperature: float = 0.8, top_k: int = 0,
                top_p: float = 0.95, context: int = None, seed: int = 0) -> str:
    """`prompt` followed by `n_tokens` sampled tokens, as text."""
    prompt = str(prompt)  # `prompt=1984` on the command line parses as a number
    ids = corpus.encode(prompt).view(-1, 1)
    tokens = generate(model, ids, n_tokens, context=context, temperature=temperature, top_k=top_k, top_p=top_p,
                      generator=torch.Generator().manual_seed(seed))
    return prompt + corpus.decode(tokens[:, 0])


def main(argv: List[str]) -> int:
    return run_script(lambda args: print(sample_run(args[0], parse_overrides(args[1:]))), argv, __doc__,
                      needs_argument=True)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
