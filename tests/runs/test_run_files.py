"""
The files of a run folder as both readers read them (`labml_txl.runs.files`): lines still being written wait,
broken lines are skipped with their byte offset, a resumed run's metrics keep the values written last, run folders
are rank 0's, YAML is read as labml writes it and builds no object.
"""
import json

import pytest
from labml.internal import util

from labml_txl.runs.files import (RunFileError, check_metrics_line, experiments_dir, find_run_folders,
                                  load_yaml_mapping, merge_metrics, read_metrics, read_new_lines, run_uuid_of,
                                  trial_time)


def _line(track, t=1.0):
    return json.dumps({'track': track, 'time': t}) + '\n'


def test_a_line_being_written_waits_and_a_broken_line_is_skipped_naming_its_offset(tmp_path):
    path = tmp_path / 'log.jsonl'
    first = _line({'loss.train': [[0, [1.0]]]})
    broken = '{"track": {"loss.train": [[1, [2.0\n'
    shaped_wrong = json.dumps({'track': {'loss.train': [[2, 'x']]}}) + '\n'
    third = _line({'loss.train': [[3, [4.0]]]})
    path.write_text(first + broken + shaped_wrong + third + third[:10])
    got = read_new_lines(path, 0, check_metrics_line)
    assert [r['track']['loss.train'][0][0] for r in got.records] == [0, 3]
    assert got.offset == len(first + broken + shaped_wrong + third)
    assert got.problems[0] == f'{path}: the line at byte {len(first)} is skipped: not JSON (' + \
        got.problems[0].split('not JSON (', 1)[1]
    assert f'the line at byte {len(first + broken)} is skipped: a point of ' in got.problems[1]
    # read whole, the same lines
    assert read_metrics(path) == {'loss.train': [(0, 1.0), (3, 4.0)]}
    with open(path, 'a') as f:
        f.write(third[10:])
    rest = read_new_lines(path, got.offset, check_metrics_line)
    assert [r['track']['loss.train'][0][0] for r in rest.records] == [3] and not rest.problems
    assert rest.offset == path.stat().st_size
    assert read_new_lines(tmp_path / 'missing.jsonl', 0, check_metrics_line).records == []


def test_a_step_is_the_mean_of_its_values_and_the_last_written_wins():
    records = [{'track': {'loss.train': [[1, [1.0, 3.0]], [2, [5.0]]]}},
               {'track': {'loss.train': [[2, [7.0]], [3, []]], 'loss.valid': [[2, [0.5]]]}}]
    assert merge_metrics(records) == {'loss.train': {1: 2.0, 2: 7.0}, 'loss.valid': {2: 0.5}}


def test_a_resumed_block_drops_the_later_steps_however_the_lines_are_read():
    """Steps 0-9, then a resume from step 4 that has reached step 5: steps 6-9 are gone. The same series whether
    the lines are merged at once or a few at a time (as the dashboard follows a file)."""
    lines = [{'track': {'loss.train': [[s, [float(s)]] for s in range(5)]}},
             {'track': {'loss.train': [[s, [float(s)]] for s in range(5, 10)], 'loss.valid': [[9, [1.0]]]}},
             {'track': {'loss.train': [[4, [40.0]], [5, [50.0]]], 'lr': [[4, [0.1]]]}}]
    whole = merge_metrics(lines)
    assert whole == {'loss.train': {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 40.0, 5: 50.0}, 'loss.valid': {9: 1.0},
                     'lr': {4: 0.1}}
    assert merge_metrics(lines[2:], merge_metrics(lines[:2])) == whole


def _merged_by_definition(records):
    """`merge_metrics` as its docstring defines it, line by line with no shortcut: the reference."""
    series = {}
    for record in records:
        for key, points in record['track'].items():
            means = [(int(step), sum(values) / len(values)) for step, values in points if values]
            if means:
                start = min(step for step, _ in means)
                series[key] = {s: v for s, v in series.get(key, {}).items() if s < start}
                series[key].update(means)
    return series


def test_the_merge_is_the_definition_on_logs_with_resumes_and_restarts():
    """Random logs of runs stopped and resumed from earlier steps, several keys, steps written twice, empty values;
    merged at once and a few lines at a time."""
    import random
    rng = random.Random(7)
    for _ in range(50):
        records, step = [], 0
        for _ in range(rng.randrange(1, 30)):
            if rng.random() < 0.2:
                step = rng.randrange(0, step + 1)  # a resume from an earlier checkpoint
            track = {}
            for key in rng.sample(['loss.train', 'loss.valid', 'lr'], rng.randrange(1, 4)):
                steps = range(step, step + rng.randrange(1, 5))
                track[key] = [[s, [rng.random() for _ in range(rng.randrange(0, 3))]] for s in steps]
            step += rng.randrange(0, 5)
            records.append({'track': track})
        split = rng.randrange(len(records) + 1)
        assert merge_metrics(records) == _merged_by_definition(records)
        assert merge_metrics(records[split:], merge_metrics(records[:split])) == _merged_by_definition(records)


def test_reading_a_long_log_is_linear_in_it(tmp_path):
    """The issue's case, smaller: 40,000 steps of 6 keys, one line per 20 steps. Counted, not timed: the merge looks at
    each point a bounded number of times (no scan of the steps already known per line)."""
    path = tmp_path / 'log.jsonl'
    keys = [f'k{i}' for i in range(6)]
    with open(path, 'w') as f:
        for first in range(0, 40_000, 20):
            f.write(json.dumps({'track': {k: [[s, [1.0]] for s in range(first, first + 20)] for k in keys}}) + '\n')

    class Counting(dict):
        """A series' dict that counts how often its steps are iterated over."""
        visits = 0

        def __iter__(self):
            Counting.visits += len(self)
            return super().__iter__()

    series = {k: Counting() for k in keys}
    merge_metrics(read_new_lines(path, 0, check_metrics_line).records, series)
    assert all(len(series[k]) == 40_000 for k in keys)
    # only the first line of each key reads its (empty) known steps
    assert Counting.visits == 0


def test_run_folders_rank_0_stands_for_a_distributed_run(tmp_path):
    logs = tmp_path / 'logs'
    for name in ('exp/aaaa', 'exp/bbbb.0', 'exp/bbbb.1', 'exp/cccc'):
        (logs / name).mkdir(parents=True)
    for name in ('exp/aaaa', 'exp/bbbb.0', 'exp/bbbb.1'):  # cccc has no run.yaml (yet)
        (logs / name / 'run.yaml').write_text('name: exp\n')
    assert sorted((r.uuid, r.path.name) for r in find_run_folders(logs)) == [('aaaa', 'aaaa'), ('bbbb', 'bbbb.0')]
    assert (run_uuid_of('bbbb.0'), run_uuid_of('bbbb.12'), run_uuid_of('aaaa')) == ('bbbb', None, 'aaaa')
    assert experiments_dir(tmp_path) == logs
    (tmp_path / '.labml.yaml').write_text('experiments_path: runs\n')
    assert experiments_dir(tmp_path) == tmp_path / 'runs'
    (tmp_path / '.labml.yaml').write_text('experiments_path: [runs\n')
    with pytest.raises(RunFileError, match='.labml.yaml: not readable as YAML'):
        experiments_dir(tmp_path)


def test_yaml_files_read_as_labml_writes_them_and_damage_names_the_file(tmp_path):
    path = tmp_path / 'configs.yaml'
    # labml's own dump: a tuple is `!!python/tuple`, a type is its string
    written = {'cutoffs': {'computed': (1, 2), 'name': 'cutoffs', 'type': "<class 'tuple'>", 'order': 3}}
    path.write_text(util.yaml_dump(written))
    assert '!!python/tuple' in path.read_text()
    assert load_yaml_mapping(path) == written
    path.write_text('a: [1\n')
    with pytest.raises(RunFileError, match=f'{path}: not valid YAML'):
        load_yaml_mapping(path)
    path.write_text('- 1\n')
    with pytest.raises(RunFileError, match='holds list, not a mapping'):
        load_yaml_mapping(path)
    path.write_text("x: !!python/object/apply:os.system ['true']\n")  # builds no Python object
    with pytest.raises(RunFileError, match='not valid YAML'):
        load_yaml_mapping(path)
    assert load_yaml_mapping(tmp_path / 'none.yaml', missing_ok=True) is None
    with pytest.raises(RunFileError, match='none.yaml: missing'):
        load_yaml_mapping(tmp_path / 'none.yaml')


def test_the_start_run_yaml_records():
    assert trial_time({'trial_date': '2024-01-02', 'trial_time': '03:04:05'}) is not None
    assert trial_time({'trial_date': 'x'}) is None
