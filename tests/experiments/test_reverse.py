"""The encoder-decoder experiment learns to reverse sequences: exact match above 99% on held-out data."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import reverse  # noqa: E402


def test_reversal_reaches_99_percent_exact_match(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    accuracy = reverse.run({'max_step': 1500, 'target_accuracy': 0.99}, screen=False)
    assert accuracy > 0.99


def test_greedy_decoding_agrees_with_teacher_forcing_on_its_own_output(tmp_path, monkeypatch):
    """Each decoded token is the argmax of the teacher-forced logits given the tokens decoded before it."""
    import torch
    from labml import experiment
    monkeypatch.chdir(tmp_path)
    conf = reverse.ReverseConfigs()
    experiment.create(name='reverse', writers=set())
    experiment.configs(conf, {**reverse.DEFAULT_OVERRIDES, 'seq_len': 7})
    conf.transformer.encoder_decoder.eval()
    src, _ = reverse.sample(conf, 16, torch.Generator().manual_seed(3))
    decoded = reverse.greedy_decode(conf, src)
    with torch.no_grad():
        logits = reverse.teacher_forced_logits(conf, src, decoded)
    assert torch.equal(logits.argmax(dim=-1), decoded)
