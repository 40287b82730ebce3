"""What the follower sends for a run (`ProjectFollower._plan`), with no server: the packets of a first import, a
resumed run in progress again, rewritten steps sent again whole as `read_metrics` reads the file, a damaged
`run.yaml` named. (The reading of the files themselves: `tests/runs/test_run_files.py`.)"""
import json
from pathlib import Path

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard.project_runs import IN_PROGRESS, ProjectFollower, display_name  # noqa: E402
from labml_txl.runs import read_metrics  # noqa: E402
from labml_txl.runs.files import RunFileError, RunFolder  # noqa: E402


def _line(track, t=1.0):
    return json.dumps({'track': track, 'time': t}) + '\n'


def test_the_name_carries_the_comment():
    assert display_name('train_xl', 'attention=alibi mem_len=64') == 'train_xl attention=alibi mem_len=64'
    assert display_name('train_xl', '') == 'train_xl'
    assert display_name('train_xl alibi', 'alibi') == 'train_xl alibi'


def _run(tmp_path: Path) -> RunFolder:
    folder = tmp_path / 'logs' / 'train_xl' / ('a' * 32)
    folder.mkdir(parents=True)
    (folder / 'run.yaml').write_text('name: train_xl\ncomment: mem_len=64\ntags: [xl]\nstart_step: 0\n'
                                     'trial_date: "2024-01-02"\ntrial_time: "03:04:05"\n')
    (folder / 'configs.yaml').write_text('mem_len:\n  computed: 64\n  name: mem_len\n')
    (folder / 'log.jsonl').write_text(_line({'loss.train': [[0, [3.0]], [1, [2.0]]]}, t=100.0))
    (folder / 'run_log.jsonl').write_text(json.dumps({'status': 'completed', 'rank': 0, 'details': None,
                                                      'time': 101.0}) + '\n')
    return RunFolder(folder, folder.name)


def _follower(tmp_path):
    return ProjectFollower(tmp_path, tmp_path / 'data', app=None, token='default', log=lambda line: None)


def _sent(plan):
    """The series of a plan's track packet, as `read_metrics` gives them."""
    (track,) = [p['track'] for p in plan.packets if 'track' in p]
    return {key: list(zip(points['step'], points['value'])) for key, points in sorted(track.items())}


def test_the_packets_of_a_first_import_are_labml_writers(tmp_path):
    run = _run(tmp_path)
    plan = _follower(tmp_path)._plan(run, None, exists=False)
    info, configs, track, status = plan.packets
    assert (info['name'], info['comment'], info['tags']) == ('train_xl mem_len=64', 'mem_len=64', ['xl'])
    assert configs['configs'] == {'mem_len': {'computed': 64, 'name': 'mem_len'}}
    assert track['track'] == {'loss.train': {'step': [0, 1], 'value': [3.0, 2.0]}}
    assert status['status'] == {'rank': 0, 'status': 'completed', 'details': None, 'time': 101.0}
    assert plan.create and not plan.reset and plan.new_loss == {'loss.train'} and plan.last_time == 101.0
    assert plan.entry['log_offset'] == (run.path / 'log.jsonl').stat().st_size


def test_a_resumed_run_is_in_progress_then_completed_and_rewritten_steps_send_all_again(tmp_path):
    run = _run(tmp_path)
    follower = _follower(tmp_path)
    entry = follower._plan(run, None, exists=False).entry
    assert follower._plan(run, entry, exists=True).packets == []  # nothing new

    with open(run.path / 'log.jsonl', 'a') as f:  # resumed at step 2, an hour later
        f.write(_line({'loss.train': [[2, [1.5]]], 'loss.valid': [[2, [1.7]]]}, t=3700.0))
    plan = follower._plan(run, entry, exists=True)
    track, status = plan.packets
    assert track['track'] == {'loss.train': {'step': [2], 'value': [1.5]}, 'loss.valid': {'step': [2], 'value': [1.7]}}
    assert status['status']['status'] == IN_PROGRESS and plan.new_loss == {'loss.valid'} and not plan.reset

    entry = plan.entry
    with open(run.path / 'run_log.jsonl', 'a') as f:
        f.write(json.dumps({'status': 'completed', 'rank': 0, 'details': None, 'time': 3800.0}) + '\n')
    (status,) = follower._plan(run, entry, exists=True).packets
    assert status['status']['status'] == 'completed'

    with open(run.path / 'log.jsonl', 'a') as f:  # resumed again from step 1: step 1 and 2 come again
        f.write(_line({'loss.train': [[1, [9.0]], [2, [8.0]]]}, t=3900.0))
    plan = follower._plan(run, entry, exists=True)
    assert plan.reset and not plan.create and not plan.new_loss
    (track,) = [p for p in plan.packets if 'track' in p]
    assert track['track']['loss.train'] == {'step': [0, 1, 2], 'value': [3.0, 9.0, 8.0]}
    assert track['track']['loss.valid'] == {'step': [2], 'value': [1.7]}
    assert _sent(plan) == read_metrics(run.path)


def test_a_run_resumed_before_its_last_step_is_sent_as_read_metrics_reads_it(tmp_path):
    """Steps 0-9 sent, then a resume from step 3 that has reached step 4: steps 5-9 of the stopped run are gone
    from what is sent, as from `read_metrics`, though the resumed run has not made them again."""
    run = _run(tmp_path)
    (run.path / 'log.jsonl').write_text(_line({'loss.train': [[s, [float(s)]] for s in range(10)],
                                               'loss.valid': [[4, [0.4]], [9, [0.9]]]}))
    follower = _follower(tmp_path)
    entry = follower._plan(run, None, exists=False).entry
    with open(run.path / 'log.jsonl', 'a') as f:
        f.write(_line({'loss.train': [[3, [30.0]], [4, [40.0, 42.0]]], 'loss.valid': [[4, [4.0]]]}, t=2.0))
    plan = follower._plan(run, entry, exists=True)
    assert plan.reset
    assert _sent(plan) == read_metrics(run.path) == {
        'loss.train': [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 41.0)], 'loss.valid': [(4, 4.0)]}
    # new lines that go on from there are sent alone, and add up to what read_metrics reads
    entry = plan.entry
    with open(run.path / 'log.jsonl', 'a') as f:
        f.write(_line({'loss.train': [[5, [50.0]]]}, t=3.0))
    plan = follower._plan(run, entry, exists=True)
    assert not plan.reset and _sent(plan) == {'loss.train': [(5, 50.0)]}
    assert read_metrics(run.path)['loss.train'][-2:] == [(4, 41.0), (5, 50.0)]


def test_a_damaged_run_yaml_is_an_error_naming_it(tmp_path):
    run = _run(tmp_path)
    (run.path / 'run.yaml').write_text('name: [train_xl\n')
    with pytest.raises(RunFileError, match=f'{run.path / "run.yaml"}: not valid YAML'):
        _follower(tmp_path)._plan(run, None, exists=False)
