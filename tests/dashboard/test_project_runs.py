"""The dashboard follows a project's runs: a run trained with no dashboard up is on it once it starts, with the
losses of its `log.jsonl`, its comment and its status; restarts import nothing twice; runs that grow are followed;
damaged files are skipped with a message; runs reported live are left alone; a damaged record of the follower's
stops the start, naming it.

Each test follows its own copy of one tiny `train_xl` run (trained once, with no dashboard), on a fresh data dir.
"""
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard.project_runs import PROGRESS_FILE  # noqa: E402
from labml_txl.runs import read_metrics  # noqa: E402
from .helpers import (TINY_XL, DashboardServer, api, following, free_port, http, listed_runs,  # noqa: E402
                      run_folders, run_training, series, start_refused, train_xl, wait_for_scans, wait_until)
from .test_dashboard_browser import chromium, render  # noqa: E402,F401 (the fixture, and the page's DOM)

# The app keeps each value as float32 (one rounding of the float64 read from the file)
STORED_AS_FLOAT32 = np.finfo(np.float32).eps


@pytest.fixture(scope='session')
def xl_project(tmp_path_factory):
    """A labml project with one tiny train_xl run (30 steps, validated at steps 14 and 29), trained with no
    dashboard; with a compressed memory, so it also reports its reconstruction loss `ar_loss.train`."""
    project = tmp_path_factory.mktemp('xl_project')
    train_xl(project, *TINY_XL, 'max_step=30', 'cmem_len=4', 'compression_rate=4')
    assert len(run_folders(project)) == 1
    return project


def follow(project: Path, data_dir: Path) -> DashboardServer:
    """A dashboard on `data_dir` following `project`, looking at its runs every 0.5 s."""
    return DashboardServer(data_dir, project=project, extra_args=['--scan-seconds', '0.5'])


def copy_of(xl_project: Path, tmp_path: Path) -> Path:
    project = tmp_path / 'project'
    shutil.copytree(xl_project, project)
    return project


def run_of(project: Path):
    """The project's one run: its folder, uuid and `run.yaml`."""
    (folder,) = run_folders(project)
    info = yaml.safe_load((folder / 'run.yaml').read_text())
    assert info['uuid'] == folder.name
    return folder, folder.name, info


def wait_listed(server: DashboardServer, uuid: str, timeout: float = 120):
    """Wait until the follower has imported run `uuid` (the import's request done) and it is on the Runs list."""
    wait_until(f'run {uuid} imported; log:\n{server.log()[-3000:]}',
               lambda: following(server.port)['runs'].get(uuid) == 'following', timeout)
    return wait_until(f'run {uuid} on the Runs list', lambda: listed_runs(server.port).get(uuid), 5)


def assert_series_as_in_file(port: int, uuid: str, folder: Path, keys=('loss.train', 'loss.valid')):
    """The run's series `keys` on the dashboard (its API) are those `python -m labml_txl.runs` reads from its
    `log.jsonl` (`read_metrics`); returns every series shown."""
    in_file = read_metrics(folder)
    shown = series(port, uuid)
    for key in keys:
        steps = [step for step, _ in in_file[key]]
        assert shown[key]['step'] == steps, (key, shown[key]['step'], steps)
        np.testing.assert_allclose(shown[key]['value'], [value for _, value in in_file[key]],
                                   rtol=STORED_AS_FLOAT32, atol=0, err_msg=key)
    return shown


def chart_choices(port: int, uuid: str):
    """`{series name: preference}` of the run's metrics chart (1: shown; -1: not)."""
    names = [s['name'] for s in api('POST', port, f'metrics/{uuid}', {'get_all': False})['series']]
    chosen = api('GET', port, f'metrics/preferences/{uuid}')['series_preferences']
    return dict(zip(names, chosen))


@pytest.fixture(scope='module')
def followed(xl_project, tmp_path_factory):
    """A dashboard started on a fresh data dir after the run was trained, following a copy of its project."""
    project = copy_of(xl_project, tmp_path_factory.mktemp('followed'))
    folder, uuid, info = run_of(project)
    with follow(project, project.parent / 'data') as server:
        wait_listed(server, uuid)
        yield server, folder, uuid, info


def test_a_run_trained_with_no_dashboard_is_listed_with_its_comment_completed(followed):
    server, folder, uuid, info = followed
    listed = listed_runs(server.port)[uuid]
    assert info['comment'] and 'max_step=30' in info['comment'], info
    assert listed['comment'] == info['comment']
    assert listed['name'] == f'train_xl {info["comment"]}'
    assert listed['run_status']['status'] == 'completed'
    started = time.mktime(time.strptime(f"{info['trial_date']} {info['trial_time']}", '%Y-%m-%d %H:%M:%S'))
    assert listed['start_time'] == started
    run = api('GET', server.port, f'run/{uuid}')
    assert run['comment'] == info['comment'] and run['tags'] == info['tags']
    configs = {c['key']: c for c in run['configs']}
    assert configs['d_model']['computed'] == 32 and configs['d_model']['is_explicitly_specified']
    assert configs['max_step']['computed'] == 30
    assert api('GET', server.port, f'run/status/{uuid}')['run_status']['status'] == 'completed'
    assert f'run {uuid} imported from {folder}' in server.log()


def test_its_losses_are_those_of_its_log_jsonl(followed):
    server, folder, uuid, _ = followed
    shown = assert_series_as_in_file(server.port, uuid, folder, keys=('loss.train', 'loss.valid', 'ar_loss.train'))
    assert shown['loss.train']['step'] == list(range(30)) == shown['ar_loss.train']['step']
    # The memory of 16 is full after the first step: from then on every step compresses and trains the compression
    assert all(value > 0 for value in shown['ar_loss.train']['value'][1:])
    assert shown['loss.valid']['step'] == [14, 29]


def test_train_and_valid_loss_are_shown_on_its_chart(followed):
    server, _, uuid, _ = followed
    choices = chart_choices(server.port, uuid)
    assert {name for name, choice in choices.items() if choice == 1} == {'loss.train', 'loss.valid'}, choices
    summary = {s['name']: s['is_summary'] for s in
               api('POST', server.port, f'metrics/{uuid}', {'get_all': False})['series']}
    assert summary['loss.train'] is False and summary['loss.valid'] is False


def test_a_restarted_dashboard_imports_nothing_twice(xl_project, tmp_path):
    project = copy_of(xl_project, tmp_path)
    folder, uuid, _ = run_of(project)
    with follow(project, tmp_path / 'data') as first:
        wait_listed(first, uuid)
        before = series(first.port, uuid)
    progress = json.loads((tmp_path / 'data' / PROGRESS_FILE).read_text())['runs'][uuid]
    assert progress['state'] == 'following' and progress['log_offset'] == (folder / 'log.jsonl').stat().st_size
    with follow(project, tmp_path / 'data') as second:
        wait_for_scans(second)
        assert series(second.port, uuid) == before
        assert list(listed_runs(second.port)) == [uuid]
        assert 'imported' not in second.log()


def test_a_run_that_grows_while_followed_shows_its_new_points(xl_project, tmp_path):
    project = copy_of(xl_project, tmp_path)
    folder, uuid, _ = run_of(project)
    with follow(project, tmp_path / 'data') as server:
        wait_listed(server, uuid)
        train_xl(project, f'resume={uuid}', 'max_step=33')
        wait_until('the resumed steps on the chart',
                   lambda: series(server.port, uuid)['loss.valid']['step'][-1:] == [32], timeout=120)
        shown = assert_series_as_in_file(server.port, uuid, folder)
        assert shown['loss.train']['step'] == list(range(33))
        assert shown['loss.valid']['step'] == [14, 29, 32]
        wait_until('the run completed again',
                   lambda: api('GET', server.port, f'run/status/{uuid}')['run_status']['status'] == 'completed')


def test_a_step_written_again_shows_the_value_written_last(xl_project, tmp_path):
    """A resumed run appends from its checkpoint's step on: steps already shown come again, and the steps after
    the one a series starts again at are gone. The run's series are sent again whole; a series the user hid stays
    hidden, a new loss series is shown."""
    project = copy_of(xl_project, tmp_path)
    folder, uuid, _ = run_of(project)
    with follow(project, tmp_path / 'data') as server:
        wait_listed(server, uuid)
        names = [s['name'] for s in api('POST', server.port, f'metrics/{uuid}', {'get_all': False})['series']]
        hidden = [-1 if name == 'loss.valid' else choice for name, choice in chart_choices(server.port, uuid).items()]
        api('POST', server.port, f'metrics/preferences/{uuid}', {'series_preferences': hidden, 'series_names': names})
        with open(folder / 'log.jsonl', 'a') as f:
            f.write(json.dumps({'track': {'loss.train': [[10, [7.0, 9.0]], [30, [5.0]]], 'loss.test': [[30, [6.0]]]},
                                'time': time.time()}) + '\n')
        wait_until('the rewritten step on the chart', lambda: 10 in series(server.port, uuid)['loss.train']['step']
                   and 8.0 in series(server.port, uuid)['loss.train']['value'], timeout=120)
        wait_for_scans(server, 1)  # the scan that sent them has ended
        shown = assert_series_as_in_file(server.port, uuid, folder, keys=('loss.train', 'loss.valid', 'loss.test'))
        assert shown['loss.train']['step'] == list(range(11)) + [30]
        assert shown['loss.train']['value'][10] == 8.0 and shown['loss.train']['value'][11] == 5.0
        choices = chart_choices(server.port, uuid)
        assert (choices['loss.train'], choices['loss.valid'], choices['loss.test']) == (1, -1, 1), choices


def test_a_run_resumed_before_its_last_step_shows_what_read_metrics_reads(xl_project, tmp_path):
    """A run resumed from the checkpoint of step 20 that has not reached its old last step (29) yet: on the
    dashboard, as from `read_metrics` of its `log.jsonl`, `loss.train` ends at the resumed run's step 21 (the
    stopped run's steps 22 to 29 are gone), and the series the resumed run has not written yet are as they were."""
    project = copy_of(xl_project, tmp_path)
    folder, uuid, _ = run_of(project)
    with follow(project, tmp_path / 'data') as server:
        wait_listed(server, uuid)
        with open(folder / 'log.jsonl', 'a') as f:
            f.write(json.dumps({'track': {'loss.train': [[20, [1.0, 2.0]], [21, [1.25]]], 'lr': [[20, [0.5]]]},
                                'time': time.time()}) + '\n')
        wait_until('the resumed steps on the chart',
                   lambda: 1.25 in series(server.port, uuid)['loss.train']['value'], timeout=120)
        wait_for_scans(server, 1)  # the scan that sent them has ended
        in_file = read_metrics(folder)
        shown = assert_series_as_in_file(server.port, uuid, folder, keys=sorted(in_file))
        assert set(shown) == set(in_file)
        assert shown['loss.train']['step'] == list(range(22)) and shown['loss.train']['value'][20:] == [1.5, 1.25]
        assert shown['loss.valid']['step'] == [14, 29] and shown['lr']['step'][-1] == 20


def test_damaged_files_are_skipped_with_a_message_and_tried_again(xl_project, tmp_path):
    project = copy_of(xl_project, tmp_path)
    good, uuid, _ = run_of(project)
    # A run whose configs.yaml is damaged, and one whose log.jsonl has a broken line and a half-written last line
    bad_configs = good.parent / ('c' * 32)
    torn_log = good.parent / ('d' * 32)
    shutil.copytree(good, bad_configs)
    shutil.copytree(good, torn_log)
    (bad_configs / 'configs.yaml').write_text('adapt_inp:\n  computed: [false\n  name: adapt_inp\n')
    points = [[step, [float(step)]] for step in range(30)]
    lines = [json.dumps({'track': {'loss.train': points[:10]}, 'time': 1.0}),
             '{"track": {"loss.train": [[10, [1.0',
             json.dumps({'track': {'loss.train': points[11:20]}, 'time': 2.0})]
    last = json.dumps({'track': {'loss.train': points[20:]}, 'time': 3.0})
    (torn_log / 'log.jsonl').write_text('\n'.join(lines) + '\n' + last[:25])
    broken_at = len(lines[0]) + 1
    with follow(project, tmp_path / 'data') as server:
        wait_listed(server, uuid)
        wait_listed(server, torn_log.name)
        wait_for_scans(server)
        assert bad_configs.name not in listed_runs(server.port)
        log = server.log()
        assert log.count(f'{bad_configs / "configs.yaml"}: not valid YAML') == 1, log
        assert log.count(f'{torn_log / "log.jsonl"}: the line at byte {broken_at} is skipped: not JSON') == 1, log
        assert series(server.port, torn_log.name)['loss.train']['step'] == list(range(10)) + list(range(11, 20))

        # Mended and completed: taken up at the next scans
        shutil.copy(good / 'configs.yaml', bad_configs / 'configs.yaml')
        with open(torn_log / 'log.jsonl', 'a') as f:
            f.write(last[25:] + '\n')
        wait_listed(server, bad_configs.name)
        wait_until('the completed line on the chart',
                   lambda: series(server.port, torn_log.name)['loss.train']['step'][-1] == 29)
        assert series(server.port, torn_log.name)['loss.train']['step'] == [s for s in range(30) if s != 10]
        assert_series_as_in_file(server.port, bad_configs.name, bad_configs)
        assert server.proc.poll() is None and 'Traceback' not in server.log()


def test_a_run_reported_live_is_left_alone(tmp_path):
    """A training of the followed project that reports live (`report_to_dashboard`): its run is the live reports',
    and what its folder holds is not imported too."""
    project = tmp_path / 'project'
    project.mkdir()
    with follow(project, tmp_path / 'data') as server:
        reported = run_training(project, server.port, name='live', overrides={'label': 'live'}, steps=5)
        uuid = reported['uuid']
        (folder,) = (project / 'logs').glob(f'*/{uuid}')
        (folder / 'log.jsonl').write_text(json.dumps({'track': {'loss': [[s, [100.0]] for s in range(1, 9)]},
                                                      'time': time.time()}) + '\n')
        wait_until('the follower to meet the run', lambda: following(server.port)['runs'].get(uuid) == 'reported live',
                   timeout=120)
        wait_for_scans(server)
        assert f'run {uuid} ({folder}) was reported to the dashboard live: left as it is' in server.log()
        loss = series(server.port, uuid)['loss']
        assert loss['step'] == sorted(reported['losses'])
        np.testing.assert_allclose(loss['value'], [reported['losses'][s] for s in loss['step']],
                                   rtol=STORED_AS_FLOAT32, atol=0)


def test_a_run_deleted_on_the_dashboard_is_not_imported_again(xl_project, tmp_path):
    project = copy_of(xl_project, tmp_path)
    folder, uuid, _ = run_of(project)
    with follow(project, tmp_path / 'data') as server:
        wait_listed(server, uuid)
        assert api('PUT', server.port, 'runs', {'run_uuids': [uuid]})['is_successful'] is True
        with open(folder / 'log.jsonl', 'a') as f:
            f.write(json.dumps({'track': {'loss.train': [[30, [1.0]]]}, 'time': time.time()}) + '\n')
        wait_until('the follower to see the deletion', lambda: following(server.port)['runs'][uuid] ==
                   'deleted on the dashboard')
        wait_for_scans(server)
        assert uuid not in listed_runs(server.port)
        assert http('GET', f'{server.url}/api/v1/run/{uuid}')[0] == 404


def test_a_project_that_does_not_exist_is_refused_naming_it(tmp_path):
    missing = tmp_path / 'no_such_project'
    out = start_refused(tmp_path / 'data', '--project', str(missing))
    assert out.returncode == 2, out
    assert f"project: '{missing}' does not exist" in out.stderr, out.stderr


def test_a_damaged_record_stops_the_start_naming_it_and_once_restored_the_run_is_followed_on(xl_project, tmp_path):
    """`project_runs.json` cut short (a full disk): the dashboard started with no record, took the run it had
    imported for one reported live and followed it no more. It refuses to start, naming the file, what is wrong and
    what to do; restored from a copy, the run's new steps show."""
    project = copy_of(xl_project, tmp_path)
    folder, uuid, _ = run_of(project)
    record = tmp_path / 'data' / PROGRESS_FILE
    with follow(project, tmp_path / 'data') as server:
        wait_listed(server, uuid)
    copy = record.read_text()
    record.write_text(copy[:len(copy) // 2])
    refused = start_refused(tmp_path / 'data', '--project', str(project))
    assert refused.returncode == 2, refused
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"labml_txl.dashboard: error: the store file {str(record)!r} is damaged (not JSON: "), line
    assert 'restore it from a copy of the data directory; or delete it' in line, line

    record.write_text(copy)
    with follow(project, tmp_path / 'data') as server:
        with open(folder / 'log.jsonl', 'a') as f:
            f.write(json.dumps({'track': {'loss.train': [[30, [0.5]]]}, 'time': time.time()}) + '\n')
        wait_until('the new step on the chart', lambda: series(server.port, uuid)['loss.train']['step'][-1:] == [30])
        assert following(server.port)['runs'] == {uuid: 'following'}
        assert 'imported' not in server.log() and 'reported to the dashboard live' not in server.log()


def test_start_in_background_follows_the_project_given(xl_project, tmp_path):
    from labml_txl.dashboard import following as followed_project, start_in_background
    project = copy_of(xl_project, tmp_path)
    port = free_port()
    line = start_in_background(port, tmp_path / 'data', tmp_path / 'dashboard.log', project=project)
    pid = int(re.search(r'dashboard process (\d+)', line).group(1))
    try:
        assert followed_project(port) == str(project.resolve())
        assert 'already running' in start_in_background(port, tmp_path / 'data', tmp_path / 'log2', project=project)
        other = start_in_background(port, tmp_path / 'data', tmp_path / 'log2', project=tmp_path)
        assert f'follows the runs of {project.resolve()}, not of {tmp_path.resolve()}' in other
    finally:
        os.kill(pid, signal.SIGTERM)
    with pytest.raises(ValueError, match='does not exist'):
        start_in_background(free_port(), tmp_path / 'data', tmp_path / 'log3', project=tmp_path / 'missing')


def test_the_pages_show_its_comment_and_both_losses_selected(chromium, followed, tmp_path):
    """In the browser: the Runs list and the metrics page name the run with its comment, and the metrics page
    shows loss.train and loss.valid (selected) and no other series."""
    server, _, uuid, info = followed
    runs = render(chromium, f'{server.url}/runs', tmp_path / 'profile', ready=re.escape(info['comment']))
    assert f'<h5>train_xl {info["comment"]}</h5>' in runs and f'<h6>{info["comment"]}</h6>' in runs
    page = render(chromium, f'{server.url}/run/{uuid}/metrics', tmp_path / 'profile',
                  ready=r'sparkline-list-item[^"]*selected')
    assert f'<h3>train_xl {info["comment"]}</h3>' in page and f'<h5>{info["comment"]}</h5>' in page
    items = re.findall(r'<div class="sparkline-list-item list-group-item (\w+)".*?<span class="title"[^>]*>([^<]*)'
                       r'</span>', page, flags=re.S)
    assert {name for kind, name in items if kind == 'selected'} == {'loss.train', 'loss.valid'}, items
    assert {'lr', 'grad_norm', 'bpc.train'} <= {name for kind, name in items if kind != 'selected'}, items
