"""Runs reported to this dashboard belong to its one local user, so they are listed and can be deleted.

labml (0.5.3) posts to `<app_url>track?run_uuid=...&labml_version=...` without a `labml_token`, and
labml_app files such a run under its shared "float" project as *unclaimed*: it is missing from the Runs list
and the page says it "will be deleted in 12 hours. Click Claim...". On this single-user dashboard the
`<token>` path segment of `app_url` names the project instead: `ClaimForToken` adds `labml_token=<token>`
to a track request that has none when the segment is the given token, and `init_file_store` (in
`labml_txl.dashboard`) makes that token name the local user's project. The run is then created claimed,
owned by the local user and listed under Runs, as a run reported with the user's own token would be.
"""
from typing import Callable
from urllib.parse import parse_qsl, urlencode


class ClaimForToken:
    """ASGI wrapper: `POST /api/v1/<token>/track` without `labml_token` gets `labml_token=<token>`."""

    def __init__(self, app: Callable, token: str):
        if not token or '/' in token:
            raise ValueError(f'token: expected a non-empty path segment, got {token!r}')
        self._app = app
        self._path = f'/api/v1/{token}/track'
        self._token = token

    async def __call__(self, scope, receive, send):
        if scope['type'] == 'http' and scope['method'] == 'POST' and scope['path'].rstrip('/') == self._path:
            query = parse_qsl(scope.get('query_string', b'').decode('latin-1'), keep_blank_values=True)
            if not any(k == 'labml_token' and v for k, v in query):
                query = [(k, v) for k, v in query if k != 'labml_token'] + [('labml_token', self._token)]
                scope = dict(scope, query_string=urlencode(query).encode('latin-1'))
        await self._app(scope, receive, send)
