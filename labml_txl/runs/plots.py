"""
# Plotting runs' metrics

`plot_runs` draws a metric's curve for every run, one panel per metric, each run in one colour in every panel and
labelled by the settings that tell it apart (`compare.run_labels`: `attention=alibi mem_len=0`), and writes an
image: a PNG, or any other format matplotlib writes, chosen by the file's suffix (`.pdf`, `.svg`, ...).
It draws with matplotlib's Agg canvas, without pyplot: no display is needed and no global backend is changed.
matplotlib is in the test environment (`requirements/test.lock`) and in the `experiments` extra
(`pip install -e '.[experiments]'`), not among the package's own dependencies: `require_matplotlib` checks for it,
so that a sweep can refuse before its first run rather than fail at its plot.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .compare import LOSS_TRAIN, LOSS_VALID, run_labels
from .records import PathLike, RunRecord

# The metrics drawn when none is asked for (those of them that any of the runs has)
DEFAULT_METRICS = (LOSS_TRAIN, LOSS_VALID)
# Where under a project's experiments folder (`logs`) a plot goes by default
PLOTS_FOLDER = 'plots'


class PlotPathError(ValueError):
    """A place the plot cannot be written: a suffix no image format has, or a file the system refuses."""


class MatplotlibMissingError(ImportError):
    """matplotlib, which plotting needs, is not installed."""


class UnknownMetricError(LookupError):
    """A metric that none of the runs has."""

    def __str__(self):
        return str(self.args[0])


@dataclass
class Plot:
    """
    What `plot_runs` drew.

    Args:
        path: the image it wrote.
        metrics: the metrics, one panel each, left to right.
        labels: the legend's labels, one per run in the order of the runs, as read back from the figure.
    """
    path: Path
    metrics: List[str]
    labels: List[str]


def available_metrics(records: Sequence[RunRecord]) -> List[str]:
    """Every metric that at least one of `records` has, in alphabetical order."""
    return sorted(set().union(*(record.metrics for record in records))) if records else []


def chosen_metrics(records: Sequence[RunRecord], metrics: Optional[Sequence[str]] = None) -> List[str]:
    """`metrics`, or an `UnknownMetricError` naming those no run has and the metrics the runs have; where `metrics` is
    None, those of `DEFAULT_METRICS` that any run has."""
    have = available_metrics(records)
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS if m in have]
        if not metrics:
            raise UnknownMetricError(f"none of the runs has {' or '.join(DEFAULT_METRICS)}: "
                                     f"they have {', '.join(have) or 'no metrics at all (no log.jsonl)'}")
        return metrics
    unknown = [m for m in metrics if m not in have]
    if unknown:
        raise UnknownMetricError(f"no run has the metric{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(repr(m) for m in unknown)}: "
                                 f"the runs have {', '.join(have) or 'no metrics at all (no log.jsonl)'}")
    return list(dict.fromkeys(metrics))


def require_matplotlib() -> None:
    """A `MatplotlibMissingError` saying how to install matplotlib where it is missing; nothing where it is there."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise MatplotlibMissingError("plotting needs matplotlib: pip install matplotlib "
                                     "(or -e '.[experiments]')") from error


def image_formats() -> List[str]:
    """The suffixes matplotlib writes an image for (`png`, `pdf`, `svg`, ...), in alphabetical order."""
    from matplotlib.backend_bases import FigureCanvasBase
    return sorted(FigureCanvasBase.get_supported_filetypes())


def plot_path(out: Optional[PathLike], default: Path) -> Path:
    """
    Where the plot goes: `default` where `out` is None; `out/<default's name>` where `out` is a folder; `out` with
    `.png` added where it has no suffix (matplotlib would add it, and we would name a file it did not write); `out`
    where its suffix is an image format (`image_formats`); else a `PlotPathError` naming the formats.
    """
    if out is None:
        return default
    out = Path(out)
    if out.is_dir():
        return out / default.name
    if not out.suffix:
        return out.with_name(out.name + '.png')
    formats = image_formats()
    if out.suffix[1:].lower() not in formats:
        raise PlotPathError(f"cannot write a plot to {str(out)!r}: {out.suffix} is no image format; give a name "
                            f"ending in .png, or another of {', '.join('.' + f for f in formats)}, or a folder")
    return out


def _write(figure, path: Path) -> None:
    """`figure` saved to `path` (its folder made), in the format its suffix names; a `PlotPathError` naming the
    file and the system's reason when the system refuses (a read-only file system, a file where a folder should be,
    a full disk)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100, format=path.suffix[1:].lower())
    except OSError as error:
        raise PlotPathError(f'cannot write the plot to {str(path)!r}: {error.strerror or error}') from error


def default_plot_path(experiments: Path, records: Sequence[RunRecord], metrics: Sequence[str]) -> Path:
    """`<experiments>/plots/<metrics>-<uuid starts>.png` (at most four UUIDs named, then how many more)."""
    uuids = [record.uuid[:8] for record in records]
    named = '-'.join(uuids[:4]) + (f'-and-{len(uuids) - 4}-more' if len(uuids) > 4 else '')
    return experiments / PLOTS_FOLDER / f"{'_'.join(metrics)}-{named}.png"


def plot_runs(records: Sequence[RunRecord], metrics: Optional[Sequence[str]] = None, out: Optional[PathLike] = None,
              experiments: Optional[Path] = None) -> Plot:
    """
    Draw each metric of every run against the step, one panel per metric, and write an image.

    Args:
        records: the runs (`find_runs`).
        metrics: the metrics to draw; None for `loss.train` and `loss.valid` (those any run has). A metric no run
            has is an `UnknownMetricError` that names the metrics the runs have.
        out: the image to write, its format chosen by its suffix (`plot_path`: `.png` where it has none; a folder
            gets the default name; its folder is made); None for `default_plot_path` under `experiments`. A
            suffix no format has, or a file the system refuses, is a `PlotPathError` naming the file.
        experiments: the project's experiments folder, for the default path; None for that of the first run.

    Returns:
        A `Plot`: the path written, the metrics and the legend's labels.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    if not records:
        raise ValueError('no runs to plot')
    metrics = chosen_metrics(records, metrics)
    labels = run_labels(records)
    out = plot_path(out, default_plot_path(experiments or records[0].path.parent.parent, records, metrics))

    figure = Figure(figsize=(6.4 * len(metrics), 4.8 + 0.25 * len(records)), layout='constrained')
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(metrics), squeeze=False)[0]
    colors = [f'C{i % 10}' for i in range(len(records))]
    for ax, metric in zip(axes, metrics):
        for record, color in zip(records, colors):
            series = record.metrics.get(metric)
            if not series:
                continue
            steps, values = zip(*series)
            ax.plot(steps, values, color=color, linewidth=1.2, marker='o' if len(series) <= 20 else None,
                    markersize=3)
        ax.set_xlabel('step')
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=color, label=label) for color, label in zip(colors, labels)]
    legend = figure.legend(handles=handles, loc='outside lower center', ncols=1 if len(records) > 6 else 2,
                           fontsize='small')
    _write(figure, out)
    return Plot(path=out, metrics=metrics, labels=[text.get_text() for text in legend.get_texts()])
