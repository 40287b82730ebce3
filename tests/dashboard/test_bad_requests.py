"""The dashboard's answers to what its request checks did not cover at first (reported by a user): a null byte in
the path or the query, a body of absurdly nested JSON, and a damaged file in its store: a 400 with a message, or an
error naming the file, never a 500 with a Python trace."""
import json

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard.request_checks import MAX_DEPTH, nesting_depth  # noqa: E402
from .helpers import DashboardServer, api, error_message, http, send, start_refused  # noqa: E402


@pytest.mark.parametrize('path, where', [
    ('/foo%00bar', 'path'),
    ('/api/v1/run/ab%00c', 'path'),
    ('/api/v1/runs/null?x=%00', 'query'),
    ('/api/v1/runs/null?x=a%00b&y=1', 'query'),
])
def test_a_null_byte_in_the_path_or_query_is_a_400(dashboard, path, where):
    """`GET /foo%00bar` was a 500 (`embedded null byte` from the page's file lookup); in a query it reached
    labml_app."""
    logged = len(dashboard.log())
    status, _, content = http('GET', dashboard.url + path)
    assert status == 400 and f'the request {where} holds a null byte (%00)' in error_message(content), (status, content)
    assert 'Traceback' not in dashboard.log()[logged:]


@pytest.mark.parametrize('body', [b'[' * 100_000, b'{"a": ' * 50_000,
                                  b'[' * (MAX_DEPTH + 1) + b']' * (MAX_DEPTH + 1)])
def test_json_nested_too_deeply_is_a_400(dashboard, reported_run, body):
    """100,000 `[` was a 500 (RecursionError in the body's parse); now refused before any parse."""
    logged = len(dashboard.log())
    status, content = send('POST', f'{dashboard.url}/api/v1/metrics/{reported_run["uuid"]}', body)
    assert status == 400 and (f'the request body nests JSON arrays and objects deeper than {MAX_DEPTH} levels'
                              in error_message(content)), (status, content[:300])
    assert 'Traceback' not in dashboard.log()[logged:]


def test_nesting_up_to_the_limit_and_brackets_inside_strings_reach_the_app(dashboard, reported_run):
    """Only real nesting counts: brackets in a string (escaped quotes included) are text."""
    url = f'{dashboard.url}/api/v1/metrics/{reported_run["uuid"]}'
    text = '[[[{{{' * 10_000 + '\\"]]' + '[' * MAX_DEPTH
    status, content = send('POST', url, json.dumps({'get_all': True, 'note': text}).encode())
    assert status == 200 and json.loads(content)['series'], (status, content[:300])
    nested = json.dumps({'get_all': True, 'deep': json.loads('[' * (MAX_DEPTH - 1) + ']' * (MAX_DEPTH - 1))})
    status, content = send('POST', url, nested.encode())
    assert status == 200, (status, content[:300])


def _depth_by_parse(value) -> int:
    """The nesting of a parsed JSON value, counted by recursion (fine for these small ones)."""
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max((_depth_by_parse(c) for c in children), default=0)


@pytest.mark.parametrize('body, depth', [
    (b'1', 0), (b'[]', 1), (b'{"a": [[1], {"b": []}]}', 4),
    # brackets in strings, after escaped quotes and backslashes, are text
    (b'{"a": "[[[\\"{{{", "b": "\\\\", "c": [["]]]]"]]}', 3),
])
def test_nesting_depth_is_that_of_the_parsed_json(body, depth):
    assert nesting_depth(body) == _depth_by_parse(json.loads(body)) == depth


def test_nesting_depth_of_a_body_that_is_not_json():
    """No parse, no error: a string left open runs to the end; an empty body nests nothing."""
    assert nesting_depth(b'[["[[[[[[') == 2 and nesting_depth(b'') == 0 and nesting_depth(b']]') == 0


def test_a_half_written_index_file_refuses_to_start_naming_it(tmp_path):
    """A half-written `RunIndex.json` was a 500 with the JSON error and a trace on requests, no file named."""
    index = tmp_path / 'data' / 'indexes' / 'RunIndex.json'
    index.parent.mkdir(parents=True)
    index.write_text('{"6a2f0c": "Run:6a2f')
    started = start_refused(tmp_path / 'data', '--no-follow')
    assert started.returncode == 2, started.stderr[-2000:]
    assert f"the store file {str(index)!r} is damaged (not JSON:" in started.stderr, started.stderr[-2000:]
    assert 'Traceback' not in started.stderr and len(started.stderr.strip().splitlines()) == 1, started.stderr


def test_a_store_file_damaged_while_serving_is_a_500_naming_it_without_a_trace(tmp_path):
    with DashboardServer(tmp_path / 'data') as server:
        projects = sorted((tmp_path / 'data' / 'models' / 'Project').glob('*.pkl'))
        assert projects and api('GET', server.port, 'runs/null')['runs'] == []
        for project in projects:
            project.write_bytes(project.read_bytes()[:10])
        status, _, content = http('GET', f'{server.url}/api/v1/runs/null')
        answer = json.loads(content)
        assert status == 500 and list(answer) == ['error'], (status, content[:500])
        assert answer['error'].startswith('the store file ') and 'is damaged (' in answer['error'], answer
        assert any(str(project) in answer['error'] for project in projects), answer
        assert '\n' not in answer['error'] and 'Traceback' not in answer['error'], answer
