"""The run page in headless Chromium: the run and its loss chart are in the rendered DOM (`--dump-dom`), and the
page renders with the browser libraries served from this machine (asked over the DevTools pipe, `devtools.py`).

Needs Debian's `chromium` (`apt-get install -y chromium`). Without it the test skips, except in CI
(`CI` set), where it fails.
"""
import os
import re
import shutil
import subprocess

import pytest

pytest.importorskip('labml_app', reason="the dashboard extra is not installed: pip install -e '.[dashboard]'")

from labml_txl.dashboard.assets import find_assets  # noqa: E402

from .devtools import FLAGS as CHROMIUM_FLAGS, DevToolsPage  # noqa: E402

BROWSERS = ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable')


@pytest.fixture(scope='module')
def chromium():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    reason = 'headless Chromium not found (apt-get install -y chromium)'
    if os.environ.get('CI'):
        pytest.fail(f'{reason}; CI must run the browser test')
    pytest.skip(reason)


def render(chromium, url, profile_dir, budget_ms=15000, timeout=60, ready=None, attempts=3):
    """The DOM of `url` after the page's scripts ran for `budget_ms` of virtual time. With `ready` (a regular
    expression), the page is loaded again, up to `attempts` times, until its DOM matches: on a loaded machine the
    app's data requests can still be pending when the virtual time runs out (seen: 1 render in about 8)."""
    assert url.startswith('http://127.0.0.1:'), url
    for _ in range(attempts):
        out = subprocess.run([chromium, *CHROMIUM_FLAGS, f'--user-data-dir={profile_dir}',
                              f'--virtual-time-budget={budget_ms}', '--dump-dom', url],
                             capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        assert out.returncode == 0 and '<body' in out.stdout, \
            f'chromium failed ({out.returncode}):\n{out.stderr[-3000:]}'
        if ready is None or re.search(ready, out.stdout):
            break
    return out.stdout


def test_run_page_shows_the_run_and_its_loss_chart(chromium, dashboard, reported_run, tmp_path):
    uuid = reported_run['uuid']
    loss_series = r'<span class="title"[^>]*>loss</span>'
    dom = render(chromium, f'{dashboard.url}/run/{uuid}', tmp_path / 'profile', ready=loss_series)
    assert '<title>Run - dash_api' in dom, dom[:2000]
    assert re.search(r'<h3>\s*dash_api\s*</h3>', dom), 'run name missing from the run card'
    # The page is this run's (its URL holds the uuid and the app filled the card from that run's record); the
    # uuid itself appears in the page only inside the captured stdout, which labml uploads late and not reliably
    # the metrics card: an SVG chart whose raw line has one point per logged step, and the series titled loss
    assert re.search(loss_series, dom), 'no loss series in the chart legend'
    lines = re.findall(r'<path class="unsmoothed-line[^"]*"[^>]*\bd="([^"]+)"', dom)
    assert lines, 'no chart line in the rendered page'
    n_points = max(len(re.findall(r'[ML]', d)) + len(re.findall(r'C', d)) for d in lines)
    assert n_points == len(reported_run['losses']), (n_points, lines[0][:300])


def test_runs_list_shows_the_run(chromium, dashboard, reported_run, tmp_path):
    dom = render(chromium, f'{dashboard.url}/runs', tmp_path / 'profile', ready=f'href="/run/{reported_run["uuid"]}"')
    item = re.search(rf'<a [^>]*href="/run/{reported_run["uuid"]}"[^>]*>(.*?)</a>', dom, re.S)
    assert item, f'no link to the run in the runs list: {dom[-3000:]}'
    assert re.search(r'<h5>\s*dash_api\s*</h5>', item.group(1)) and 'completed' in item.group(1), item.group(1)


# What the app's own files cannot have done: each value comes from one of the three libraries
BOOTSTRAP_STYLE = """(() => ({
    blue: getComputedStyle(document.documentElement).getPropertyValue('--bs-blue').trim(),
    bodyMargin: getComputedStyle(document.body).margin,
    bodyLineHeight: getComputedStyle(document.body).lineHeight,
    navLinkDisplay: getComputedStyle(document.querySelector('.nav-link')).display,
}))()"""
ICONS = """[...document.querySelectorAll('.fas')].filter(e => e.getClientRects().length).map(e => ({
    classes: e.className, family: getComputedStyle(e).fontFamily, weight: getComputedStyle(e).fontWeight,
    glyph: getComputedStyle(e, '::before').content, width: e.getBoundingClientRect().width}))"""
LOADED_FONTS = "document.fonts.ready.then(() => [...document.fonts].filter(f => f.status === 'loaded')" \
               ".map(f => `${f.family} ${f.weight}`))"


def test_run_page_renders_with_the_local_libraries(chromium, dashboard, reported_run, tmp_path):
    """The run page as the labml app lays it out, with everything from this machine: d3 drew the chart, Bootstrap's
    rules apply, and the icons are Font Awesome 5's glyphs drawn with its solid font, fetched from the local route."""
    assets = {a.name: a for a in find_assets()}
    missing = [name for name, a in assets.items() if a.directory is None]
    assert not missing, f'not installed (npm ci): {[assets[name].note for name in missing]}'

    with DevToolsPage(chromium, tmp_path / 'profile') as page:
        page.open(f'{dashboard.url}/run/{reported_run["uuid"]}')
        page.wait_for("document.querySelector('path.unsmoothed-line') !== null && "
                      "document.querySelector('.fas.fa-chevron-left') !== null")
        fonts = page.evaluate(LOADED_FONTS)
        icons = page.evaluate(ICONS)
        style = page.evaluate(BOOTSTRAP_STYLE)
        fetched = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")

    local = [f'{dashboard.url}{a.url}' for a in assets.values()]
    assert set(local) <= set(fetched), (local, fetched)
    assert f'{dashboard.url}{assets["font-awesome"].route}/webfonts/fa-solid-900.woff2' in fetched, fetched
    assert all(url.startswith(dashboard.url) for url in fetched), fetched
    assert 'Font Awesome 5 Free 900' in fonts, fonts
    # The back, share and add buttons of the run page: FA 5's class names, each a private-use glyph of its font
    shown = {icon['classes'] for icon in icons}
    assert {'fas fa-chevron-left', 'fas fa-share-alt', 'fas fa-plus'} <= shown, icons
    for icon in icons:
        assert icon['family'] == '"Font Awesome 5 Free"' and icon['weight'] == '900', icon
        assert len(icon['glyph']) == 3 and 0xf000 <= ord(icon['glyph'][1]) <= 0xf8ff, icon
    assert all(icon['width'] > 0 for icon in icons if icon['classes'] != 'fas fa-sync'), icons
    # Bootstrap 5's variables and reboot (the browser's own defaults: no variable, 8px, normal, inline)
    assert style == {'blue': '#0d6efd', 'bodyMargin': '0px', 'bodyLineHeight': style['bodyLineHeight'],
                     'navLinkDisplay': 'block'}, style
    assert style['bodyLineHeight'] != 'normal', style
