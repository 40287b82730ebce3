"""
Reading run folders (`labml_txl.runs.records`): metrics across a resume, statuses, and the resolved configs of a
trained run against the `configs.yaml` labml wrote for it.
"""
import json
import shutil
import time

import pytest
import yaml

from labml_txl.configs.validation import resolved
from labml_txl.file_lock import FileLock
from labml_txl.runs import differing_items, load_runs, read_metrics, read_run, records
from labml_txl.runs.tables import runs_table
from labml_txl.train.runs import LOCK_FILE

from configs_yaml import assert_matches_configs_yaml


def _block(key_points):
    return json.dumps({'track': {key: [[step, values] for step, values in points]
                                 for key, points in key_points.items()}, 'time': time.time()})


def test_a_resumed_block_replaces_the_steps_from_where_it_starts(tmp_path):
    # a step with several values: their mean
    first = {'loss.train': [(s, [10.0 + s] if s != 2 else [1.0, 2.0, 6.0]) for s in range(10)],
             'loss.valid': [(4, [50.0]), (9, [59.0])]}
    # flushed later by the same process
    second = {'loss.train': [(10, [20.0])], 'loss.valid': [(11, [61.0])]}
    # resumed from the checkpoint of step 6, and stopped at step 8: steps 6.. of the first process are gone, 9 and
    # 10 of them too (they were never trained again); loss.valid starts at 8, so its step 9 and 11 are gone
    resumed = {'loss.train': [(s, [20.0 + s]) for s in range(6, 9)], 'loss.valid': [(8, [80.0])],
               'lr': [(6, [0.5])]}
    (tmp_path / 'log.jsonl').write_text('\n'.join([_block(first), _block(second), _block(resumed)])
                                        + '\n{"track": {"loss.train": [[9, [')  # a line being written
    metrics = read_metrics(tmp_path)
    assert metrics['loss.train'] == [(0, 10.0), (1, 11.0), (2, 3.0)] + [(s, 10.0 + s) for s in range(3, 6)] \
        + [(s, 20.0 + s) for s in range(6, 9)]
    assert metrics['loss.valid'] == [(4, 50.0), (8, 80.0)]
    assert metrics['lr'] == [(6, 0.5)]
    assert read_metrics(tmp_path / 'log.jsonl') == metrics


def test_a_block_that_starts_a_metric_later_keeps_its_earlier_steps(tmp_path):
    first = {'loss.train': [(s, [1.0]) for s in range(5)], 'loss.valid': [(4, [4.0])]}
    resumed = {'loss.train': [(3, [2.0]), (4, [2.0]), (5, [2.0])], 'loss.valid': [(5, [5.0])]}
    (tmp_path / 'log.jsonl').write_text(_block(first) + '\n' + _block(resumed) + '\n')
    metrics = read_metrics(tmp_path)
    assert metrics['loss.train'] == [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0)]
    assert metrics['loss.valid'] == [(4, 4.0), (5, 5.0)]


def test_the_list_shows_a_resumed_run_by_the_values_written_last(runs, tmp_path):
    copy = tmp_path / 'logs' / 'train_xl' / 'resumed'
    shutil.copytree(runs.path['alibi16'], copy)
    with open(copy / 'log.jsonl', 'a') as f:
        f.write(_block({'loss.train': [(15, [1.5]), (16, [1.25])], 'loss.valid': [(16, [1.125])]}) + '\n')
    record = read_run(copy)
    assert record.last_step('loss.train') == 16 and record.last('loss.train') == 1.25
    assert record.last('loss.valid') == 1.125
    # min loss.valid: the first process's step 9, kept, against the resumed 16
    assert record.best('loss.valid') == 1.125
    line = runs_table([record], full=True).split('\n')[2].split()
    assert line[:6] == ['resumed', 'train_xl', 'completed', '16', '1.2500', '1.1250']


def _copy(runs, tmp_path, name):
    copy = tmp_path / 'logs' / 'train_xl' / name
    shutil.copytree(runs.path['alibi16'], copy)
    return copy


def test_statuses(runs, tmp_path):
    completed = _copy(runs, tmp_path, 'completed')
    assert read_run(completed).status == 'completed'

    interrupted = _copy(runs, tmp_path, 'interrupted')
    with open(interrupted / 'run_log.jsonl', 'a') as f:
        f.write(json.dumps({'status': 'interrupted', 'details': 'SIGINT', 'time': time.time() + 5}) + '\n')
    record = read_run(interrupted)
    assert (record.status, record.status_details) == ('interrupted', 'SIGINT')

    never_ended = _copy(runs, tmp_path, 'never_ended')
    (never_ended / 'run_log.jsonl').unlink()
    assert read_run(never_ended).status == 'unfinished'

    # started again (a resume writes run.yaml) after its last status line, and not running: it never ended
    restarted = _copy(runs, tmp_path, 'restarted')
    info = yaml.safe_load((restarted / 'run.yaml').read_text())
    later = time.localtime(time.time() + 120)
    info.update(trial_date=time.strftime('%Y-%m-%d', later), trial_time=time.strftime('%H:%M:%S', later))
    (restarted / 'run.yaml').write_text(yaml.safe_dump(info))
    assert read_run(restarted).status == 'unfinished'

    statuses = {r.uuid: r.status for r in load_runs(tmp_path)}
    assert statuses == {'completed': 'completed', 'interrupted': 'interrupted', 'never_ended': 'unfinished',
                        'restarted': 'unfinished'}


def test_runs_are_listed_first_started_first(runs, tmp_path):
    for name, minutes in (('b-first', -20), ('a-second', -10)):
        copy = _copy(runs, tmp_path, name)
        info = yaml.safe_load((copy / 'run.yaml').read_text())
        started = time.localtime(time.time() + 60 * minutes)
        info.update(trial_date=time.strftime('%Y-%m-%d', started), trial_time=time.strftime('%H:%M:%S', started))
        (copy / 'run.yaml').write_text(yaml.safe_dump(info))
    listed = load_runs(tmp_path)
    assert [r.uuid for r in listed] == ['b-first', 'a-second']
    # their ages, since their starts
    assert [line.split()[6:8] for line in runs_table(listed).split('\n')[2:]] == [['20', 'min'], ['10', 'min']]


def test_a_run_deleted_while_the_project_is_read_is_left_out(runs, tmp_path, monkeypatch):
    for name in ('kept-a', 'deleted', 'kept-b'):
        _copy(runs, tmp_path, name)
    listed_folders = records.find_run_folders

    def listed_then_one_deleted(experiments):
        folders = listed_folders(experiments)
        shutil.rmtree(tmp_path / 'logs' / 'train_xl' / 'deleted')  # after it was listed, before it is read
        return folders

    monkeypatch.setattr(records, 'find_run_folders', listed_then_one_deleted)
    assert sorted(r.uuid for r in load_runs(tmp_path)) == ['kept-a', 'kept-b']


def test_a_folder_whose_run_yaml_is_there_but_unreadable_still_fails_the_list(runs, tmp_path, monkeypatch):
    """Only a run that went away is left out: a read that fails for another reason is not hidden."""
    _copy(runs, tmp_path, 'kept')

    def refused(path):
        raise records.RunLookupError(f'{path}: broken')

    monkeypatch.setattr(records, 'read_run', refused)
    with pytest.raises(records.RunLookupError, match='kept: broken'):
        load_runs(tmp_path)


def test_a_run_whose_lock_is_held_is_running(runs, tmp_path, monkeypatch):
    run = _copy(runs, tmp_path, 'training')
    lock = FileLock(run / LOCK_FILE)
    assert lock.acquire()
    try:
        assert read_run(run).status == 'running'
        # where /proc/locks cannot say, an instant's shared lock does
        monkeypatch.setattr(records, '_listed_in_proc_locks', lambda stat: False)
        assert read_run(run).status == 'running'
    finally:
        lock.release()
    assert read_run(run).status == 'completed'
    assert not records.lock_is_held(run / LOCK_FILE)


def test_the_start_time_of_a_run_is_that_of_its_uuid(runs):
    record = read_run(runs.path['alibi16'])
    assert record.started == records.uuid_time(runs.uuid['alibi16'])
    trainer_started = runs.path['alibi16'].joinpath('overrides.json').stat().st_mtime
    assert abs(record.started - trainer_started) < 30
    # a UUID that is not time-based: the start run.yaml records
    assert records.uuid_time('finished') is None


def test_resolved_configs_of_the_trained_conf_equal_its_configs_yaml(runs):
    conf = runs.trainer['alibi0'].conf
    items = resolved(conf)
    written = yaml.safe_load((runs.path['alibi0'] / 'configs.yaml').read_text())
    assert_matches_configs_yaml(items, written)
    assert items['attention'].value == 'alibi' and items['attention'].overridden
    assert items['model'].value == 'default' and not items['model'].overridden
    assert items['optimizer'].value == 'adam'


def test_differing_items_of_the_library(runs):
    keys = ['alibi16', 'relative16', 'alibi0']
    recs = [read_run(runs.path[k]) for k in keys]
    chosen = differing_items(recs, overridden_only=True)
    assert list(chosen) == ['attention', 'mem_len']
    assert [item.value for item in chosen['attention']] == ['alibi', 'relative', 'alibi']
    assert [item.value for item in chosen['mem_len']] == [16, 16, 0]
    every = differing_items(recs)
    assert 'attn_type' in every and 'model' not in every and 'd_model' not in every
    assert differing_items(recs[:1]) == {}
    assert 'n_layer' not in every
