"""`key=value` on the command line: booleans are read strictly, so `pre_lnorm=false` trains a post-norm model."""
import sys
from pathlib import Path

import pytest

from labml_txl.cli import parse_overrides, parse_value

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'experiments'))

import train_xl  # noqa: E402


@pytest.mark.parametrize('text, value', [('true', True), ('True', True), ('YES', True), ('yes', True),
                                         ('false', False), ('False', False), ('NO', False), ('no', False),
                                         ('1', 1), ('0', 0), ('None', None), ('128', 128), ('0.5', 0.5),
                                         ('[1, 2]', [1, 2]), ('SwiGLU', 'SwiGLU'), ('flase', 'flase')])
def test_values_are_read_as_booleans_literals_or_strings(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize('word', ['false', 'FALSE', 'no', '0'])
def test_pre_lnorm_false_trains_a_post_norm_model(tmp_path, monkeypatch, word):
    monkeypatch.chdir(tmp_path)
    overrides = parse_overrides(['n_layer=1', 'd_model=16', 'n_head=2', 'd_head=8', 'd_inner=16', 'tgt_len=8',
                                 'mem_len=8', 'batch_size=2', 'max_step=1', 'max_eval_steps=1', f'pre_lnorm={word}'])
    trainer = train_xl.train(overrides, screen=False)
    assert trainer.conf.pre_lnorm is False
    layer = trainer.model.layers[0]
    assert layer.dec_attn.pre_lnorm is False and layer.pos_ff.pre_lnorm is False


def test_a_word_that_is_not_a_boolean_is_an_error_for_a_bool_item(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train_xl.main(['pre_lnorm=flase', 'max_step=1']) == 2
    assert "pre_lnorm='flase' is not accepted: TrainXLConfigs.pre_lnorm takes a bool" in capsys.readouterr().err
