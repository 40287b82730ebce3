"""Run `python -m labml_txl.dashboard` and a small labml training as subprocesses, and talk to the app's API.

Everything binds to and talks only to 127.0.0.1; every wait is bounded; `DashboardServer.stop` ends what
`start` began.
"""
import base64
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

HOST = '127.0.0.1'
HTTP_TIMEOUT = 10


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: Optional[Dict[str, Any]] = None):
    """One request to 127.0.0.1; returns `(status, headers, bytes)`; HTTP errors come back as their status."""
    assert url.startswith(f'http://{HOST}:'), url
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def api(method: str, port: int, path: str, body: Optional[Dict[str, Any]] = None):
    """JSON from `/api/v1/<path>`; fails the test on any status but 200."""
    status, _, content = http(method, f'http://{HOST}:{port}/api/v1/{path}', body)
    assert status == 200, f'{method} /api/v1/{path} -> {status}: {content[:300]!r}'
    return json.loads(content)


def decode_series(encoded: str) -> List[float]:
    """The app sends a series' steps and values as base64 of little-endian float32."""
    return np.frombuffer(base64.b64decode(encoded), dtype='<f4').tolist()


def start_refused(data_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m labml_txl.dashboard --port <free port> --data-dir <data_dir> <args>`, which must refuse to start:
    its exit, with its output; a dashboard still running after `timeout` s fails the test."""
    try:
        return subprocess.run([sys.executable, '-m', 'labml_txl.dashboard', '--port', str(free_port()),
                               '--data-dir', str(data_dir), *args],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode(errors='replace') if isinstance(e.stdout, bytes) else e.stdout
        raise AssertionError(f'the dashboard started (still running after {timeout} s): {output}') from e


class DashboardServer:
    """`python -m labml_txl.dashboard --port PORT --data-dir DIR` in a subprocess, following the runs of `project`
    (`--project`), or of none (`--no-follow`, the default here: tests of live reports see only their runs)."""

    def __init__(self, data_dir: Path, port: Optional[int] = None, log_path: Optional[Path] = None,
                 project: Optional[Path] = None, extra_args: Sequence[str] = ()):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.log_path = Path(log_path or self.data_dir.parent / f'dashboard-{self.port}.log')
        self.project = project
        self.extra_args = list(extra_args)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f'http://{HOST}:{self.port}'

    def log(self) -> str:
        return self.log_path.read_text(errors='replace') if self.log_path.exists() else ''

    def start(self, timeout: float = 40) -> 'DashboardServer':
        self._log_file = open(self.log_path, 'ab')
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'labml_txl.dashboard', '--port', str(self.port), '--data-dir', str(self.data_dir),
             *(['--project', str(self.project)] if self.project is not None else ['--no-follow']), *self.extra_args],
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f'dashboard exited with {self.proc.returncode}:\n{self.log()}')
            try:
                if http('GET', f'{self.url}/api/v1/runs/null')[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f'dashboard not up on port {self.port} after {timeout}s:\n{self.log()}')

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, '_log_file', None):
            self._log_file.close()
            self._log_file = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


TRAIN_SCRIPT = textwrap.dedent('''
    """A tiny labml training that reports to the dashboard; prints one JSON line of what it logged."""
    import json
    import os
    import sys

    from labml import experiment, tracker
    from labml.configs import BaseConfigs

    spec = json.loads(sys.argv[1])
    if spec['via'] == 'helper':
        from labml_txl.dashboard import report_to_dashboard
        report_to_dashboard(spec['port'])
    # else: the environment's labml_app_url points at the dashboard


    class TinyConfigs(BaseConfigs):
        lr: float = 0.1
        d_model: int = 8
        label: str = 'unset'


    conf = TinyConfigs()
    experiment.create(name=spec['name'], writers={'screen', 'app'})
    experiment.configs(conf, spec['overrides'])
    losses = {}
    with experiment.start():
        for step in range(1, spec['steps'] + 1):
            loss = conf.lr * conf.d_model / step + len(conf.label) / 100
            losses[step] = loss
            tracker.save(step, {'loss': loss})
    print('RESULT ' + json.dumps({'uuid': experiment.get_uuid(), 'losses': losses,
                                 'configs': {'lr': conf.lr, 'd_model': conf.d_model, 'label': conf.label}}))
''')


def run_training(workdir: Path, port: int, name: str, overrides: Dict[str, Any], steps: int,
                 via: str = 'helper', timeout: float = 60) -> Dict[str, Any]:
    """Run `TRAIN_SCRIPT` in `workdir` (labml's logs land there); return its uuid, losses and configs."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / 'tiny_train.py'
    script.write_text(TRAIN_SCRIPT)
    env = dict(os.environ)
    env.pop('labml_app_url', None)
    if via == 'env':
        from labml_txl.dashboard import web_api_url
        env['labml_app_url'] = web_api_url(port)
    spec = {'port': port, 'name': name, 'overrides': overrides, 'steps': steps, 'via': via}
    out = subprocess.run([sys.executable, str(script), json.dumps(spec)], cwd=str(workdir), env=env,
                         capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f'training failed ({out.returncode}):\n{out.stdout}\n{out.stderr}'
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith('RESULT ')]
    assert lines, f'training printed no result:\n{out.stdout}\n{out.stderr}'
    result = json.loads(lines[-1][len('RESULT '):])
    result['losses'] = {int(k): v for k, v in result['losses'].items()}
    return result


# -- runs of a project, trained with no dashboard (tests/dashboard/test_project_runs.py)

REPO = Path(__file__).resolve().parents[2]
TINY_XL = ['n_layer=1', 'd_model=32', 'n_head=2', 'd_head=16', 'd_inner=64', 'tgt_len=16', 'mem_len=16',
           'batch_size=4', 'eval_interval=15', 'max_eval_steps=5']


def train_xl(project: Path, *args: str, timeout: float = 600) -> str:
    """Run `experiments/train_xl.py` with `args` in the labml project `project` (made a project by its
    `.labml.yaml`), reporting to no dashboard; returns its output."""
    project.mkdir(parents=True, exist_ok=True)
    if not (project / '.labml.yaml').exists():
        (project / '.labml.yaml').write_text('check_repo_dirty: false\n')
    env = {k: v for k, v in os.environ.items() if k != 'labml_app_url'}
    out = subprocess.run([sys.executable, str(REPO / 'experiments' / 'train_xl.py'), *args], cwd=str(project),
                         env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f'train_xl failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}'
    return out.stdout


def run_folders(project: Path) -> List[Path]:
    return sorted(p for p in (project / 'logs').glob('*/*') if (p / 'run.yaml').is_file())


def following(port: int) -> Dict[str, Any]:
    """What the dashboard's project follower says: its project, scans done and each run's state."""
    status, _, content = http('GET', f'http://{HOST}:{port}/api/labml_txl/following')
    assert status == 200, content
    return json.loads(content)


def wait_until(what: str, check, timeout: float = 120, every: float = 0.25):
    """Call `check()` until it returns something true, and return that; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f'not within {timeout} s: {what}')
        time.sleep(every)


def wait_for_scans(server: 'DashboardServer', n: int = 2, timeout: float = 120) -> None:
    """Wait until the follower has made `n` more scans (each one after the import of what it found)."""
    start = following(server.port)['scans']
    wait_until(f'{n} scans of the project ({server.log()[-2000:]})',
               lambda: following(server.port)['scans'] >= start + n, timeout)


def series(port: int, run_uuid: str) -> Dict[str, Dict[str, List[float]]]:
    """`{name: {'step': [...], 'value': [...]}}` of every series of the run, from the API of the metrics chart."""
    data = api('POST', port, f'metrics/{run_uuid}', {'get_all': True})
    return {s['name']: {'step': decode_series(s['step']), 'value': decode_series(s['value'])} for s in data['series']}


def listed_runs(port: int) -> Dict[str, Dict[str, Any]]:
    """The runs of the Runs page (its API), by uuid."""
    return {r['run_uuid']: r for r in api('GET', port, 'runs/null')['runs']}


def send(method: str, url: str, body: bytes, content_type: str = 'application/json'):
    """`(status, content)` of a request with a raw body, the error answers included."""
    request = urllib.request.Request(url, data=body, method=method, headers={'Content-Type': content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def error_message(content: bytes) -> str:
    """The `error` of a JSON error answer."""
    return json.loads(content)['error']
