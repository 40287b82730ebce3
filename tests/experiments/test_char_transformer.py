"""The character Transformer experiment trains: validation loss falls well below the uniform guess."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import char_transformer  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from labml_txl.runs.files import read_metrics  # noqa: E402


def test_short_training_beats_the_uniform_distribution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = char_transformer.Corpus()
    uniform = math.log(len(corpus.chars))
    loss = char_transformer.run({'max_step': 60, 'eval_interval': 1000, 'transformer.n_layers': 1}, corpus=corpus,
                                 screen=False)
    assert loss < uniform - 1.0
    # The run lies in the working directory's project, its metrics kept on disk (no dashboard was up), its
    # comment the override that differs from the script's defaults
    run_path, = (tmp_path / 'logs' / 'char_transformer').iterdir()
    metrics = read_metrics(run_path)
    assert metrics['loss.valid'][-1] == (59, pytest.approx(loss, rel=1e-6))
    assert [step for step, _ in metrics['loss.train']] == list(range(60))
    comment = yaml.safe_load((run_path / 'run.yaml').read_text())['comment']
    assert sorted(comment.split()) == ['eval_interval=1000', 'max_step=60', 'transformer.n_layers=1']


def test_corpus_split_covers_the_bundled_text():
    corpus = char_transformer.Corpus()
    assert len(corpus.train) + len(corpus.valid) == 1115394
    assert len(corpus.chars) == 65
