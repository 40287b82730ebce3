"""The page's d3, Bootstrap and Font Awesome come from local routes when `npm ci` installed them, from the CDN
when not."""
import os
import re
from pathlib import Path

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard.assets import LOCAL_PREFIX, find_assets, rewrite_index_html  # noqa: E402
from .helpers import http  # noqa: E402

IN_CI = bool(os.environ.get('CI'))
CDN_HOSTS = ('d3js.org', 'cdn.jsdelivr.net', 'cdnjs.cloudflare.com')
ASSETS = {a.name: a for a in find_assets()}
CONTENT_TYPES = {'script': 'javascript', 'stylesheet': 'text/css'}


def _page(dashboard, path):
    status, headers, body = http('GET', f'{dashboard.url}{path}')
    assert status == 200 and headers.get('content-type', '').startswith('text/html'), (path, status, headers)
    return body.decode()


@pytest.mark.parametrize('name', sorted(ASSETS))
def test_installed_asset_is_served_locally(dashboard, reported_run, name):
    asset = ASSETS[name]
    if asset.directory is None:
        if IN_CI:
            pytest.fail(f'{name} is not installed in CI: {asset.note}')
        pytest.skip(f'{name} not installed here: {asset.note}')
    for path in ('/', f'/run/{reported_run["uuid"]}'):
        html = _page(dashboard, path)
        assert f'"{asset.url}"' in html, f'{path} does not load {asset.url}'
        assert not asset.cdn_tag.search(html.replace(asset.local_tag(), '')), f'{path} still has the CDN tag'
    status, headers, body = http('GET', f'{dashboard.url}{asset.url}')
    assert status == 200 and len(body) > 10_000, (asset.url, status, len(body))
    assert CONTENT_TYPES[asset.kind] in headers.get('content-type', ''), headers
    assert body == (asset.directory / asset.entry).read_bytes()


def test_page_has_no_cdn_link_when_everything_is_installed(dashboard):
    missing = [a.name for a in ASSETS.values() if a.directory is None]
    if missing and not IN_CI:
        pytest.skip(f'not installed here: {missing}')
    html = _page(dashboard, '/')
    assert not [h for h in CDN_HOSTS if h in html], html


def test_font_awesome_webfonts_referenced_by_its_css_are_served(dashboard):
    fa = ASSETS['font-awesome']
    if fa.directory is None:
        if IN_CI:
            pytest.fail(f'font-awesome is not installed in CI: {fa.note}')
        pytest.skip(fa.note)
    css = http('GET', f'{dashboard.url}{fa.url}')[2].decode()
    fonts = sorted(set(re.findall(r'url\(\.\./(webfonts/[^)]+\.woff2)\)', css)))
    assert fonts, 'no webfont referenced by all.min.css'
    for font in fonts:
        status, _, body = http('GET', f'{dashboard.url}{fa.route}/{font}')
        assert status == 200 and body, font


def test_app_files_are_served_and_nothing_outside_them(dashboard):
    status, headers, body = http('GET', f'{dashboard.url}/js/bundle.min.js')
    assert status == 200 and b'd3' in body and 'javascript' in headers.get('content-type', '')
    for path in ('/%2E%2E/flask_app.py', '/..%2Fflask_app.py', f'{LOCAL_PREFIX}/d3/%2E%2E/package.json'):
        status, _, body = http('GET', f'{dashboard.url}{path}')
        assert b'import' not in body and b'"version"' not in body, (path, body[:200])


def test_missing_asset_keeps_its_cdn_tag():
    html = (Path(__import__('labml_app').__file__).parent / 'static' / 'index.html').read_text()
    missing = find_assets(node_modules=[])  # no node_modules: every library comes from its CDN
    assert all(a.directory is None and 'npm ci' in a.note for a in missing), [a.note for a in missing]
    page, report = rewrite_index_html(html, missing)
    assert page == html
    for url in ('https://d3js.org/d3.v6.min.js', 'bootstrap@5.0.0-beta2/dist/css/bootstrap.min.css',
                'font-awesome/5.9.0/css/all.css'):
        assert url in page, url
    assert [line.split(':')[0] for line in report if ': from the CDN' in line] == ['d3', 'bootstrap', 'font-awesome']


def test_wrong_major_version_is_refused_with_the_reason(tmp_path):
    (tmp_path / 'bootstrap' / 'dist' / 'css').mkdir(parents=True)
    (tmp_path / 'bootstrap' / 'dist' / 'css' / 'bootstrap.min.css').write_text('body{}')
    (tmp_path / 'bootstrap' / 'package.json').write_text('{"version": "4.6.2"}')
    bootstrap = {a.name: a for a in find_assets(node_modules=[tmp_path])}['bootstrap']
    assert bootstrap.directory is None and 'bootstrap 4.6.2' in bootstrap.note and '5.x' in bootstrap.note


def test_the_pinned_versions_are_the_ones_the_page_names():
    """package.json pins each library at the version labml_app's index.html loads from its CDN."""
    import json
    html = (Path(__import__('labml_app').__file__).parent / 'static' / 'index.html').read_text()
    pins = json.loads((Path(__file__).resolve().parents[2] / 'package.json').read_text())['dependencies']
    assert f"bootstrap@{pins['bootstrap']}/" in html
    assert f"font-awesome/{pins['@fortawesome/fontawesome-free']}/" in html
    assert 'd3.v6' in html and pins['d3'].startswith('6.')
