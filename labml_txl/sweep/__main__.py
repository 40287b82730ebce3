"""
Run an experiment script over the product of lists of settings, one labml run per point, and compare the runs.

    python -m labml_txl.sweep experiments/train_xl.py attention=relative,rotary,alibi mem_len=0,64 max_step=500

Stopped part-way (Ctrl-C) and started again with the same arguments, it continues: completed runs are not run
again, an interrupted one resumes from its checkpoint (also after a resume by hand: a resumed run keeps its tag),
and one killed before its first checkpoint starts again. At the end it prints the comparison of the sweep's runs, one
per point (`python -m labml_txl.runs compare`), and writes it, with a plot of `--metric`, to `logs/sweeps/<id>/` in
the working directory's labml project. One process at a time runs a sweep: started again while it runs, it is
refused (exit code 2), naming the process that holds `logs/sweeps/<id>/sweep.lock`.
"""
import argparse
import sys
from pathlib import Path
from typing import List, Optional

from .grid import grid_points, parse_grid
from .runner import run_sweep


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='python -m labml_txl.sweep', description=__doc__.strip().split('\n\n')[0],
                                     epilog=__doc__.strip().split('\n\n', 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('script', help='the experiment script (a file), e.g. experiments/train_xl.py')
    parser.add_argument('settings', nargs='*', metavar='key=v1,v2,...',
                        help="the script's settings; a list separated by commas is swept over")
    parser.add_argument('--metric', default='loss.valid', help='the metric to plot (default loss.valid)')
    parser.add_argument('--dry-run', action='store_true',
                        help="print the command of every run still to do, a line of shell each with the sweep's "
                             "tag in its environment (for a launcher of your own), and exit")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse_args(argv)
    try:
        points = grid_points(parse_grid(args.settings))
    except ValueError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    return run_sweep(Path(args.script), points, metric=args.metric, dry_run=args.dry_run).exit_code


if __name__ == '__main__':
    sys.exit(main())
