"""
Bad requests to the dashboard's API are answered as a web service should, before labml_app sees them.

labml_app reads request bodies with `await request.json()` and indexes them without checks: a body that is not
JSON is a 500 with a server traceback, a body of any size is read into memory, and `PUT /api/v1/runs` with
`{"run_uuids": "abc"}` deletes runs named by the string's letters and answers "success". `RequestChecks`, an ASGI
wrapper, reads the body of every `POST`, `PUT` and `PATCH` under `/api/` first and answers

* 413 when it is larger than `max_body` bytes (16 MiB): no more than that is ever kept in memory, the rest is
  read and dropped;
* 400 when it is not empty and not JSON, or not UTF-8;
* 400 when it nests arrays and objects deeper than `MAX_DEPTH` (100) levels, found by a scan of its brackets
  before any parse: Python's `json` parses nesting by recursion, so 100,000 `[` were a `RecursionError` (a 500);
* 400 when a request of `LIST_BODIES` (the runs and sessions to delete or archive) is not an object whose key is a
  list of strings;

and it answers 400 to any request whose path or query holds a null byte (`%00`): no file or run is named by one,
and the page's file lookup raised `embedded null byte` (a 500). Each answer is a short JSON message
(`{"error": ...}`); every other request reaches labml_app with its body as sent.

labml_app answers an exception of its handlers with a 500 of `{"error": str(e), "trace": <the Python traceback>}`.
The trace stays in the server's log (labml_app logs it) and leaves the response: the client gets the error's message
on one line. The store's errors say which file is damaged (`store.DamagedStoreFile`), so that line names it.
"""
import json
import re
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

MAX_BODY = 16 * 2 ** 20
# The deepest nesting of arrays and objects a body may have; labml's own requests nest a few levels
MAX_DEPTH = 100

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
        if scope['type'] != 'http':
            return await self._app(scope, receive, send)
        where = _null_byte(scope)
        if where is not None:
            return await _reply(send, 400, f'the request {where} holds a null byte (%00), which names no page, run or '
                                           f'file: {scope["method"]} {_shown(scope)}')
        send = _without_traces(send)
        if scope['method'] not in ('POST', 'PUT', 'PATCH') or not scope['path'].startswith('/api/'):
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
    # No more opening brackets than the limit cannot nest deeper (most bodies: no scan)
    if body.count(b'[') + body.count(b'{') > MAX_DEPTH and nesting_depth(body) > MAX_DEPTH:
        return f'the request body nests JSON arrays and objects deeper than {MAX_DEPTH} levels'
    try:
        data = json.loads(body.decode('utf-8'))
    except UnicodeDecodeError:
        return 'the request body is not UTF-8 text'
    except ValueError as error:
        return f'the request body is not JSON ({error})'
    except RecursionError:
        # Not reached after the scan above; kept so that no nesting can make the parse a 500
        return f'the request body nests JSON arrays and objects deeper than {MAX_DEPTH} levels'
    if key is not None:
        values = data.get(key) if isinstance(data, dict) else None
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f'{method} {path} takes {{"{key}": [uuid, ...]}}, a list of strings; got {body[:200]!r}'
    return None


# A JSON string from its opening quote: characters other than `"` and `\`, or an escape pair; the closing quote is
# optional so that a string left open matches to the end at once (no retry from every later quote: linear time)
_JSON_STRING = re.compile(rb'"(?:[^"\\]+|\\.)*"?', re.DOTALL)
# Every byte but the four brackets, deleted to leave the bracket sequence
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b'[]{}')


def nesting_depth(body: bytes) -> int:
    r"""
    The deepest nesting of arrays and objects in `body` read as JSON, by a scan of its brackets, not a parse.

    Brackets inside strings are text: each string (escapes included) is cut out first, then the depth is the largest
    running sum of $+1$ per `[` or `{` and $-1$ per `]` or `}`. Linear in the body's length and without recursion, so
    it is safe on any body; on a body that is not JSON the number is only an estimate (`json.loads` then refuses it).
    """
    brackets = _JSON_STRING.sub(b'""', body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    opens = np.frombuffer(brackets, dtype=np.uint8)
    # $+1$ for `[` (91) and `{` (123), $-1$ for `]` and `}`
    steps = ((opens == ord('[')) | (opens == ord('{'))).astype(np.int32) * 2 - 1
    # $\max_t \sum_{s \le t} \mathit{step}_s$
    return max(0, int(np.cumsum(steps, dtype=np.int32).max()))


def _null_byte(scope) -> Optional[str]:
    """`'path'` or `'query'` where the request holds a null byte (in the path decoded from `%00`), else None."""
    if '\x00' in scope['path'] or b'\x00' in scope.get('raw_path', b''):
        return 'path'
    query = scope.get('query_string', b'')
    if b'%00' in query or b'\x00' in query:
        return 'query'
    return None


def _shown(scope) -> str:
    """The request's path and query as sent, cut to 200 characters, for a message."""
    path = scope.get('raw_path') or scope['path'].encode('utf-8', 'backslashreplace')
    query = scope.get('query_string', b'')
    return (path + (b'?' + query if query else b'')).decode('ascii', 'backslashreplace')[:200]


def _without_traces(send):
    """`send` for the app, with labml_app's answer to an exception (a 500 of `{"error": ..., "trace": ...}`)
    replaced by `{"error": <the message on one line>}`; every other response passes as it is."""
    held: List[dict] = []

    async def checked_send(message):
        if message['type'] == 'http.response.start' and message['status'] == 500:
            held.append(message)
            return
        if not held:
            return await send(message)
        held.append(message)
        if message.get('more_body', False):
            return
        start, parts = held[0], held[1:]
        body = b''.join(part.get('body', b'') for part in parts)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or 'trace' not in answer:
            for part in held:
                await send(part)
            return
        # The exception's message on one line; the trace is in the server's log
        error = ' '.join(str(answer.get('error') or 'internal error').split())
        body = json.dumps({'error': error}).encode()
        headers = [(name, value) for name, value in start.get('headers', []) if name.lower() != b'content-length']
        await send({**start, 'headers': headers + [(b'content-length', str(len(body)).encode())]})
        await send({'type': 'http.response.body', 'body': body})

    return checked_send


async def _reply(send, status: int, message: str) -> None:
    body = json.dumps({'error': message}).encode()
    await send({'type': 'http.response.start', 'status': status,
                'headers': [(b'content-type', b'application/json'), (b'content-length', str(len(body)).encode())]})
    await send({'type': 'http.response.body', 'body': body})
