"""
# Sweeps

`python -m labml_txl.sweep SCRIPT key=a,b ...` runs an experiment script over the product of lists of settings
(`grid`), one labml run and one process per point, continuing where it stopped (`runner`), then compares the runs
(`labml_txl.runs`). `run_sweep` does the same from Python with any list of points.
"""
from .grid import grid_points, parse_grid
from .runner import SweepResult, run_sweep

__all__ = ['grid_points', 'parse_grid', 'run_sweep', 'SweepResult']
