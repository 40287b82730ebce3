"""
What can be checked before training is checked before the first step, from the command line as a user meets it:
each bad setting exits with code 2 and one `error:` line naming it, and no training step runs.
"""
import re
import sys
from pathlib import Path

import pytest

from labml_txl.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'experiments'))

import demo  # noqa: E402
import train_xl  # noqa: E402

SMALL = ['n_layer=1', 'd_model=16', 'n_head=2', 'd_head=8', 'd_inner=16', 'tgt_len=8', 'mem_len=8', 'batch_size=2',
         'max_step=2', 'eval_interval=1', 'max_eval_steps=1']


@pytest.fixture
def steps(tmp_path, monkeypatch):
    """The training steps taken, in a working directory of this test's own."""
    monkeypatch.chdir(tmp_path)
    taken = []
    train_window = Trainer.train_window

    def counted(self, segments):
        taken.append(self.step)
        return train_window(self, segments)

    monkeypatch.setattr(Trainer, 'train_window', counted)
    return taken


def _small_text(tmp_path: Path, characters: int) -> Path:
    """A text file of `characters` characters."""
    path = tmp_path / 'small.txt'
    path.write_text(('To be, or not to be, that is the question. ' * 1000)[:characters])
    return path


@pytest.mark.parametrize('arguments, message', [
    (['eval_interval=0'], r"eval_interval=0 is not accepted: validation runs every eval_interval steps"),
    (['max_step=abc'], r"max_step='abc' is not accepted: TrainXLConfigs\.max_step takes an integer"),
    (['seed=abc'], r"seed='abc' is not accepted: TrainXLConfigs\.seed takes an integer"),
    (['dropout=1.5'], r"dropout=1\.5 is not accepted: dropout must be a probability in \[0, 1\)"),
    (['checkpoint_interval=-1'], r"checkpoint_interval=-1 is not accepted: checkpoint_interval must be a "
                                 r"non-negative integer"),
    (['time_limit=-5'], r"time_limit=-5\.0 is not accepted: seconds of training, or 0 for no limit"),
    (['pre_lnorm=maybe'], r"pre_lnorm='maybe' is not accepted: TrainXLConfigs\.pre_lnorm takes a bool"),
])
def test_a_bad_setting_is_named_before_the_first_step(steps, capsys, arguments, message):
    assert train_xl.main(SMALL + arguments) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err[-2000:]
    assert 'Traceback' not in err and steps == []


def test_a_data_path_that_is_a_folder_is_named_as_such(steps, capsys, tmp_path):
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'input.txt').write_text('text')
    assert train_xl.main(SMALL + [f'data_path={tmp_path / "data"}']) == 2
    err = capsys.readouterr().err
    assert f"Tiny Shakespeare text file {tmp_path / 'data'} is a folder, not a file" in err
    assert 'input.txt' in err and steps == []


def test_a_validation_split_too_small_for_the_batch_is_found_before_training(steps, capsys, tmp_path):
    # 4,000 characters: 5% each (200 tokens) for validation and test; 120 columns need 240
    data = _small_text(tmp_path, 4000)
    arguments = [a for a in SMALL if not a.startswith('batch_size')] + ['batch_size=120', f'data_path={data}']
    assert train_xl.main(arguments) == 2
    err = capsys.readouterr().err
    assert ("the valid split of tiny_shakespeare has 200 tokens, too few for batch_size=120: evaluation cuts it "
            "into batch_size columns of at least 2 tokens (an input and its target), so it needs at least 240; use "
            "a batch_size of at most 100") in err, err[-2000:]
    assert steps == []


def test_a_test_split_too_small_is_named_too():
    from labml_txl.data import get_corpus
    from labml_txl.train.configs import check_splits_fit
    corpus = get_corpus('tiny_shakespeare')
    check_splits_fit(corpus, 60)
    corpus.test = corpus.test[:100]
    with pytest.raises(ValueError, match=r"the test split of tiny_shakespeare has 100 tokens, too few for "
                                         r"batch_size=60"):
        check_splits_fit(corpus, 60)


def test_the_demo_names_a_port_that_is_not_a_number(capsys, monkeypatch):
    monkeypatch.setattr(demo, 'start_dashboard', lambda port: pytest.fail('the dashboard was started'))
    assert demo.run_script(demo.demo, ['port=abc'], demo.__doc__) == 2
    assert "port='abc' is not accepted: a port number from 1 to 65535" in capsys.readouterr().err
