"""
# Plotting runs' metrics

`plot_runs` draws a metric's curve for every run, one panel per metric, each run in one colour in every panel and
labelled by the settings that tell it apart (`compare.run_labels`: `attention=alibi mem_len=0`), and writes a PNG.
It draws with matplotlib's Agg canvas, without pyplot: no display is needed and no global backend is changed.
matplotlib is in the test environment (`requirements/test.lock`) and in the `experiments` extra
(`pip install -e '.[experiments]'`), not among the package's own dependencies.
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


class UnknownMetricError(LookupError):
    """A metric that none of the runs has."""

    def __str__(self):
        return str(self.args[0])


@dataclass
class Plot:
    """
    What `plot_runs` drew.

    Args:
        path: the PNG it wrote.
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


def default_plot_path(experiments: Path, records: Sequence[RunRecord], metrics: Sequence[str]) -> Path:
    """`<experiments>/plots/<metrics>-<uuid starts>.png` (at most four UUIDs named, then how many more)."""
    uuids = [record.uuid[:8] for record in records]
    named = '-'.join(uuids[:4]) + (f'-and-{len(uuids) - 4}-more' if len(uuids) > 4 else '')
    return experiments / PLOTS_FOLDER / f"{'_'.join(metrics)}-{named}.png"


def plot_runs(records: Sequence[RunRecord], metrics: Optional[Sequence[str]] = None, out: Optional[PathLike] = None,
              experiments: Optional[Path] = None) -> Plot:
    """
    Draw each metric of every run against the step, one panel per metric, and write a PNG.

    Args:
        records: the runs (`find_runs`).
        metrics: the metrics to draw; None for `loss.train` and `loss.valid` (those any run has). A metric no run
            has is an `UnknownMetricError` that names the metrics the runs have.
        out: the PNG to write (its folder is made); None for `default_plot_path` under `experiments`.
        experiments: the project's experiments folder, for the default path; None for that of the first run.

    Returns:
        A `Plot`: the path written, the metrics and the legend's labels.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as error:  # pragma: no cover - matplotlib is in the test environment
        raise ImportError("plotting needs matplotlib: pip install matplotlib (or -e '.[experiments]')") from error
    if not records:
        raise ValueError('no runs to plot')
    metrics = chosen_metrics(records, metrics)
    labels = run_labels(records)
    if out is None:
        out = default_plot_path(experiments or records[0].path.parent.parent, records, metrics)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

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
    figure.savefig(out, dpi=100)
    return Plot(path=out, metrics=metrics, labels=[text.get_text() for text in legend.get_texts()])
