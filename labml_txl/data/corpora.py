"""
# Corpora by name

`get_corpus(name, path, **kwargs)` loads one of the corpora of the Transformer-XL paper, or the bundled Tiny
Shakespeare, by the names the original's `--dataset` flag uses. The keyword arguments are the loader's
(`train_size`, `min_freq`, `vocab_file`, `cache_dir`, ...); a name or keyword it does not know is an error that
says what is accepted.
"""
import difflib
import inspect
from pathlib import Path
from typing import Callable, Dict, Optional, Union

from ..errors import describe_choices
from .corpus import Corpus
from .enwik8 import load_enwik8
from .lm1b import load_lm1b
from .ptb import load_ptb
from .text8 import load_text8
from .tiny_shakespeare import load_tiny_shakespeare_corpus
from .wikitext import load_wt103, load_wt2, load_wikitext

# The loader of each corpus name
CORPORA: Dict[str, Callable[..., Corpus]] = {
    'tiny_shakespeare': load_tiny_shakespeare_corpus,
    'enwik8': load_enwik8,
    'text8': load_text8,
    'wt103': load_wt103,
    'wt2': load_wt2,
    'ptb': load_ptb,
    'lm1b': load_lm1b,
}


def _keywords(name: str) -> list:
    """The keyword arguments the loader of `name` accepts."""
    loader = load_wikitext if name in ('wt103', 'wt2') else CORPORA[name]
    return [p.name for p in inspect.signature(loader).parameters.values()
            if p.kind == p.KEYWORD_ONLY]


def get_corpus(name: str, path: Optional[Union[str, Path]] = None, **kwargs) -> Corpus:
    """
    The corpus `name` read from `path`.

    Args:
        name: `'tiny_shakespeare'`, `'enwik8'`, `'text8'`, `'wt103'`, `'wt2'`, `'ptb'` or `'lm1b'`
        path: the data file or folder (see each loader); optional for `'tiny_shakespeare'`, which is bundled
        kwargs: the loader's keyword arguments
    """
    if name not in CORPORA:
        accepted = list(CORPORA)
        closest = difflib.get_close_matches(str(name), accepted, n=1, cutoff=0.0)
        raise ValueError(f"Unknown corpus name {name!r}: accepted names are {describe_choices(accepted)}; "
                         f"the closest is {closest[0]!r}")
    accepted = _keywords(name)
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise TypeError(f"get_corpus({name!r}) got unknown keyword argument(s) {', '.join(map(repr, unknown))}: "
                        f"the {name} loader accepts {describe_choices(accepted)}")
    if path is None:
        if name != 'tiny_shakespeare':
            raise ValueError(f"get_corpus({name!r}) needs path: the folder or file of the {name} data "
                             f"(see docs/data.md for the published files); only 'tiny_shakespeare' is bundled")
        return CORPORA[name](**kwargs)
    return CORPORA[name](path, **kwargs)
