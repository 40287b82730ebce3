"""A training of the project's own scripts reports live to the dashboard, each of the three ways `docs/dashboard.md`
gives (`report_to_dashboard()`, `labml_app_url` in the environment, `app_url` in `.labml.yaml`): the run is on the
dashboard while it trains, with its losses, shown once in a project the dashboard follows too; a way that points at
no dashboard is refused before the run is made."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard import web_api_url  # noqa: E402
from labml_txl.fast.native import prepare_kernels  # noqa: E402
from .helpers import (REPO, TINY_XL, DashboardServer, api, following, free_port, listed_runs, run_folders,  # noqa: E402
                      series, wait_for_scans, wait_until)

# Long enough that it is still training when the dashboard lists it; the test stops it with Ctrl-C
TRAINING = [*TINY_XL, 'max_step=100000', 'eval_interval=100000', 'checkpoint_interval=100000']

# Way 1: the user's own script calls report_to_dashboard() before running ours
WITH_HELPER = textwrap.dedent('''
    import runpy, sys
    from labml_txl.dashboard import report_to_dashboard
    report_to_dashboard(int(sys.argv[1]))
    script = sys.argv[2]
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name='__main__')
''')


@pytest.fixture(scope='module', autouse=True)
def kernels_built():
    """Our C++ kernels compiled before any training here starts. A training compiles those it lacks on its first
    step, each about half a minute, and a fresh machine (CI's empty kernel cache) lacks all of them: the first loss
    would come after the waits below, and each test's Ctrl-C would end the build unfinished, for the next to begin
    again. The trainings load what this builds from the same cache."""
    prepare_kernels()


def _start_training(project: Path, port: int, way: str) -> subprocess.Popen:
    """`train_xl.py` in `project`, reporting to the dashboard on `port` the way `way` says; its output goes to
    files beside `project` (`training.out`, `training.err`), never to pipes: labml's progress lines fill a pipe's
    buffer within seconds, and a training blocked on writing to it reports nothing more."""
    project.mkdir(parents=True, exist_ok=True)
    yaml = 'check_repo_dirty: false\n' + (f'app_url: {web_api_url(port)}\n' if way == 'yaml' else '')
    (project / '.labml.yaml').write_text(yaml)
    env = {k: v for k, v in os.environ.items() if k != 'labml_app_url'}
    if way == 'env':
        env['labml_app_url'] = web_api_url(port)
    script = str(REPO / 'experiments' / 'train_xl.py')
    command = ([sys.executable, '-c', WITH_HELPER, str(port), script] if way == 'helper' else [sys.executable, script])
    with open(project.parent / 'training.out', 'w') as out, open(project.parent / 'training.err', 'w') as err:
        return subprocess.Popen([*command, *TRAINING], cwd=project, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)


def _stopped(training: subprocess.Popen, project: Path, timeout: float = 120) -> str:
    """Wait for `training` to end and return what it wrote to stderr."""
    training.wait(timeout=timeout)
    return (project.parent / 'training.err').read_text(errors='replace')


def _listed_while_training(server: DashboardServer, project: Path, way: str) -> str:
    """The uuid of the run the dashboard lists while a training in `project` runs, with a training loss on its
    chart; then the training stopped by Ctrl-C. A failure here carries the tail of what the training wrote."""
    training = _start_training(project, server.port, way)
    try:
        uuid = wait_until(f'a run on the dashboard ({server.log()[-2000:]})',
                          lambda: next(iter(listed_runs(server.port)), None) or training.poll() is not None, 120)
        if training.poll() is not None:
            raise AssertionError('the training ended before the dashboard listed a run')
        assert api('GET', server.port, f'run/{uuid}')['run_uuid'] == uuid
        wait_until('a training loss on the chart',
                   lambda: series(server.port, uuid).get('loss.train') or training.poll() is not None, 60)
        if training.poll() is not None:
            raise AssertionError('the training ended before its first loss reached the dashboard')
    except AssertionError as failure:
        training.send_signal(signal.SIGINT)
        failure.add_note(f'the training wrote to stderr: {_stopped(training, project)[-3000:]}')
        raise
    training.send_signal(signal.SIGINT)
    err = _stopped(training, project)
    assert training.returncode == 130, err[-3000:]
    assert 'Stopped by SIGINT' in err
    return uuid


@pytest.mark.parametrize('way', ['helper', 'env', 'yaml'])
def test_a_training_reports_live_each_way_the_docs_give(tmp_path, way):
    with DashboardServer(tmp_path / 'data') as server:  # following no project: only live reports reach it
        uuid = _listed_while_training(server, tmp_path / 'project', way)
        (folder,) = run_folders(tmp_path / 'project')
        assert folder.name == uuid
        # the run's losses on the dashboard are those it kept in its own log
        kept = [json.loads(line)['track'].get('loss.train') for line in (folder / 'log.jsonl').read_text().splitlines()]
        kept_steps = [step for entries in kept if entries for step, _ in entries]
        wait_until('every kept loss on the chart',
                   lambda: series(server.port, uuid)['loss.train']['step'][-1] >= kept_steps[-1], 60)


def test_a_run_reported_live_in_a_followed_project_is_shown_once(tmp_path):
    project = tmp_path / 'project'
    project.mkdir()
    with DashboardServer(tmp_path / 'data', project=project, extra_args=['--scan-seconds', '0.5']) as server:
        uuid = _listed_while_training(server, project, 'env')
        wait_until('the follower to meet the run', lambda: following(server.port)['runs'].get(uuid) == 'reported live')
        wait_for_scans(server)
        shown = [run['run_uuid'] for run in api('GET', server.port, 'runs/null')['runs']]
        assert shown == [uuid]


@pytest.mark.parametrize('way', ['env', 'yaml'])
def test_a_way_that_points_at_no_dashboard_is_refused_before_the_run_is_made(tmp_path, way):
    port = free_port()
    training = _start_training(tmp_path / 'project', port, way)
    err = _stopped(training, tmp_path / 'project')
    assert training.returncode == 2, err[-3000:]
    where = 'labml_app_url in the environment' if way == 'env' else 'app_url of .labml.yaml or report_to_dashboard()'
    assert (f'error: the run would report live to {web_api_url(port)}/ ({where}), but nothing answers there'
            in err), err[-3000:]
    assert run_folders(tmp_path / 'project') == []
