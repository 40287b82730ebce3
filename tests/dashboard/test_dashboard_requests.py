"""The dashboard answers bad requests as a web service should (400, 413, with a short message, never a server
traceback), and one dashboard at a time serves a store."""
import json
import subprocess
import sys

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard.request_checks import MAX_BODY  # noqa: E402
from .helpers import DashboardServer, api, error_message, free_port, send  # noqa: E402


@pytest.mark.parametrize('method, path, body, message', [
    ('POST', 'run/{uuid}', b'not json at all', 'the request body is not JSON'),
    ('POST', 'metrics/{uuid}', b'{"get_all": tru', 'the request body is not JSON'),
    ('POST', 'run/{uuid}', b'\xff\xfe{}', 'the request body is not UTF-8 text'),
    ('PUT', 'runs', b'{"run_uuids": "abc"}', 'PUT /api/v1/runs takes {"run_uuids": [uuid, ...]}, a list of strings'),
    ('PUT', 'runs', b'["x"]', 'PUT /api/v1/runs takes {"run_uuids"'),
    ('POST', 'runs/archive', b'{}', 'POST /api/v1/runs/archive takes {"run_uuids"'),
    ('PUT', 'sessions', b'{"session_uuids": [1, 2]}', 'PUT /api/v1/sessions takes {"session_uuids"'),
])
def test_malformed_bodies_are_a_400_with_a_message(dashboard, reported_run, method, path, body, message):
    logged = len(dashboard.log())
    status, content = send(method, f'{dashboard.url}/api/v1/{path.format(uuid=reported_run["uuid"])}', body)
    assert status == 400 and message in error_message(content), (status, content[:300])
    assert 'Traceback' not in dashboard.log()[logged:]
    # nothing was done: the run is still there, as it was
    assert api('GET', dashboard.port, f'run/{reported_run["uuid"]}')['run_uuid'] == reported_run['uuid']


def test_a_body_over_the_limit_is_a_413(dashboard, reported_run):
    status, content = send('POST', f'{dashboard.url}/api/v1/run/{reported_run["uuid"]}',
                            b'[' + b' ' * (MAX_BODY + 1) + b']')
    assert status == 413 and f'larger than {MAX_BODY} bytes' in error_message(content)


def test_well_formed_requests_still_reach_the_app(dashboard, reported_run):
    status, content = send('PUT', f'{dashboard.url}/api/v1/runs', b'{"run_uuids": []}')
    assert status == 200 and json.loads(content)['is_successful'] is True
    assert api('POST', dashboard.port, f'metrics/{reported_run["uuid"]}', {'get_all': True})['series']


def test_a_second_dashboard_on_the_same_store_refuses_to_start(dashboard):
    second = subprocess.run([sys.executable, '-m', 'labml_txl.dashboard', '--port', str(free_port()),
                             '--data-dir', str(dashboard.data_dir)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert (f"is the store of another dashboard (process {dashboard.proc.pid}); one dashboard at a time uses a "
            f"store") in second.stderr, second.stderr[-2000:]


def test_the_store_is_free_again_when_its_dashboard_ends(tmp_path):
    with DashboardServer(tmp_path / 'data') as first:
        pid = first.proc.pid
    with DashboardServer(tmp_path / 'data') as second:
        assert second.proc.pid != pid and api('GET', second.port, 'runs/null')
