"""
# Runs: list, show, compare and plot the runs of a labml project

`python -m labml_txl.runs list | show | compare | plot` (`docs/runs.md`). The same, as functions:

* `files`: the files of a run folder, read as both this package and the dashboard (`labml_txl.dashboard`)
  read them: where a project's runs are, its run folders, their YAML and JSON lines, a run's metrics
  (`read_metrics`, with the values a resumed run wrote last);
* `records`: reading a run folder into a `RunRecord` (`read_run`), every run of a project (`load_runs`), runs by
  UUID or UUID prefix (`find_runs`);
* `compare`: the config items that differ between runs (`differing_items`), labels made of them (`run_labels`), a
  run's final metrics (`final_metrics`);
* `tables`: the text tables (`runs_table`, `show_text`, `comparison_table`);
* `plots`: the curves of runs as an image (`plot_runs`).

This package reads runs; `labml_txl.train.runs` finds the folder of a run to resume or evaluate.
"""
from .compare import FINAL_METRICS, differing_items, final_metrics, run_labels
from .files import read_metrics
from .plots import MatplotlibMissingError, Plot, PlotPathError, UnknownMetricError, plot_runs
from .records import (ConfigValue, MixedScriptsError, RunLookupError, RunRecord, check_same_script,
                      experiments_folder, find_runs, load_runs, read_configs, read_run)
from .tables import comparison_table, runs_table, show_text

__all__ = ['FINAL_METRICS', 'differing_items', 'final_metrics', 'run_labels', 'Plot', 'UnknownMetricError',
           'plot_runs', 'ConfigValue', 'MixedScriptsError', 'RunLookupError', 'RunRecord', 'check_same_script',
           'experiments_folder', 'find_runs', 'load_runs', 'read_configs', 'read_metrics', 'read_run',
           'MatplotlibMissingError', 'PlotPathError', 'comparison_table', 'runs_table', 'show_text']
