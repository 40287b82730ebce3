"""
# The settings of evaluation and sampling

`experiments/eval_xl.py` and `experiments/generate_xl.py` take their settings as `key=value` like training does.
They are written here as configs, so each is checked by type when given (`ValidatedConfigs`: `same_length=maybe`
is an error, not a true value), and `--help` and `docs/options.md` describe them from the same place as the
training items. A length left at `None` is the run's own (or the paper's, with `paper=True`).
"""
from typing import Any, Dict, Optional

from ..configs.validation import ValidatedConfigs


class EvalXLSettings(ValidatedConfigs):
    """What `eval_xl.py` evaluates, and with which lengths."""
    # The split to evaluate: 'train', 'valid' or 'test'
    split: str = 'test'
    # Segment length (None: the run's `tgt_len`, or the paper's test setting with `paper=True`)
    tgt_len: Optional[int] = None
    # Memory length (None: the run's `mem_len`, or the paper's)
    mem_len: Optional[int] = None
    # Clamp of relative distances (None: the run's `clamp_len`, or the paper's)
    clamp_len: Optional[int] = None
    # Every query attends to the same number of keys (None: the run's `same_length`, or the paper's)
    same_length: Optional[bool] = None
    # Sequences per batch (None: 10, or the paper's)
    batch_size: Optional[int] = None
    # Segments evaluated (-1: all of the split)
    max_eval_steps: int = -1
    # The paper's test settings: a run's preset `test_*` items, or a published model's (`published_models.py`)
    paper: bool = False
    # A Hugging Face TransfoXL folder to evaluate instead of a run
    pretrained: Optional[str] = None
    # The published model's vocabulary (`vocab.pkl`, or the authors' `cache.pkl` / `cache.pt`)
    vocab: Optional[str] = None
    # The corpus a published model is evaluated on (a name of `labml_txl.data.get_corpus`)
    corpus_name: Optional[str] = None
    # The corpus's file or folder (none: the splits of the authors' cache)
    data_path: Optional[str] = None


class GenerateXLSettings(ValidatedConfigs):
    """What `generate_xl.py` samples, and how."""
    # The text the sample continues
    prompt: str = '\n'
    # Tokens sampled after the prompt
    n_tokens: int = 500
    # Softmax temperature (lower: more likely tokens)
    temperature: float = 0.8
    # Sample among the `top_k` most likely tokens only (0: all)
    top_k: int = 0
    # Sample among the most likely tokens whose probabilities sum to `top_p` (1: all)
    top_p: float = 0.95
    # Tokens of context kept (memory plus segment); None: the model's `mem_len + tgt_len`
    context: Optional[int] = None
    # Random seed of the sampling
    seed: int = 0
    # A Hugging Face TransfoXL folder to sample instead of a run
    pretrained: Optional[str] = None
    # The published model's vocabulary (`vocab.pkl`, or the authors' `cache.pkl` / `cache.pt`)
    vocab: Optional[str] = None


def read_settings(settings_class: type, overrides: Dict[str, Any]) -> ValidatedConfigs:
    """An instance of `settings_class` with `overrides` set, each checked by key and type as it is set."""
    settings = settings_class()
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings
