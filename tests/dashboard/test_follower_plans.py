"""What the follower sends for a run (`ProjectFollower._plan`), with no server: the packets of a first import, a
resumed run in progress again, rewritten steps sent again whole as `read_metrics` reads the file, a damaged
`run.yaml` named. Its record, `project_runs.json`: a damaged one refused naming it, one damaged while it runs written
again. The order of a scan's work: each run imported once read, a long one last and named. (The reading of the files
themselves: `tests/runs/test_run_files.py`.)"""
import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard import project_runs  # noqa: E402
from labml_txl.dashboard.project_runs import (FOLLOWING, IN_PROGRESS, PROGRESS_FILE, ProjectFollower,  # noqa: E402
                                              display_name)
from labml_txl.runs import read_metrics  # noqa: E402
from labml_txl.runs.files import RunFileError, RunFolder  # noqa: E402


def _line(track, t=1.0):
    return json.dumps({'track': track, 'time': t}) + '\n'


def test_the_name_carries_the_comment():
    assert display_name('train_xl', 'attention=alibi mem_len=64') == 'train_xl attention=alibi mem_len=64'
    assert display_name('train_xl', '') == 'train_xl'
    assert display_name('train_xl alibi', 'alibi') == 'train_xl alibi'


def _run(tmp_path: Path, uuid: str = 'a' * 32) -> RunFolder:
    folder = tmp_path / 'logs' / 'train_xl' / uuid
    folder.mkdir(parents=True)
    (folder / 'run.yaml').write_text('name: train_xl\ncomment: mem_len=64\ntags: [xl]\nstart_step: 0\n'
                                     'trial_date: "2024-01-02"\ntrial_time: "03:04:05"\n')
    (folder / 'configs.yaml').write_text('mem_len:\n  computed: 64\n  name: mem_len\n')
    (folder / 'log.jsonl').write_text(_line({'loss.train': [[0, [3.0]], [1, [2.0]]]}, t=100.0))
    (folder / 'run_log.jsonl').write_text(json.dumps({'status': 'completed', 'rank': 0, 'details': None,
                                                      'time': 101.0}) + '\n')
    return RunFolder(folder, folder.name)


def _follower(tmp_path, log=lambda line: None):
    return ProjectFollower(tmp_path, tmp_path / 'data', app=None, token='default', log=log, grace_seconds=0)


def _sent(plan):
    """The series of a plan's track packet, as `read_metrics` gives them."""
    (track,) = [p['track'] for p in plan.packets if 'track' in p]
    return {key: list(zip(points['step'], points['value'])) for key, points in sorted(track.items())}


@pytest.fixture
def loop():
    """An event loop running in a thread of its own, as the server's loop runs beside the follower's thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _scanning(tmp_path, loop, log):
    """A follower of the project `tmp_path` whose scans run on `loop`, with a store of its own in place of the app's:
    the uuids its imports went to, in their order (the list returned with it)."""
    (tmp_path / 'data').mkdir(exist_ok=True)  # as the server makes it
    follower = _follower(tmp_path, log)
    follower._loop = loop
    imported = []

    async def existing(uuids):
        return {uuid for uuid in uuids if uuid in imported}

    async def apply(plan):
        imported.append(plan.folder.uuid)

    follower._existing, follower._apply = existing, apply
    return follower, imported


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


# -- the follower's record, project_runs.json

FOLLOWED_ENTRY = {'state': 'following', 'folder': '/p/logs/train_xl/' + 'a' * 32, 'log_offset': 120,
                  'status_offset': 64, 'configs_signature': [1700000000000000000, 40], 'last_steps': {'loss.train': 1},
                  'status': ['completed', 101.0], 'last_time': 101.0, 'pending': False}


def _record(version=1, **entry):
    """The text of a record of one followed run, `entry` changing its fields (None: without the field)."""
    changed = {key: value for key, value in {**FOLLOWED_ENTRY, **entry}.items() if value is not None}
    return json.dumps({'version': version, 'runs': {'a' * 32: changed}}, indent=1)


def test_a_whole_record_is_read_back(tmp_path):
    runs = {'a' * 32: FOLLOWED_ENTRY, 'b' * 32: {'state': 'reported live', 'folder': '/p/logs/x/' + 'b' * 32},
            'c' * 32: {**FOLLOWED_ENTRY, 'state': 'deleted on the dashboard', 'pending': True, 'status': None}}
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / PROGRESS_FILE).write_text(json.dumps({'version': 1, 'runs': runs}))
    assert _follower(tmp_path).runs == runs


@pytest.mark.parametrize('text, wrong', [
    ('{"version": 1, "runs": {"' + 'a' * 32 + '": {"state": "following",, }}}', 'not JSON: Expecting property name'),
    (_record()[:200], 'not JSON: '),  # cut short
    ('', 'not JSON: Expecting value: line 1 column 1 (char 0)'),  # emptied by a full disk
    (b'{"version": 1, "runs": {"\xff": {}}}', 'not UTF-8 text'),
    ('[1, 2]', '[1, 2], where the record is a JSON object'),
    (_record(version=2), '"version" is 2, where it is 1'),
    ('{"runs": {}}', '"version" is missing'),
    ('{"version": 1, "runs": []}', '"runs" is [], where it is a JSON object of the runs by uuid'),
    (json.dumps({'version': 1, 'runs': {'a' * 32: 'following'}}),
     'run ' + 'a' * 32 + ': "following", where a run\'s entry is a JSON object'),
    (_record(state='followed'), '"state" is "followed", where it is "following", "reported live" or '
                                '"deleted on the dashboard"'),
    (_record(log_offset='120'), 'run ' + 'a' * 32 + ': "log_offset" is "120", where it is a byte offset'),
    (_record(status_offset=-1), '"status_offset" is -1, where it is a byte offset'),
    (_record(last_steps=None), 'run ' + 'a' * 32 + ': "last_steps" is missing'),
    (_record(last_steps=[1]), '"last_steps" is [1], where it is an object of each series\' last step sent'),
    (_record(last_steps={'loss.train': '1'}), '"last_steps" is {"loss.train": "1"}, where it is an object'),
    (_record(status=['completed']), '"status" is ["completed"], where it is null or [status, time]'),
    (_record(configs_signature='x'), '"configs_signature" is "x", where it is null or [mtime_ns, size]'),
    (_record(last_time='late'), '"last_time" is "late", where it is null or a time in seconds'),
    (_record(pending=0), '"pending" is 0, where it is true or false'),
    (_record(folder=7), '"folder" is 7, where it is the run\'s folder'),
])
def test_a_damaged_record_is_refused_naming_it_what_is_wrong_and_what_to_do(tmp_path, text, wrong):
    """Starting with no record would take every run in the store for one reported live, and follow none of them."""
    path = tmp_path / 'data' / PROGRESS_FILE
    path.parent.mkdir()
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    with pytest.raises(ValueError) as refused:
        _follower(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"the store file {str(path)!r} is damaged ("), message
    assert wrong in message.split(' is damaged (', 1)[1], message
    assert 'restore it from a copy of the data directory; or delete it' in message, message
    assert 'no longer followed' in message and '\n' not in message, message
    assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())  # left as it was


def _cut_short(path: Path) -> None:
    path.write_text(path.read_text()[:40])


@pytest.mark.parametrize('damage, change', [(_cut_short, 'damaged (not JSON: '), (Path.unlink, 'deleted'),
                                            (lambda path: path.write_text(_record()), 'edited')])
def test_a_record_changed_while_the_dashboard_runs_is_written_again_at_the_next_scan(tmp_path, loop, damage, change):
    """Left damaged, it would stop the next start (or, deleted, lose the runs it follows): the next scan writes
    what the follower holds, saying so, though it has nothing new to import."""
    lines = []
    follower, imported = _scanning(tmp_path, loop, lines.append)
    run = _run(tmp_path)
    follower.scan_once()
    assert imported == [run.uuid]
    path = tmp_path / 'data' / PROGRESS_FILE
    written = json.loads(path.read_text())
    assert written['runs'][run.uuid]['state'] == FOLLOWING
    damage(path)
    lines.clear()
    follower.scan_once()
    assert imported == [run.uuid]  # nothing new: no import
    assert json.loads(path.read_text()) == written
    (line,) = lines
    assert line.startswith(f'{path} was {change}') and 'written again from what the follower holds' in line, line
    assert _follower(tmp_path).runs == written['runs']


# -- the order of a scan's work

def test_each_run_is_imported_once_read_and_a_long_one_last_named_first(tmp_path, loop, monkeypatch):
    """A long run among short ones: the short ones are imported (and listed as followed) before the long one is read,
    though its folder comes first, and a line names it before its read."""
    long_run = _run(tmp_path, 'a' * 32)
    with open(long_run.path / 'log.jsonl', 'a') as f:
        for step in range(2, 2000):
            f.write(_line({'loss.train': [[step, [1.0 / step]]]}, t=100.0 + step))
    os.utime(long_run.path / 'run.yaml', (1, 1))  # the oldest: first in the project's order
    short_runs = [_run(tmp_path, 'b' * 32), _run(tmp_path, 'c' * 32)]
    long_size = (long_run.path / 'log.jsonl').stat().st_size
    assert all((run.path / 'log.jsonl').stat().st_size < 1000 for run in short_runs) and long_size > 50_000
    monkeypatch.setattr(project_runs, 'LONG_READ_BYTES', 50_000)

    work = []
    follower, imported = _scanning(tmp_path, loop, lambda line: work.append(('line', line)))
    real_read = project_runs.read_new_lines

    def read_and_note(path, offset, check):
        if path.name == 'log.jsonl':
            followed = sorted(uuid for uuid, state in follower.describe()['runs'].items() if state == FOLLOWING)
            work.append(('read', path.parent.name, followed))
        return real_read(path, offset, check)

    monkeypatch.setattr(project_runs, 'read_new_lines', read_and_note)
    follower.scan_once()

    b, c, a = 'b' * 32, 'c' * 32, 'a' * 32
    assert imported == [b, c, a]
    reads = [step for step in work if step[0] == 'read']
    assert reads == [('read', b, []), ('read', c, [b]), ('read', a, [b, c])]
    long_line = (f'run {a}: reading {long_size / 2 ** 20:.1f} MiB of {long_run.path / "log.jsonl"}; '
                 f'it shows once read')
    assert work.index(('line', long_line)) == work.index(reads[-1]) - 1, work
    assert [step for step in work if step[0] == 'line' and 'reading' in step[1]] == [('line', long_line)]
    assert follower.describe()['runs'] == {a: FOLLOWING, b: FOLLOWING, c: FOLLOWING}
