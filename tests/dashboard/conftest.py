"""One dashboard and one reported run, shared by the dashboard tests of a session."""
import importlib.util
import os
import random

import pytest

from .helpers import DashboardServer, run_training

# Each test module skips itself without labml_app (`pytest.importorskip`); CI must have it.
if os.environ.get('CI') and importlib.util.find_spec('labml_app') is None:
    raise RuntimeError("CI must run the dashboard tests: pip install -e '.[dashboard]'")


@pytest.fixture(scope='session')
def dashboard(tmp_path_factory):
    """A dashboard on a free port of 127.0.0.1 with a fresh data dir; stopped after the session."""
    root = tmp_path_factory.mktemp('dashboard')
    server = DashboardServer(root / 'data').start()
    yield server
    server.stop()


@pytest.fixture(scope='session')
def reported_run(dashboard, tmp_path_factory):
    """A short training that reported to `dashboard`, with the configs and losses it logged."""
    rng = random.Random()
    overrides = {'lr': round(rng.uniform(0.05, 0.5), 4), 'd_model': rng.choice([16, 32, 64]),
                 'label': f'run{rng.randrange(1000)}'}
    return run_training(tmp_path_factory.mktemp('train'), dashboard.port, name='dash_api',
                        overrides=overrides, steps=12)
