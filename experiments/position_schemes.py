r"""
Positional schemes side by side: each trained on Tiny Shakespeare with and without Transformer-XL's memory at an
equal budget (the same model, steps, batches and learning-rate schedule), then evaluated on the validation split at
the training length and at 4x and 8x it.

    python experiments/position_schemes.py [max_step=2000] [schemes=absolute,absolute_deeper,relative,rotary,alibi,t5_bias]
        [memory=both] [lengths=1,4,8] [out=logs/position_schemes] [port=5005] [dashboard=True] [key=value ...]

* `schemes`: attention variants of `TransformerXLConfigs.attention` (`docs/configs.md`): `absolute` (fixed
  sinusoids added to the input), `absolute_deeper` (learned positions added to every layer), `relative` (the
  paper's), `rotary`, `alibi`, `t5_bias`, and `learnable`.
* `memory`: `both`, `with` (`mem_len = tgt_len`) or `without` (`mem_len = 0`).
* `lengths`: evaluation lengths as multiples of `tgt_len`. At length $E$ a run without memory reads the validation
  text in segments of $E$ tokens (a token sees up to $E$ before it, $E/2$ on average: what ALiBi's paper measures);
  a run with memory reads segments of $E$ with a memory of $E$ (the training ratio), so every token sees at least
  $E$ before it. `absolute_deeper` has learned positions for the training window only: beyond it, the original
  reuses its first row (`positions/learned_relative.last_rows`).
* Other `key=value` pairs are settings of `train_xl.py` for every run (listed below), e.g. `tgt_len=128`.

The training is a sweep (`labml_txl.sweep`) of `train_xl.py` over the schemes and memories: every run is a labml
run of the working directory's project tagged with the sweep, and started again with the same settings the sweep
continues where it stopped. The dashboard (started on `port` unless `dashboard=False`) follows the project's runs.
Then every run is evaluated at each length. The table of validation bits per character is printed and written to
`out/results.md`, the numbers to `out/results.json`, and a plot of bits per character against evaluation length
to `out/position_schemes.png`. `docs/position_schemes.md` shows one sitting's.
"""
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

from labml_txl.cli import list_setting, parse_overrides, run_script
from labml_txl.dashboard import DEFAULT_PORT, check_port
from labml_txl.errors import describe_choices
from labml_txl.runs.records import RunRecord
from labml_txl.configs.settings import Settings
from labml_txl.sweep import run_sweep
from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.runs import load_trained_run

sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo  # noqa: E402
import eval_xl  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / 'train_xl.py'

# What each scheme is, for the table
SCHEMES = {
    'absolute': 'absolute, fixed sinusoids added to the input',
    'absolute_deeper': 'absolute, learned, added to every layer',
    'relative': "relative (Transformer-XL's)",
    'learnable': 'relative, learned table',
    'rotary': 'rotary (RoFormer)',
    'alibi': 'ALiBi',
    't5_bias': 'T5 bias',
}
DEFAULT_SCHEMES = ['absolute', 'absolute_deeper', 'relative', 'rotary', 'alibi', 't5_bias']

# The demo's small model and schedule (`demo.py`), the same for every run, evaluated once at the end; no position
# embedding is added to the input but by the absolute schemes themselves (Transformer-XL's attention types add their
# own)
MODEL = {'n_layer': 4, 'd_model': 128, 'n_head': 4, 'd_head': 32, 'd_inner': 512, 'dropout': 0.0, 'dropatt': 0.0,
         'pre_lnorm': True, 'tgt_len': 64, 'batch_size': 16, 'lr': 0.006, 'warmup_step': 200, 'max_step': 2000,
         'checkpoint_interval': 500}

# The experiment's own settings: type, default, what it is
EXPERIMENT = {'schemes': ('list', DEFAULT_SCHEMES, f"attention variants, separated by commas: {', '.join(SCHEMES)}"),
              'memory': ('str', 'both', "'both', 'with' (mem_len = tgt_len) or 'without' (mem_len = 0)"),
              'lengths': ('list', [1, 4, 8], 'evaluation lengths as multiples of tgt_len'),
              'out': ('str', 'logs/position_schemes', 'where the table, numbers and plot are written'),
              'port': ('int', DEFAULT_PORT, "the dashboard's port"),
              'dashboard': ('bool', True, "start the dashboard first (it follows this project's runs)")}
SETTINGS = Settings(TrainXLConfigs, MODEL, extra=EXPERIMENT)


def check_settings(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The experiment's own settings, checked before any run starts."""
    settings = {**{key: default for key, (_, default, _) in EXPERIMENT.items()}, **settings}
    schemes = choices_setting('schemes', settings['schemes'], SCHEMES)
    if settings['memory'] not in ('both', 'with', 'without'):
        raise ValueError(f"memory={settings['memory']!r} is not accepted: 'both', 'with' or 'without'")
    return {**settings, 'schemes': schemes, 'lengths': check_length_settings(settings)}


def choices_setting(name: str, value: Any, choices: Dict[str, str]) -> List[str]:
    """The setting `name`'s `value` as a list of names of `choices` (`list_setting`), or a `ValueError` naming those
    that are not."""
    names = list_setting(name, value, str)
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise ValueError(f"{name} {unknown} are not accepted: {describe_choices(choices)}")
    return names


def check_length_settings(settings: Dict[str, Any]) -> List[int]:
    """The settings every comparison by evaluation length takes, checked: `lengths` (returned, sorted),
    `dashboard` and `port`."""
    lengths = list_setting('lengths', settings['lengths'], int)
    if any(k < 1 for k in lengths):
        raise ValueError(f"lengths={settings['lengths']!r} is not accepted: positive multiples of tgt_len")
    if not isinstance(settings['dashboard'], bool):
        raise ValueError(f"dashboard={settings['dashboard']!r} is not accepted: True or False")
    check_port(settings['port'])
    return sorted(set(lengths))


def sweep_points(settings: Dict[str, Any], overrides: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One `train_xl.py` run per scheme and memory: the model, the overrides, one evaluation at the end."""
    memories = {'both': [False, True], 'with': [True], 'without': [False]}[settings['memory']]
    config = {**MODEL, **overrides}
    config.setdefault('eval_interval', config['max_step'])
    return [{**config, 'attention': scheme, 'mem_len': config['tgt_len'] if memory else 0}
            for scheme in settings['schemes'] for memory in memories]


def evaluate_at_lengths(record: RunRecord, lengths: List[int]) -> Dict[str, Any]:
    """A trained run's validation bits per character at each of `lengths` times its `tgt_len`, with a memory of
    the same length where it trained with one (the trainer's own validation, at 1x)."""
    conf, step = load_trained_run(record.uuid)
    memory = conf.mem_len > 0
    bpc = {}
    for k in lengths:
        length = k * conf.tgt_len
        result = eval_xl.evaluate(conf.model, conf.corpus, 'valid', tgt_len=length, mem_len=length if memory else 0,
                                  clamp_len=conf.clamp_len, same_length=conf.same_length,
                                  batch_size=conf.batch_size)
        bpc[k] = result['loss'] / math.log(2)
    return {'scheme': conf.attention, 'memory': memory, 'bpc': bpc, 'run': record.uuid, 'steps': step,
            'tgt_len': conf.tgt_len, 'minutes': (record.updated - record.started) / 60}


def results_table(results: List[Dict[str, Any]], lengths: List[int]) -> str:
    """The results as a Markdown table: a row per scheme and memory, a column per evaluation length."""
    return length_table(results, lengths, {'scheme': lambda r: SCHEMES[r['scheme']],
                                           'memory': lambda r: f"{r['tgt_len']}" if r['memory'] else 'none'})


def length_table(results: List[Dict[str, Any]], lengths: List[int],
                 columns: Dict[str, Callable[[Dict[str, Any]], str]]) -> str:
    """A Markdown table of `results`: the `columns` (header: what a result shows there), then a column of bits per
    character per evaluation length, then the run's minutes."""
    tgt_len = results[0]['tgt_len']
    header = list(columns) + [f'{k * tgt_len} ({k}x)' for k in lengths] + ['minutes']
    rule = ['---'] * len(columns) + ['---:'] * (len(lengths) + 1)
    rows = ['| ' + ' | '.join(header) + ' |', '| ' + ' | '.join(rule) + ' |']
    for r in results:
        rows.append('| ' + ' | '.join([show(r) for show in columns.values()] + [f"{r['bpc'][k]:.3f}" for k in lengths]
                                      + [f"{r['minutes']:.1f}"]) + ' |')
    return '\n'.join(rows)


def plot(results: List[Dict[str, Any]], lengths: List[int], path: Path) -> None:
    """Bits per character against evaluation length, a colour per scheme, solid with memory and dashed without."""
    colours = {}

    def line(r: Dict[str, Any]) -> Dict[str, Any]:
        return {'color': colours.setdefault(r['scheme'], f'C{len(colours)}'),
                'linestyle': '-' if r['memory'] else '--',
                'label': f"{SCHEMES[r['scheme']]}, {'memory' if r['memory'] else 'no memory'}"}

    length_plot(results, lengths, path, 'Positional schemes', line, legend_outside=True)


def length_plot(results: List[Dict[str, Any]], lengths: List[int], path: Path, title: str,
                line: Callable[[Dict[str, Any]], Dict[str, Any]], legend_outside: bool = False) -> None:
    """Bits per character of each result against evaluation length (a log scale), its line's style and label
    `line(result)`, written to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10 if legend_outside else 8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    x = [k * results[0]['tgt_len'] for k in lengths]
    for r in results:
        axes.plot(x, [r['bpc'][k] for k in lengths], marker='o', **line(r))
    axes.set_xscale('log', base=2)
    axes.set_xticks(x, [str(v) for v in x])
    axes.set_xlabel(f"evaluation length (tokens; trained at {results[0]['tgt_len']})")
    axes.set_ylabel('validation bits per character')
    axes.set_title(f"{title} on Tiny Shakespeare, {results[0]['steps']} steps each")
    axes.grid(True, alpha=0.3)
    if legend_outside:
        axes.legend(fontsize=8, loc='center left', bbox_to_anchor=(1.02, 0.5))
    else:
        axes.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches='tight')


def compare(args: List[str]) -> List[Dict[str, Any]]:
    overrides = parse_overrides(args, SETTINGS)
    settings = check_settings({k: overrides.pop(k) for k in list(overrides) if k in EXPERIMENT})
    if 'attention' in overrides or 'mem_len' in overrides:
        raise ValueError("attention and mem_len are set by the experiment per run: choose them with schemes= and "
                         "memory=")
    if settings['dashboard']:
        print(demo.start_dashboard(settings['port']))
    sweep, results = sweep_and_evaluate(sweep_points(settings, overrides),
                                        lambda record: evaluate_at_lengths(record, settings['lengths']))
    order = {(scheme, memory): i for i, (scheme, memory) in
             enumerate((s, m) for s in settings['schemes'] for m in (False, True))}
    results.sort(key=lambda r: order[(r['scheme'], r['memory'])])
    write_results(results, results_table(results, settings['lengths']), Path(settings['out']), 'position_schemes.png',
                  lambda path: plot(results, settings['lengths'], path))
    if sweep.exit_code != 0:
        raise SystemExit(sweep.exit_code)
    return results


def sweep_and_evaluate(points: List[Dict[str, Any]], evaluate: Callable[[RunRecord], Dict[str, Any]]):
    """The sweep of `train_xl.py` over `points` (it checks every run's settings before the first starts), and
    `evaluate` of each run that finished, even where a later run failed (the sweep named it); exits where none
    finished."""
    sweep = run_sweep(SCRIPT, points)
    finished = [record for record in sweep.records if record.status == 'completed']
    if not finished:
        raise SystemExit(sweep.exit_code or 1)
    return sweep, [evaluate(record) for record in finished]


def write_results(results: List[Dict[str, Any]], table: str, out: Path, plot_name: str,
                  draw: Callable[[Path], None]) -> None:
    """The Markdown `table` to `out/results.md`, the `results` to `out/results.json` and the plot `draw` makes to
    `out/plot_name`; the table printed, with the minutes of the runs."""
    out.mkdir(parents=True, exist_ok=True)
    (out / 'results.md').write_text(table + '\n')
    (out / 'results.json').write_text(json.dumps(results, indent=1) + '\n')
    draw(out / plot_name)
    print('\nValidation bits per character by evaluation length (tokens):\n')
    print(table)
    print(f"\nTotal {sum(r['minutes'] for r in results):.1f} minutes of runs; written to {out}/results.md, "
          f"results.json and {plot_name}")

if __name__ == '__main__':
    sys.exit(run_script(compare, sys.argv[1:], __doc__, settings=SETTINGS))
