"""
Sample text from a trained Transformer-XL run, or a published model, one token at a time with memories.

    python experiments/generate_xl.py RUN_UUID [prompt="ROMEO:"] [n_tokens=500] [temperature=0.8] [top_k=0]
                                               [top_p=0.95] [context=512] [seed=0]
    python experiments/generate_xl.py pretrained=PATH [vocab=PATH] [prompt="The meaning of life is"] [...]

`pretrained=PATH` is a Hugging Face TransfoXL folder (docs/pretrained.md) with its vocabulary: the folder's
`vocab.pkl`, or `vocab=PATH` (Hugging Face's `vocab.pkl`, or the authors' `cache.pkl` / `cache.pt`). A word-level
prompt is split on spaces; words the vocabulary lacks become its unknown symbol.
"""
import sys
from typing import Any, Dict, List

import torch

from labml_txl.cli import parse_overrides, run_script
from labml_txl.xl.generation import check_sampling, generate
from labml_txl.xl.formats.published import read_vocabulary, text_codec, vocabulary_path
from labml_txl.configs.settings import Settings
from labml_txl.train.runs import load_trained_run
from labml_txl.train.script_settings import GenerateXLSettings, read_settings
from labml_txl.xl import MemTransformerLM

SETTINGS = Settings(GenerateXLSettings)
# What `sample_text` takes
SAMPLING = ('prompt', 'n_tokens', 'temperature', 'top_k', 'top_p', 'context', 'seed')


def _sampling(settings: Dict[str, Any], pretrained: bool) -> Dict[str, Any]:
    """The checked sampling settings; `pretrained` and `vocab` only for a published model."""
    given = read_settings(GenerateXLSettings, settings)
    if not pretrained and {'pretrained', 'vocab'} & set(settings):
        raise ValueError("vocab: only for a published model (pretrained=PATH); a run samples its own corpus")
    # (before the model is loaded)
    check_sampling(given.temperature, given.top_k, given.top_p)
    return {key: getattr(given, key) for key in SAMPLING}


def sample_run(run_uuid: str, settings: Dict[str, Any]) -> str:
    sampling = _sampling(settings, pretrained=False)
    conf, _ = load_trained_run(run_uuid)
    return sample_text(conf.model, conf.corpus, **sampling)


def sample_pretrained(settings: Dict[str, Any]) -> str:
    sampling = _sampling(settings, pretrained=True)
    model = MemTransformerLM.from_pretrained(settings['pretrained'])
    vocabulary, cache = read_vocabulary(vocabulary_path(settings['pretrained'], settings.get('vocab')))
    if len(vocabulary) != model.n_token:
        raise ValueError(f"the vocabulary has {len(vocabulary):,} symbols and the model {model.n_token:,}: give the "
                         f"model's own vocabulary with vocab=PATH")
    return sample_text(model, text_codec(vocabulary, cache), **sampling)


def sample_text(model, corpus, prompt: str = '\n', n_tokens: int = 500, temperature: float = 0.8, top_k: int = 0,
                top_p: float = 0.95, context: int = None, seed: int = 0) -> str:
    """`prompt` followed by `n_tokens` sampled tokens, as text."""
    prompt = str(prompt)  # `prompt=1984` on the command line parses as a number
    ids = corpus.encode(prompt).view(-1, 1)
    tokens = generate(model, ids, n_tokens, context=context, temperature=temperature, top_k=top_k, top_p=top_p,
                      generator=torch.Generator().manual_seed(seed))
    # Words are joined by spaces; characters and bytes follow the prompt as they are
    separator = ' ' if corpus.level == 'word' and prompt and not prompt[-1].isspace() else ''
    return prompt + separator + corpus.decode(tokens[:, 0])


def main(argv: List[str]) -> int:
    def action(args: List[str]):
        if args and '=' not in args[0] and not args[0].startswith('-'):
            return print(sample_run(args[0], parse_overrides(args[1:], SETTINGS)))
        settings = parse_overrides(args, SETTINGS)
        if 'pretrained' not in settings:
            raise ValueError("give a RUN_UUID, or pretrained=PATH for a published model (see --help)")
        print(sample_pretrained(settings))

    return run_script(action, argv, __doc__, needs_argument=True, settings=SETTINGS)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
