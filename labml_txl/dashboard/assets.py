"""The dashboard page's browser libraries, served from this machine instead of public CDNs.

labml_app's `index.html` loads three libraries from CDNs, which a machine without internet cannot reach. Each
has an npm package, pinned in `package.json` at the version the page names and installed by `npm ci` into
`node_modules/` (never committed):

| library          | CDN tag in index.html                           | npm package (version in package.json) |
| ---------------- | ----------------------------------------------- | ------------------------------------- |
| d3 v6            | `<script src="https://d3js.org/d3.v6.min.js">`  | `d3` (6.7.0)                          |
| Bootstrap 5      | `<link href=".../bootstrap@5.0.0-beta2/...">`   | `bootstrap` (5.0.0-beta2)             |
| Font Awesome 5   | `<link href=".../font-awesome/5.9.0/...">`      | `@fortawesome/fontawesome-free` (5.9.0) |

`find_assets()` looks for each; `rewrite_index_html()` swaps the CDN tag of each one found for a tag that
loads it from `/_local/<name>/...`, and leaves the CDN tag of each one missing as it was (the page then
works wherever the CDN is reachable). `LocalPageApp` wraps labml_app: it serves those routes, the app's
own static files and the rewritten page, and hands everything else (the `/api/` routes) to labml_app.
"""
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

LOCAL_PREFIX = '/_local'
NODE_MODULES_ENV = 'LABML_TXL_NODE_MODULES'


@dataclass(frozen=True)
class Asset:
    """One library of the page: where it is on disk (`directory`, None when missing) and how it is loaded."""
    name: str
    kind: str  # 'script' or 'stylesheet'
    cdn_tag: 're.Pattern[str]'
    entry: str  # the file under `directory` that the page loads
    directory: Optional[Path]
    note: str  # where it was found, or why it was not

    @property
    def route(self) -> str:
        return f'{LOCAL_PREFIX}/{self.name}'

    @property
    def url(self) -> str:
        return f'{self.route}/{self.entry}'

    def local_tag(self) -> str:
        if self.kind == 'script':
            return f'<script src="{self.url}"></script>'
        return f'<link href="{self.url}" rel="stylesheet">'


def _major(version: str) -> int:
    head = version.split('.', 1)[0]
    return int(head) if head.isdigit() else -1


def node_modules_dirs() -> List[Path]:
    """Where `npm ci` may have put the packages: `$LABML_TXL_NODE_MODULES`, the source checkout, the cwd."""
    dirs = []
    if os.environ.get(NODE_MODULES_ENV):
        dirs.append(Path(os.environ[NODE_MODULES_ENV]))
    dirs.append(Path(__file__).resolve().parents[2] / 'node_modules')
    dirs.append(Path.cwd() / 'node_modules')
    return dirs


def _find_npm_package(package: str, majors: Sequence[int], served: str, entry: str,
                      search: Sequence[Path]) -> Tuple[Optional[Path], str]:
    """The folder to serve of npm `package` (its subfolder `served`, holding `entry`), from the first of `search`
    that has a version of one of the major versions `majors`; else None and why not."""
    seen = []
    wanted = '/'.join(f'{major}.x' for major in majors)
    for node_modules in search:
        meta = node_modules / package / 'package.json'
        if not meta.is_file():
            continue
        version = json.loads(meta.read_text(encoding='utf-8')).get('version', '?')
        if _major(version) not in majors:
            seen.append(f'{package} {version} in {node_modules} (the page needs {wanted})')
            continue
        directory = node_modules / package / served
        if (directory / entry).is_file():
            return directory, f'{package} {version} from {node_modules}'
        seen.append(f'{package} {version} in {node_modules} has no {served}/{entry}')
    looked = ', '.join(str(p) for p in search)
    return None, '; '.join(seen) or f'no {package} in {looked}; run `npm ci` (package.json pins it)'


def find_assets(node_modules: Optional[Sequence[Path]] = None) -> List[Asset]:
    """Look for d3 v6, Bootstrap 5 and Font Awesome 5 (or 6, which keeps 5's class names) in `node_modules`
    (default: `node_modules_dirs()`); each comes back found or with why not."""
    search = node_modules_dirs() if node_modules is None else list(node_modules)
    d3_dir, d3_note = _find_npm_package('d3', [6], 'dist', 'd3.min.js', search)
    bs_dir, bs_note = _find_npm_package('bootstrap', [5], 'dist', 'css/bootstrap.min.css', search)
    # The package's root: its css/all.min.css loads the fonts from ../webfonts/
    fa_dir, fa_note = _find_npm_package('@fortawesome/fontawesome-free', [5, 6], '.', 'css/all.min.css', search)
    return [
        Asset('d3', 'script', re.compile(r'<script[^>]*\bsrc="[^"]*d3[^"]*"[^>]*>\s*</script>'),
              'd3.min.js', d3_dir, d3_note),
        Asset('bootstrap', 'stylesheet', re.compile(r'<link[^>]*\bhref="[^"]*bootstrap[^"]*\.css"[^>]*>'),
              'css/bootstrap.min.css', bs_dir, bs_note),
        Asset('font-awesome', 'stylesheet', re.compile(r'<link[^>]*\bhref="[^"]*font-?awesome[^"]*\.css"[^>]*>'),
              'css/all.min.css', fa_dir, fa_note),
    ]


def rewrite_index_html(html: str, assets: Sequence[Asset]) -> Tuple[str, List[str]]:
    """Swap the CDN tag of each found asset for its local tag; return the page and one line per asset."""
    report = []
    for a in assets:
        if a.directory is None:
            report.append(f'{a.name}: from the CDN ({a.note})')
            continue
        html, n = a.cdn_tag.subn(a.local_tag(), html, count=1)
        report.append(f'{a.name}: {a.url} ({a.note})' if n else
                      f'{a.name}: found ({a.note}) but the page has no CDN tag for it; left as is')
    return html, report


class LocalPageApp:
    """ASGI app in front of labml_app: local assets, the app's static files and the rewritten page.

    `GET`/`HEAD` requests outside `/api/` never reach labml_app: a file under `static_dir` is sent as is,
    any other path (the page's own routes such as `/run/<uuid>`) gets the rewritten `index.html`.
    Files are only ever sent from inside `static_dir` or an asset's directory.
    """

    def __init__(self, app: Callable, static_dir: Path, html: str, assets: Sequence[Asset]):
        from starlette.middleware.exceptions import ExceptionMiddleware
        from starlette.responses import FileResponse, HTMLResponse, Response
        from starlette.routing import Mount, Router
        from starlette.staticfiles import StaticFiles

        self._app = app
        self._static_dir = Path(static_dir).resolve()
        self._file_response = FileResponse
        self._html = HTMLResponse(html, headers={'Cache-Control': 'no-cache'})
        self._not_found = Response('not found', status_code=404, media_type='text/plain')
        mounts = [Mount(a.route, app=StaticFiles(directory=str(a.directory))) for a in assets if a.directory]
        # StaticFiles answers a missing file by raising HTTPException: the middleware makes it a plain 404
        self._router = ExceptionMiddleware(Router(routes=mounts, default=self._page_or_app))

    def _static_file(self, path: str) -> Optional[Path]:
        candidate = (self._static_dir / path.lstrip('/')).resolve()
        if candidate != self._static_dir and self._static_dir in candidate.parents and candidate.is_file():
            return candidate
        return None

    async def _page_or_app(self, scope, receive, send):
        path = scope.get('path', '/')
        if scope['type'] != 'http' or scope['method'] not in ('GET', 'HEAD') or path.startswith('/api/'):
            return await self._app(scope, receive, send)
        if path.startswith(LOCAL_PREFIX + '/'):
            return await self._not_found(scope, receive, send)
        file = self._static_file(path) if path not in ('/', '/index.html') else None
        response = self._file_response(str(file)) if file else self._html
        await response(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope['type'] == 'lifespan':
            return await self._app(scope, receive, send)
        await self._router(scope, receive, send)
