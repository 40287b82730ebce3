"""The character Transformer experiment trains: validation loss falls well below the uniform guess."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import char_transformer  # noqa: E402


def test_short_training_beats_the_uniform_distribution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = char_transformer.Corpus()
    uniform = math.log(len(corpus.chars))
    loss = char_transformer.run({'steps': 60, 'eval_every': 1000, 'transformer.n_layers': 1}, corpus=corpus)
    assert loss < uniform - 1.0


def test_corpus_split_covers_the_bundled_text():
    corpus = char_transformer.Corpus()
    assert len(corpus.train) + len(corpus.valid) == 1115394
    assert len(corpus.chars) == 65
