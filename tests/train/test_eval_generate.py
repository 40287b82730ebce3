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
    trainer = train_xl.train(dict(OVERRIDES), screen=False)
    run_uuid = next(path.glob('logs/*/*')).name
    yield run_uuid, trainer, path
    lab.configure({'path': str(REPO)})


@pytest.fixture(autouse=True)
def _in_the_project_of_the_trained_run(trained_run):
    # (the conftest lets every test choose its project again; these find the module's run in its own)
    lab.configure({'path': str(trained_run[2])})


def test_eval_equals_a_hand_written_loop_over_the_split(trained_run):
    run_uuid, trainer, _ = trained_run
    result = eval_xl.evaluate_run(run_uuid, {'split': 'valid', 'tgt_len': 8, 'mem_len': 24, 'batch_size': 3,
                                             'max_eval_steps': 5})
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
    run_uuid, _, _ = trained_run
    settings = {'prompt': 'ROMEO:', 'n_tokens': 40, 'temperature': 0.9, 'seed': 3}
    text = generate_xl.sample_run(run_uuid, settings)
    assert text.startswith('ROMEO:') and len(text) == len('ROMEO:') + 40
    assert generate_xl.sample_run(run_uuid, settings) == text


def test_unknown_settings_are_named_with_the_closest(trained_run):
    run_uuid, _, _ = trained_run
    with pytest.raises(KeyError, match=r"unknown config key 'memlen'.*Did you mean 'mem_len'"):
        eval_xl.evaluate_run(run_uuid, {'memlen': 3})
    with pytest.raises(KeyError, match=r"unknown config key 'temprature'.*Did you mean 'temperature'"):
        generate_xl.sample_run(run_uuid, {'temprature': 3})


@pytest.mark.parametrize('settings, message', [
    ({'same_length': 'maybe'}, r"same_length='maybe' is not accepted: EvalXLSettings.same_length takes a bool"),
    ({'clamp_len': 1.5}, r"clamp_len=1.5 is not accepted: EvalXLSettings.clamp_len takes an integer"),
    ({'split': 'dev'}, r"split='dev' is not accepted: train, valid, test"),
    ({'vocab': 'v.pkl'}, r"vocab: only for a published model"),
    # issue 38: -5 was evaluated as the whole split, and 0 sequences per batch was refused naming an internal `bsz`
    ({'max_eval_steps': -5}, r"max_eval_steps=-5 is not accepted: the number of segments evaluated, or -1 \(or 0\)"),
    ({'batch_size': 0}, r"batch_size=0 is not accepted: batch_size must be a positive integer"),
])
def test_evaluation_settings_are_checked_before_loading(trained_run, settings, message):
    run_uuid, _, _ = trained_run
    with pytest.raises((TypeError, ValueError), match=message):
        eval_xl.evaluate_run(run_uuid, settings)


def test_paper_settings_on_a_run_without_a_preset_are_an_error_naming_them(trained_run, capsys):
    # The run trained with mem_len=16 and no preset: its test_mem_len is the default 0, which nobody chose
    run_uuid, _, _ = trained_run
    with pytest.raises(ValueError, match=r"paper=True takes the paper's test settings \(test_tgt_len, test_mem_len, "
                                         r"test_clamp_len, test_same_length\).*it trained with tgt_len=16 mem_len=16"):
        eval_xl.evaluate_run(run_uuid, {'paper': True})
    assert eval_xl.main([run_uuid, 'paper=True']) == 2
    assert 'error: paper=True' in capsys.readouterr().err


def test_paper_settings_are_the_runs_test_items_where_it_set_them(tmp_path):
    # A run that set its own test_* items is evaluated with them by paper=True: equal to giving them by hand
    lab.configure({'path': str(tmp_path)})
    try:
        train_xl.train(dict(OVERRIDES, max_step=2, test_mem_len=32, test_tgt_len=8), screen=False)
        run_uuid = next(tmp_path.glob('logs/*/*')).name
        paper = eval_xl.evaluate_run(run_uuid, {'paper': True, 'split': 'valid', 'max_eval_steps': 3})
        by_hand = eval_xl.evaluate_run(run_uuid, {'split': 'valid', 'max_eval_steps': 3, 'tgt_len': 8, 'mem_len': 32,
                                                  'clamp_len': -1, 'same_length': False})
        assert paper == by_hand
        trained = eval_xl.evaluate_run(run_uuid, {'split': 'valid', 'max_eval_steps': 3})
        assert trained != paper
    finally:
        lab.configure({'path': str(REPO)})


def test_same_length_without_memory_is_refused_before_evaluating(trained_run, capsys):
    # Every key would be masked: the constructor refuses it, and so does an evaluation (it once gave a loss)
    run_uuid, _, _ = trained_run
    with pytest.raises(ValueError, match=r"same_length=True is not accepted with mem_len=0"):
        eval_xl.evaluate_run(run_uuid, {'same_length': True, 'mem_len': 0, 'split': 'valid', 'max_eval_steps': 1})
    assert eval_xl.main([run_uuid, 'same_length=True', 'mem_len=0']) == 2
    assert 'error: same_length=True is not accepted with mem_len=0' in capsys.readouterr().err


@pytest.mark.parametrize('argument, message', [
    ('temperature=nan', r"temperature='nan' is not accepted: GenerateXLSettings.temperature takes a number"),
    ('top_p=abc', r"top_p='abc' is not accepted: GenerateXLSettings.top_p takes a number"),
    ('top_k=1.5', r"top_k=1.5 is not accepted: GenerateXLSettings.top_k takes an integer"),
    ('top_p=0', r"top_p=0.0 is not accepted: it must be in \(0, 1\]"),
    ('temperature=-1', r"temperature=-1.0 is not accepted: it must be above 0"),
])
def test_sampling_settings_are_refused_with_one_line(trained_run, capsys, argument, message):
    import re
    run_uuid, _, _ = trained_run
    assert generate_xl.main([run_uuid, argument, 'n_tokens=3']) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count('\n') == 1 and 'Traceback' not in err, err


def test_a_tiny_temperature_samples_the_most_likely_token(trained_run):
    # At T = 1e-40, log p / T is -inf for every token in float32 (there was no distribution to sample); the
    # distribution tends to greedy decoding, which is what it gives now
    run_uuid, _, _ = trained_run
    cold = generate_xl.sample_run(run_uuid, {'prompt': 'ROMEO:', 'n_tokens': 20, 'temperature': 1e-40, 'top_p': 1.0})
    greedy = generate_xl.sample_run(run_uuid, {'prompt': 'ROMEO:', 'n_tokens': 20, 'top_k': 1, 'top_p': 1.0})
    assert cold == greedy


def test_sampling_settings_are_checked_before_the_run_is_loaded():
    # A wrong top_p is named even where the run does not exist: nothing is loaded before the settings are checked
    with pytest.raises(ValueError, match=r"top_p=0.0 is not accepted"):
        generate_xl.sample_run('no-such-run', {'top_p': 0.0})


def test_a_dashboard_address_set_for_an_evaluation_is_not_ignored_in_silence(trained_run, monkeypatch, capsys):
    """Evaluation makes no labml run, so it cannot report live: with an address set, it says so (docs/dashboard.md)."""
    run_uuid, _, path = trained_run
    monkeypatch.setenv('labml_app_url', 'http://127.0.0.1:9/api/v1/default')
    lab.configure({'path': str(path)})  # (labml reads the environment when its lab is configured)
    eval_xl.evaluate_run(run_uuid, {'split': 'valid', 'max_eval_steps': 1})
    assert 'nothing of this is reported to it' in capsys.readouterr().err
    monkeypatch.delenv('labml_app_url')
    lab.configure({'path': str(path)})
    eval_xl.evaluate_run(run_uuid, {'split': 'valid', 'max_eval_steps': 1})
    assert 'reported to it' not in capsys.readouterr().err
