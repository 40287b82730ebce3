"""The labml dashboard on this machine, `python -m labml_txl.dashboard` (`server.py`), and its parts: the file store,
the locally served page assets, and the project follower.

* `store`  puts labml_app's models and indexes in files under a data directory, in place of MongoDB.
* `assets` finds d3 v6, Bootstrap and Font Awesome on this machine and rewrites the app's page to load
  them from local routes, leaving a public CDN link only for what is missing.
* `local_runs` makes the runs reported to the dashboard the local user's; `request_checks` answers bad requests.
* `project_runs` imports the run folders of a labml project into the store and follows them, reading them through
  `labml_txl.runs.files`, as `python -m labml_txl.runs` reads them.

`server.py` assembles them with labml_app; nothing here imports labml_app at import time.
"""
from .server import (DEFAULT_PORT, LOCAL_TOKEN, DashboardError, check_port, following, report_to_dashboard, run_url,
                     start_in_background, web_api_url)

__all__ = ['DEFAULT_PORT', 'LOCAL_TOKEN', 'DashboardError', 'check_port', 'following', 'report_to_dashboard', 'run_url',
           'start_in_background', 'web_api_url']
