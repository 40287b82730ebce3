"""
Bad requests to the dashboard's API are answered as a web service should, before labml_app sees them.

labml_app reads request bodies with `await request.json()` and indexes them without checks: a body that is not
JSON is a 500 with a server traceback, a body of any size is read into memory, and `PUT /api/v1/runs` with
`{"run_uuids": "abc"}` deletes runs named by the string's letters and answers "success". `RequestChecks`, an ASGI
wrapper, reads the body of every `POST`, `PUT` and `PATCH` under `/api/` first and answers

* 413 when it is larger than `max_body` bytes (16 MiB): no more than that is ever kept in memory, the rest is
  read and dropped;
* 400 when it is not empty and not JSON, or not UTF-8;
* 400 when a request of `LIST_BODIES` (the runs and sessions to delete or archive) is not an object whose key is a
  list of strings;

each with a short JSON message (`{"error": ...}`); every other request reaches labml_app with its body as sent.
"""
import json
from typing import Callable, Dict, Optional, Tuple

MAX_BODY = 16 * 2 ** 20

# Requests whose body must be `{key: [str, ...]}`, by method and path, and the key
LIST_BODIES: Dict[Tuple[str, str], str] = {
    ('PUT', '/api/v1/runs'): 'run_uuids',
    ('POST', '/api/v1/runs/archive'): 'run_uuids',
    ('POST', '/api/v1/runs/unarchive'): 'run_uuids',
    ('PUT', '/api/v1/sessions'): 'session_uuids',
}


class _TooLarge(Exception):
    pass


class RequestChecks:
    """ASGI wrapper of `app` that checks API request bodies (see the module's docstring)."""

    def __init__(self, app: Callable, max_body: int = MAX_BODY):
        self._app = app
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope['type'] != 'http' or scope['method'] not in ('POST', 'PUT', 'PATCH') \
                or not scope['path'].startswith('/api/'):
            return await self._app(scope, receive, send)
        try:
            body = await self._read_body(scope, receive)
        except _TooLarge:
            return await _reply(send, 413, f'the request body is larger than {self.max_body} bytes')
        problem = _problem(scope['method'], scope['path'].rstrip('/'), body)
        if problem is not None:
            return await _reply(send, 400, problem)

        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {'type': 'http.request', 'body': body, 'more_body': False}
            return await receive()

        await self._app(scope, replay, send)

    async def _read_body(self, scope, receive) -> bytes:
        """The whole body, or `_TooLarge` once it passes `max_body` (the rest is read and dropped, so the client
        gets the answer instead of a connection reset in mid-upload)."""
        declared = next((int(value) for name, value in scope.get('headers', [])
                         if name == b'content-length' and value.isdigit()), 0)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message['type'] == 'http.disconnect':
                break
            chunk = message.get('body', b'')
            more = message.get('more_body', False)
            size += len(chunk)
            if size <= self.max_body and declared <= self.max_body:
                chunks.append(chunk)
        if size > self.max_body or declared > self.max_body:
            raise _TooLarge
        return b''.join(chunks)


def _problem(method: str, path: str, body: bytes) -> Optional[str]:
    """Why the body of `method path` is refused, or None."""
    key = LIST_BODIES.get((method, path))
    if not body.strip() and key is None:
        return None
    try:
        data = json.loads(body.decode('utf-8'))
    except UnicodeDecodeError:
        return 'the request body is not UTF-8 text'
    except ValueError as error:
        return f'the request body is not JSON ({error})'
    if key is not None:
        values = data.get(key) if isinstance(data, dict) else None
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f'{method} {path} takes {{"{key}": [uuid, ...]}}, a list of strings; got {body[:200]!r}'
    return None


async def _reply(send, status: int, message: str) -> None:
    body = json.dumps({'error': message}).encode()
    await send({'type': 'http.response.start', 'status': status,
                'headers': [(b'content-type', b'application/json'), (b'content-length', str(len(body)).encode())]})
    await send({'type': 'http.response.body', 'body': body})
