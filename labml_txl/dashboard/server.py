"""The labml dashboard on this machine: `python -m labml_txl.dashboard [--port N] [--data-dir DIR] [--project DIR]`.

Runs the real labml app (PyPI `labml-app`, this package's `dashboard` extra) on 127.0.0.1 with its data in
files under `--data-dir` (default `~/.labml_txl/dashboard`) instead of a MongoDB server, and serves the
page's d3 / Bootstrap / Font Awesome from local installs (see `labml_txl.dashboard.assets`).

It shows every run of a labml project (`--project`, by default the project of the working directory): it imports
the run folders under the project's `logs/` and keeps following them, so runs trained while it was down are there,
and runs training now show a few seconds behind (`labml_txl.dashboard.project_runs`).

A training script can also report to it live, when labml's `app_url` points at `web_api_url(port)`:

    from labml_txl.dashboard import report_to_dashboard
    report_to_dashboard()                 # before experiment.create(); or set labml_app_url / .labml.yaml
    experiment.create(name='glu')

Runs stay in the data directory until deleted in the UI (or with `PUT /api/v1/runs`). See docs/dashboard.md.
"""
import argparse
import errno
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import List, Optional, Sequence, Union

HOST = '127.0.0.1'
DEFAULT_PORT = 5005
DEFAULT_DATA_DIR = Path('~/.labml_txl/dashboard')
DATA_DIR_ENV = 'LABML_TXL_DASHBOARD_DIR'
APP_URL_ENV = 'labml_app_url'  # what labml 0.5.3 reads when no `app_url` is configured
# The token segment of `web_api_url`: on this dashboard it names the local user's project, so a run reported
# there is claimed on arrival and listed under Runs (see labml_txl.dashboard.local_runs).
LOCAL_TOKEN = 'default'


class DashboardError(RuntimeError):
    """The dashboard cannot start: a bad argument, a busy port or a missing dependency."""


def check_port(port: int) -> int:
    """Return `port` if it is an int in 1..65535, else raise `ValueError` naming it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f'port={port!r} is not accepted: a port number from 1 to 65535')
    return port


def web_api_url(port: int = DEFAULT_PORT, host: str = HOST) -> str:
    """The URL labml's `app_url` takes to report to the dashboard on `port`.

    labml appends `track?run_uuid=...` to it. Its token, `LOCAL_TOKEN`, is the local user's project, so runs
    reported to it are listed under Runs and can be deleted there.
    """
    return f'http://{host}:{check_port(port)}/api/v1/{LOCAL_TOKEN}'


def run_url(run_uuid: str, port: int = DEFAULT_PORT, host: str = HOST) -> str:
    """The page of one run on the dashboard."""
    if not isinstance(run_uuid, str) or not run_uuid:
        raise ValueError(f'run_uuid: expected a non-empty string, got {run_uuid!r}')
    return f'http://{host}:{check_port(port)}/run/{run_uuid}'


def report_to_dashboard(port: int = DEFAULT_PORT, host: str = HOST, require_running: bool = True) -> str:
    """Make labml runs of this process report to the dashboard (call before `experiment.create`).

    Same as `app_url: <web_api_url(port)>` in `.labml.yaml` or `labml_app_url=<web_api_url(port)>` in the
    environment. With `require_running` (the default) it raises `DashboardError` when nothing listens on
    `host:port`: labml would otherwise train, then retry for minutes at exit. Returns the URL.
    """
    from labml import lab
    url = web_api_url(port, host)
    error = connection_error(host, port) if require_running else None
    if error is not None:
        raise DashboardError(f'no dashboard on {host}:{port} ({error.strerror or error}); start it with '
                             f'`python -m labml_txl.dashboard --port {port}`, or pass '
                             f'require_running=False') from error
    lab.configure({'app_url': url})
    return url


def connection_error(host: str, port: int, timeout: float = 2.0) -> Optional[OSError]:
    """`None` when something accepts a TCP connection on `host:port` within `timeout` seconds, else the error of
    the attempt (for the message that says why a dashboard is not reached)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError as error:
        return error


def _listening(port: int, host: str = HOST) -> bool:
    return connection_error(host, port, timeout=1) is None


def check_project(project: Union[str, Path]) -> Path:
    """
    `project` resolved, or a `ValueError` naming it when it is not an existing folder.

    Args:
        project: the folder of a labml project (its runs are under its `logs/`).
    """
    path = Path(project).expanduser()
    if not path.exists():
        raise ValueError(f'project: {str(path)!r} does not exist; give the folder of a labml project (the one '
                         f'holding its logs/ folder), or leave --project out to follow the working directory\'s')
    if not path.is_dir():
        raise ValueError(f'project: {str(path)!r} is not a folder; give the folder of a labml project')
    return path.resolve()


def default_project(cwd: Optional[Path] = None) -> Path:
    """
    The labml project of the working directory: the nearest folder above it with a `.labml.yaml`, else the folder
    itself, as `labml_txl.train.runs.project_root` finds it for training.

    Args:
        cwd: the working directory; default the process's.
    """
    from ..train.runs import project_root
    return project_root(Path(cwd or Path.cwd()).resolve())


def following(port: int, host: str = HOST) -> Optional[str]:
    """
    The project the dashboard on `port` follows, None when it follows none (or does not say: an older one).

    Args:
        port: the dashboard's port.
        host: its address.
    """
    import json
    import urllib.request
    try:
        with urllib.request.urlopen(f'http://{host}:{check_port(port)}/api/labml_txl/following', timeout=5) as r:
            return json.loads(r.read()).get('project')
    except (OSError, ValueError):
        return None


def start_in_background(port: int, data_dir: Union[str, Path], log: Union[str, Path],
                        project: Union[str, Path, None] = None) -> str:
    """
    Start the dashboard in a process of its own on `port`, its runs in `data_dir` and its output appended to
    `log`, and wait until it answers (at most 60 s); or find the one already listening there. It keeps running after
    this process ends. Returns a line to print: its process id and how to stop it, or which project the dashboard
    already running follows.

    Args:
        port: its port on 127.0.0.1.
        data_dir: its store (`--data-dir`).
        log: the file its output is appended to.
        project: the labml project whose runs it shows (`--project`); None: the project of the working directory.
    """
    check_port(port)
    project = check_project(project) if project is not None else None
    if _listening(port):
        followed = following(port)
        if project is not None and followed is not None and Path(followed) != project:
            return (f'the dashboard already running on port {port} follows the runs of {followed}, not of {project}: '
                    f'stop it to have these shown')
        return f'the dashboard already running on port {port}' + (f' (runs of {followed})' if followed else '')
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, '-m', 'labml_txl.dashboard', '--port', str(port), '--data-dir', str(data_dir)]
    if project is not None:
        command += ['--project', str(project)]
    process = subprocess.Popen(command, stdout=open(log, 'a'), stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(120):
        if _listening(port):
            return f'dashboard process {process.pid} (stop it with `kill {process.pid}`; its log: {log})'
        if process.poll() is not None:
            raise DashboardError(f'the dashboard did not start (exit code {process.returncode}); see {log}')
        time.sleep(0.5)
    raise DashboardError(f'the dashboard did not answer on port {port} within 60 s; see {log}')


def check_port_free(port: int, host: str = HOST) -> None:
    """Raise `DashboardError` naming `host:port` when something already listens there."""
    check_port(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            why = 'is already in use' if e.errno == errno.EADDRINUSE else f'cannot be bound ({e.strerror})'
            raise DashboardError(f'port {port} on {host} {why}; stop what listens there or pass '
                                 f'--port with another port') from e


def _import_labml_app(data_dir: Path, port: int):
    """Import labml_app with its Mongo set-up swapped for the file store under `data_dir`."""
    if 'labml_app.flask_app' in sys.modules:
        raise DashboardError('labml_app is already imported in this process; create_app runs once per process')
    os.environ['LABML_APP_SERVER_IP'] = HOST  # read by labml_app.settings at import
    os.environ['LABML_APP_SERVER_PORT'] = str(port)
    try:
        import labml_app.db as app_db
    except ImportError as e:
        raise DashboardError(f'the dashboard needs the labml app ({e}); install it with '
                             f"`pip install -e '.[dashboard]'` (or `pip install labml-app`)") from e
    from .store import init_file_db

    def init_file_store(*_args, **_kwargs):
        """What `init_mongo_db` does, on files; plus `LOCAL_TOKEN` naming the local user's project."""
        init_file_db(data_dir, app_db.models, app_db.indexes)
        app_db.project.create_project(app_db.settings.FLOAT_PROJECT_TOKEN, 'float project')
        app_db.project.create_project(app_db.settings.SAMPLES_PROJECT_TOKEN, 'samples project')
        local_user = app_db.user.get_or_create_user(identifier='local', is_local_user=True)
        app_db.project.ProjectIndex.set(LOCAL_TOKEN, local_user.projects[0])

    app_db.init_mongo_db = init_file_store  # flask_app calls db.init_mongo_db() when imported
    import labml_app.flask_app as flask_app
    return flask_app


def create_app(data_dir: Union[str, Path], port: int = DEFAULT_PORT, project: Union[str, Path, None] = None,
               scan_seconds: float = 2.0):
    """The ASGI app: labml_app on the file store under `data_dir`, behind the local-asset page, with runs
    reported to `web_api_url` claimed by the local user, and the runs of `project` imported and followed while the
    server runs (`labml_txl.dashboard.project_runs`; None: no project followed).

    Returns `(app, report)`, `report` saying where the data, each page library and the runs come from.
    Once per process: labml_app keeps its set-up in module state.

    Args:
        data_dir: the store.
        port: the port it is served on (labml_app's settings take it).
        project: the labml project whose runs it shows, or None.
        scan_seconds: how often the project's runs are looked at again.
    """
    from .assets import LocalPageApp, find_assets, rewrite_index_html
    from .local_runs import ClaimForToken
    from .project_runs import PROGRESS_FILE, FollowProject, ProjectFollower, read_progress
    from .request_checks import RequestChecks
    from .store import check_data_dir
    from ..runs.files import experiments_dir

    check_port(port)
    data_dir = check_data_dir(data_dir)
    project = check_project(project) if project is not None else None
    if project is not None:
        read_progress(data_dir / PROGRESS_FILE)  # a damaged record refuses the start before labml_app is imported
    # labml_app starts every new series with numpy's mean of no values, which warns on stderr for each
    warnings.filterwarnings('ignore', message='Mean of empty slice', category=RuntimeWarning, module=r'numpy\.')
    warnings.filterwarnings('ignore', message='invalid value encountered in scalar divide', category=RuntimeWarning,
                            module=r'numpy\.')
    flask_app = _import_labml_app(data_dir, port)
    static_dir = Path(flask_app.STATIC_PATH)
    assets = find_assets()
    html, report = rewrite_index_html((static_dir / 'index.html').read_text(encoding='utf-8'), assets)
    labml_app = ClaimForToken(flask_app.app, LOCAL_TOKEN)
    follower = None
    if project is not None:
        follower = ProjectFollower(project, data_dir, labml_app, LOCAL_TOKEN, scan_seconds=scan_seconds)
        report.append(f'runs: every run of the project {project} (its run folders under '
                      f'{experiments_dir(project)}), followed every {scan_seconds:g} s')
    else:
        report.append('runs: only those reported live (no project followed)')
    app = RequestChecks(LocalPageApp(FollowProject(labml_app, follower), static_dir, html, assets))
    return app, [f'data: {data_dir}'] + report


def serve(port: int = DEFAULT_PORT, data_dir: Union[str, Path, None] = None, log_level: str = 'warning',
          project: Union[str, Path, None] = None, scan_seconds: float = 2.0) -> None:
    """
    Start the dashboard on 127.0.0.1:`port` and block until interrupted.

    Args:
        port: its port on 127.0.0.1.
        data_dir: its store (default `$LABML_TXL_DASHBOARD_DIR`, else `~/.labml_txl/dashboard`).
        log_level: uvicorn's and labml_app's (`info` logs every request).
        project: the labml project whose runs it imports and follows; None: only runs reported live.
        scan_seconds: how often the project's run folders are looked at again.
    """
    import logging
    from .store import check_data_dir, lock_store
    check_port_free(port)
    project = check_project(project) if project is not None else None
    data_dir = check_data_dir(data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)
    # Held until the process ends: one dashboard per store
    store_lock = lock_store(data_dir)
    app, report = create_app(data_dir, port, project, scan_seconds)
    logging.getLogger('LabML logger').setLevel(log_level.upper())  # labml_app logs every request at INFO
    try:
        import uvicorn
    except ImportError as e:
        raise DashboardError("the dashboard needs uvicorn; `pip install -e '.[dashboard]'`") from e
    for line in report:
        print(f'labml_txl.dashboard: {line}', flush=True)
    print(f'labml_txl.dashboard: http://{HOST}:{port}/ (runs report to app_url {web_api_url(port)})', flush=True)
    try:
        uvicorn.run(app, host=HOST, port=port, log_level=log_level, access_log=log_level == 'debug')
    finally:
        store_lock.release()


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='python -m labml_txl.dashboard', description=__doc__.split('\n\n')[0])
    p.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'port on {HOST} (default {DEFAULT_PORT})')
    p.add_argument('--data-dir', default=None,
                   help=f'where runs are kept (default ${DATA_DIR_ENV} or {DEFAULT_DATA_DIR})')
    follow = p.add_mutually_exclusive_group()
    follow.add_argument('--project', default=None,
                        help='the labml project whose runs it shows: it imports every run folder under its logs/ '
                             'and follows them (default: the project of the working directory, the nearest folder '
                             'above it with a .labml.yaml, else the working directory)')
    follow.add_argument('--no-follow', action='store_true',
                        help='follow no project: show only the runs reported to it live')
    p.add_argument('--scan-seconds', type=float, default=2.0,
                   help="how often the project's run folders are looked at again (default 2)")
    p.add_argument('--log-level', default='warning', choices=['debug', 'info', 'warning', 'error'])
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse_args(argv)
    try:
        project = None if args.no_follow else check_project(args.project) if args.project else default_project()
        serve(args.port, args.data_dir, args.log_level, project, args.scan_seconds)
    except (DashboardError, ValueError) as e:
        print(f'labml_txl.dashboard: error: {e}', file=sys.stderr)
        return 2
    return 0

