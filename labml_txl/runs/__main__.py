"""
python -m labml_txl.runs: list, show, compare and plot the runs of a labml project.

Runs are looked up in the labml project of the working directory (the nearest folder above it with a
`.labml.yaml`, else the working directory itself: where `python experiments/train_xl.py` writes them); `--project
DIR` reads another project's. A run is named by its UUID or by a start of it that only it has. A user error (a
missing run, runs of different scripts, a metric no run has, a plot it cannot write, matplotlib missing) prints
`error: ...` and exits 2.
"""
import argparse
import sys
from typing import List, Optional

from .plots import MatplotlibMissingError, PlotPathError, UnknownMetricError, plot_runs, require_matplotlib
from .records import MixedScriptsError, RunLookupError, check_same_script, experiments_folder, find_runs, load_runs
from .tables import comparison_table, runs_table, show_text

EPILOG = """examples:
  python -m labml_txl.runs list
  python -m labml_txl.runs list --sweep 3f2a --full
  python -m labml_txl.runs show 4a579f9e
  python -m labml_txl.runs compare 4a579f9e 5b1c20d4 6c0e9f11
  python -m labml_txl.runs plot 4a579f9e 5b1c20d4 --metric loss.valid --out valid.png

docs/runs.md explains the columns and how statuses and metrics are read."""


def _parser() -> argparse.ArgumentParser:
    # --project is taken before or after the subcommand
    project = argparse.ArgumentParser(add_help=False)
    project.add_argument('--project', metavar='DIR', default=argparse.SUPPRESS,
                         help="read the runs of the labml project of DIR (default: the working directory's)")
    parser = argparse.ArgumentParser(prog='python -m labml_txl.runs', parents=[project],
                                     description=__doc__.split('\n', 2)[2].strip(), epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)

    listing = commands.add_parser('list', parents=[project], help='a table of every run, first started first',
                                  description='One line per run, first started first: uuid, name, comment (the '
                                              'overrides that differ from the defaults), status (completed, '
                                              'interrupted, crashed, running: a process holds its lock, unfinished: '
                                              'it never ended), step (the last step of loss.train), the last '
                                              'loss.train and loss.valid, and age (since its first start).')
    listing.add_argument('--sweep', metavar='ID', help='only the runs of sweep ID (tagged sweep:ID)')
    listing.add_argument('--name', metavar='NAME', help='only the runs of experiment NAME (the script: train_xl)')
    listing.add_argument('--full', action='store_true', help='whole UUIDs and comments')

    show = commands.add_parser('show', parents=[project], help='one run: where it lies, its configs and metrics',
                               description="Where the run lies, its name, comment, tags and status, its resolved "
                                           "configs (configs.yaml; * marks the overridden items) and the last value "
                                           "of each metric.")
    show.add_argument('uuid', metavar='UUID', help='the run (a start of its UUID that only it has will do)')

    compare = commands.add_parser('compare', parents=[project], help='the configs that differ between runs, and '
                                                                     'their final metrics',
                                  description='One line per run: the config items whose values differ between the '
                                              'runs (* after a value the run was given in its overrides), then its '
                                              'step, last loss.train, last and smallest loss.valid.')
    compare.add_argument('uuids', metavar='UUID', nargs='+', help='two runs or more')
    compare.add_argument('--any-script', action='store_true',
                         help='compare runs of different scripts too (refused otherwise)')
    compare.add_argument('--full', action='store_true', help='whole UUIDs and values')

    plot = commands.add_parser('plot', parents=[project], help="the runs' curves, as a PNG",
                               description='Each metric against the step, one panel per metric, every run labelled '
                                           'by the settings that differ between the runs. Prints the path of the '
                                           'image it wrote.')
    plot.add_argument('uuids', metavar='UUID', nargs='+', help='one run or more')
    plot.add_argument('--metric', metavar='NAME', action='append', dest='metrics',
                      help='a metric to draw (repeat for more; default: loss.train and loss.valid)')
    plot.add_argument('--out', metavar='FILE.png',
                      help="where to write the image: a file whose suffix names its format (.png where it has "
                           "none; .pdf, .svg and the other formats of matplotlib), or a folder (default: "
                           "logs/plots/<metrics>-<uuids>.png in the project)")
    plot.add_argument('--any-script', action='store_true', help='plot runs of different scripts together')
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    project = getattr(args, 'project', None)
    try:
        if args.command == 'list':
            print(runs_table(load_runs(project, sweep=args.sweep, name=args.name), full=args.full))
        elif args.command == 'show':
            print(show_text(find_runs([args.uuid], project)[0]))
        elif args.command == 'compare':
            if len(args.uuids) < 2:
                raise RunLookupError(f'compare takes two runs or more, not {len(args.uuids)}')
            records = find_runs(args.uuids, project)
            if not args.any_script:
                check_same_script(records)
            print(comparison_table(records, full=args.full))
        elif args.command == 'plot':
            require_matplotlib()
            records = find_runs(args.uuids, project)
            if not args.any_script:
                check_same_script(records)
            plot = plot_runs(records, args.metrics, out=args.out, experiments=experiments_folder(project))
            print(plot.path)
    except (RunLookupError, MixedScriptsError, UnknownMetricError, PlotPathError, MatplotlibMissingError) as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
