"""eval_xl.py and generate_xl.py on a run trained here: the numbers a hand-written loop gives, and repeatable text."""
import sys
from pathlib import Path

import pytest
import torch
from labml import lab

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import eval_xl  # noqa: E402
import generate_xl  # noqa: E402
import train_xl  # noqa: E402

OVERRIDES = {'n_layer': 2, 'd_model': 32, 'n_head': 2, 'd_head': 16, 'd_inner': 64, 'tgt_len': 16, 'mem_len': 16,
             'batch_size': 4, 'max_step': 20, 'eval_interval': 20, 'max_eval_steps': 2, 'lr': 0.003}


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory):
    path = tmp_path_factory.mktemp('lab')
    lab.configure({'path': str(path)})
    trainer = train_xl.train(dict(OVERRIDES), writers=set())
    run_uuid = next(path.glob('logs/*/*')).name
    yield run_uuid, trainer
    lab.configure({'path': str(REPO)})


def test_eval_equals_a_hand_written_loop_over_the_split(trained_run):
    run_uuid, trainer = trained_run
    result = eval_xl.evaluate_run(run_uuid, {'split': 'valid', 'tgt_len': 8, 'mem_len': 24, 'batch_size': 3,
                                             'max_steps': 5})
    # The same: the validation stream in 3 columns, segments of 8, the memory of the last 24 positions
    model = trainer.model.eval()
    model.reset_length(8, 0, 24)
    valid = trainer.corpus.valid
    n = valid.numel() // 3
    columns = valid[:n * 3].view(3, n).t()
    losses, mems = [], []
    with torch.no_grad():
        for i in range(0, 40, 8):
            loss, *mems = model(columns[i:i + 8], columns[i + 1:i + 9], *mems)
            losses.append(loss.double().mean().item())
    assert result['loss'] == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    assert result['bpc'] == pytest.approx(result['loss'] / torch.log(torch.tensor(2.0)).item())


def test_generate_starts_with_the_prompt_and_repeats_with_the_seed(trained_run):
    run_uuid, _ = trained_run
    settings = {'prompt': 'ROMEO:', 'n_tokens': 40, 'temperature': 0.9, 'seed': 3}
    text = generate_xl.sample_run(run_uuid, settings)
    assert text.startswith('ROMEO:') and len(text) == len('ROMEO:') + 40
    assert generate_xl.sample_run(run_uuid, settings) == text


def test_unknown_settings_are_named(trained_run):
    run_uuid, _ = trained_run
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['mem_length'\]: eval_xl.py accepts"):
        eval_xl.evaluate_run(run_uuid, {'mem_length': 3})
