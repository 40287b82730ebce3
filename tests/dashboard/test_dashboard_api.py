"""The dashboard as labml sees it: a training reports configs and losses, the app's API gives them back."""
import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard import LOCAL_TOKEN, check_port, run_url, web_api_url  # noqa: E402
from .helpers import DashboardServer, api, decode_series, free_port, http, run_training  # noqa: E402

# Not arithmetic but storage: the app keeps each logged value as float32, one rounding (within half of float32's
# epsilon, relative) of the float64 logged
STORED_AS_FLOAT32 = np.finfo(np.float32).eps


def _loss_series(port, run_uuid):
    data = api('POST', port, f'metrics/{run_uuid}', {'get_all': True})
    series = {s['name']: s for s in data['series']}
    assert 'loss' in series, f'no loss series in {sorted(series)}'
    return decode_series(series['loss']['step']), decode_series(series['loss']['value'])


def test_run_configs_come_back_as_logged(dashboard, reported_run):
    run = api('GET', dashboard.port, f'run/{reported_run["uuid"]}')
    assert run['run_uuid'] == reported_run['uuid']
    assert run['name'] == 'dash_api'
    configs = {c['key']: c for c in run['configs']}
    assert set(configs) == {'lr', 'd_model', 'label'}
    for key, logged in reported_run['configs'].items():
        assert configs[key]['computed'] == logged, (key, configs[key])
        assert configs[key]['is_explicitly_specified'], key


def test_loss_values_come_back_as_logged(dashboard, reported_run):
    steps, values = _loss_series(dashboard.port, reported_run['uuid'])
    logged = reported_run['losses']
    assert steps == sorted(logged)
    np.testing.assert_allclose(values, [logged[s] for s in sorted(logged)], rtol=STORED_AS_FLOAT32, atol=0)
    assert all(math.isfinite(v) for v in values)


def test_run_is_listed_completed_under_runs(dashboard, reported_run):
    runs = api('GET', dashboard.port, 'runs/null')['runs']
    listed = {r['run_uuid']: r for r in runs}
    assert reported_run['uuid'] in listed, f'{reported_run["uuid"]} not in {sorted(listed)}'
    assert listed[reported_run['uuid']]['run_status']['status'] == 'completed'
    status = api('GET', dashboard.port, f'run/status/{reported_run["uuid"]}')
    assert status['run_status']['status'] == 'completed'


def test_runs_persist_across_restarts_until_deleted(tmp_path):
    """Report through the `labml_app_url` environment variable, restart, read back, delete, restart."""
    data_dir = tmp_path / 'data'
    with DashboardServer(data_dir) as first:
        result = run_training(tmp_path / 'train', first.port, name='persisted', via='env',
                              overrides={'d_model': 3, 'label': 'kept'}, steps=5)
    uuid = result['uuid']
    assert list(data_dir.glob('models/Run/*.pkl')), 'no run file under the data dir'

    with DashboardServer(data_dir) as second:
        steps, values = _loss_series(second.port, uuid)
        assert steps == sorted(result['losses'])
        np.testing.assert_allclose(values, [result['losses'][s] for s in steps], rtol=STORED_AS_FLOAT32, atol=0)
        assert uuid in {r['run_uuid'] for r in api('GET', second.port, 'runs/null')['runs']}

        assert api('PUT', second.port, 'runs', {'run_uuids': [uuid]})['is_successful'] is True
        assert http('GET', f'{second.url}/api/v1/run/{uuid}')[0] == 404
        assert uuid not in {r['run_uuid'] for r in api('GET', second.port, 'runs/null')['runs']}

    with DashboardServer(data_dir) as third:
        assert http('GET', f'{third.url}/api/v1/run/{uuid}')[0] == 404


def test_busy_port_is_refused_naming_the_port(dashboard, tmp_path):
    out = subprocess.run([sys.executable, '-m', 'labml_txl.dashboard', '--port', str(dashboard.port),
                          '--data-dir', str(tmp_path / 'other')],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out
    assert f'port {dashboard.port}' in out.stderr and 'already in use' in out.stderr, out.stderr


def test_data_dir_that_is_a_file_is_refused(tmp_path):
    not_a_dir = tmp_path / 'file'
    not_a_dir.write_text('x')
    out = subprocess.run([sys.executable, '-m', 'labml_txl.dashboard', '--port', str(free_port()),
                          '--data-dir', str(not_a_dir)], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out
    assert 'data_dir' in out.stderr and 'not a directory' in out.stderr, out.stderr


def test_urls_and_their_validation():
    assert web_api_url(5005) == f'http://127.0.0.1:5005/api/v1/{LOCAL_TOKEN}'
    assert run_url('abc', 6006) == 'http://127.0.0.1:6006/run/abc'
    for bad in (0, 65536, '5005', 5005.0, True, None):
        with pytest.raises(ValueError, match='port'):
            check_port(bad)
    with pytest.raises(ValueError, match='run_uuid'):
        run_url('', 5005)


def test_report_to_dashboard_refuses_a_port_with_no_dashboard():
    from labml_txl.dashboard import DashboardError, report_to_dashboard
    port = free_port()
    with pytest.raises(DashboardError, match=f'no dashboard on 127.0.0.1:{port}'):
        report_to_dashboard(port)
