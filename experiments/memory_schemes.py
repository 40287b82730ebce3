r"""
Memory mechanisms side by side: no memory, Transformer-XL's memory and the Compressive Transformer's compressed
memory, each trained on Tiny Shakespeare at an equal budget (the same model, steps, batches and learning-rate
schedule) and with an equal number of remembered positions per layer, then evaluated on the validation split at the
training length and at 4x and 8x it.

    python experiments/memory_schemes.py [max_step=2000] [memories=none,xl,compressive] [remembered=64]
        [compression_rate=4] [compression=conv] [lengths=1,4,8] [out=logs/memory_schemes] [port=5005]
        [dashboard=True] [key=value ...]

* `memories`: `none` (`mem_len = 0`: a token sees only the tokens before it in its own segment), `xl` (a memory
  of `remembered` hidden states per layer) and `compressive` (a memory of `remembered / 2` and a compressed memory of
  `remembered / 2`, each compressed row made of `compression_rate` memories by `compression`: the same number of
  keys per query as `xl`, reaching `remembered / 2 * (1 + compression_rate)` positions back, the paper's comparison
  at an equal attention cost).
* `lengths`: evaluation lengths as multiples of `tgt_len`. At length $E = k \cdot$ `tgt_len` the text is read in
  segments of $E$ tokens, and every memory is $k$ times as long as in training (`xl`'s `k * remembered`;
  `compressive`'s memory and compressed memory each `k * remembered / 2`), so the ratio of memory to segment is the
  training one.
* Other `key=value` pairs are settings of `train_xl.py` for every run (listed below), e.g. `attention=rotary`.

The training is a sweep (`labml_txl.sweep`) of `train_xl.py` over the memories: every run is a labml run of the
working directory's project tagged with the sweep, and started again with the same settings the sweep continues
where it stopped. The dashboard (started on `port` unless `dashboard=False`) follows the project's runs; the
compressive run's reconstruction loss is its `ar_loss.train`. Then every run is evaluated at each length. The table
of validation bits per character is printed and written to `out/results.md`, the numbers to `out/results.json`, and a
plot of bits per character against evaluation length to `out/memory_schemes.png`. `docs/transformer_xl.md` shows one
sitting's.
"""
import math
import sys
from pathlib import Path
from typing import Any, Dict, List

from labml_txl.cli import parse_overrides, run_script
from labml_txl.configs.settings import Settings
from labml_txl.configs.validation import default_of
from labml_txl.dashboard import DEFAULT_PORT
from labml_txl.errors import require_positive_int
from labml_txl.runs.records import RunRecord
from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.runs import load_trained_run

sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo  # noqa: E402
import eval_xl  # noqa: E402
from position_schemes import (MODEL, check_length_settings, choices_setting, length_plot, length_table,  # noqa: E402
                              sweep_and_evaluate, write_results)

# What each memory is, for the table
MEMORIES = {
    'none': 'no memory',
    'xl': "Transformer-XL's memory",
    'compressive': 'compressed memory',
}

# The experiment's own settings: type, default, what it is
EXPERIMENT = {'memories': ('list', list(MEMORIES), f"memory mechanisms, separated by commas: {', '.join(MEMORIES)}"),
              'remembered': ('int', 64, 'hidden states each layer keeps per sequence (xl: all memory; compressive: '
                                        'half memory, half compressed)'),
              'lengths': ('list', [1, 4, 8], 'evaluation lengths as multiples of tgt_len'),
              'out': ('str', 'logs/memory_schemes', 'where the table, numbers and plot are written'),
              'port': ('int', DEFAULT_PORT, "the dashboard's port"),
              'dashboard': ('bool', True, "start the dashboard first (it follows this project's runs)")}
SETTINGS = Settings(TrainXLConfigs, MODEL, extra=EXPERIMENT)


def check_settings(settings: Dict[str, Any], overrides: Dict[str, Any]) -> Dict[str, Any]:
    """The experiment's own settings, checked (with the compression rate they must fit) before any run starts."""
    settings = {**{key: default for key, (_, default, _) in EXPERIMENT.items()}, **settings}
    memories = choices_setting('memories', settings['memories'], MEMORIES)
    remembered = settings['remembered']
    require_positive_int('remembered', remembered)
    rate = overrides.get('compression_rate', default_of(TrainXLConfigs(), 'compression_rate'))
    if 'compressive' in memories and (remembered % 2 or remembered // 2 < rate):
        raise ValueError(f"remembered={remembered} is not accepted with compression_rate={rate}: the compressive "
                         f"run keeps remembered / 2 memories and remembered / 2 compressed ones, so remembered must "
                         f"be even and remembered / 2 at least compression_rate")
    return {**settings, 'memories': memories, 'lengths': check_length_settings(settings)}

def memory_lengths(memory: str, remembered: int) -> Dict[str, int]:
    """`mem_len` and `cmem_len` of a memory mechanism keeping `remembered` hidden states per layer."""
    return {'none': {'mem_len': 0, 'cmem_len': 0},
            'xl': {'mem_len': remembered, 'cmem_len': 0},
            'compressive': {'mem_len': remembered // 2, 'cmem_len': remembered // 2}}[memory]


def sweep_points(settings: Dict[str, Any], overrides: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One `train_xl.py` run per memory: the model, the overrides, one evaluation at the end."""
    config = {**MODEL, **overrides}
    config.setdefault('eval_interval', config['max_step'])
    return [{**config, **memory_lengths(memory, settings['remembered'])} for memory in settings['memories']]


def memory_of(conf: TrainXLConfigs) -> str:
    """The memory mechanism of a trained run's configs."""
    return 'compressive' if conf.cmem_len > 0 else 'xl' if conf.mem_len > 0 else 'none'


def evaluate_at_lengths(record: RunRecord, lengths: List[int]) -> Dict[str, Any]:
    """A trained run's validation bits per character at each of `lengths` times its `tgt_len`, its memories `k` times
    as long (see the module docstring)."""
    conf, step = load_trained_run(record.uuid)
    bpc = {}
    for k in lengths:
        result = eval_xl.evaluate(conf.model, conf.corpus, 'valid', tgt_len=k * conf.tgt_len, mem_len=k * conf.mem_len,
                                  clamp_len=conf.clamp_len, same_length=conf.same_length, batch_size=conf.batch_size,
                                  cmem_len=k * conf.cmem_len if conf.cmem_len else None)
        bpc[k] = result['loss'] / math.log(2)
    return {'memory': memory_of(conf), 'mem_len': conf.mem_len, 'cmem_len': conf.cmem_len,
            'compression_rate': conf.compression_rate, 'compression': conf.compression, 'bpc': bpc,
            'run': record.uuid, 'steps': step, 'tgt_len': conf.tgt_len,
            'minutes': (record.updated - record.started) / 60}


def describe(result: Dict[str, Any]) -> str:
    """The memories of a result, for the table: their lengths, and how far back they reach."""
    if result['memory'] == 'none':
        return 'none'
    if result['memory'] == 'xl':
        return f"{result['mem_len']}"
    reach = result['mem_len'] + result['compression_rate'] * result['cmem_len']
    return (f"{result['mem_len']} + {result['cmem_len']} compressed ({result['compression']}, rate "
            f"{result['compression_rate']}; reaching {reach})")


def results_table(results: List[Dict[str, Any]], lengths: List[int]) -> str:
    """The results as a Markdown table: a row per memory, a column per evaluation length."""
    return length_table(results, lengths, {'memory': lambda r: MEMORIES[r['memory']],
                                           'remembered per layer': describe})


def plot(results: List[Dict[str, Any]], lengths: List[int], path: Path) -> None:
    """Bits per character against evaluation length, a line per memory mechanism."""
    length_plot(results, lengths, path, 'Memory mechanisms',
                lambda r: {'label': f"{MEMORIES[r['memory']]} ({describe(r)})"})


def compare(args: List[str]) -> List[Dict[str, Any]]:
    overrides = parse_overrides(args, SETTINGS)
    settings = check_settings({k: overrides.pop(k) for k in list(overrides) if k in EXPERIMENT}, overrides)
    chosen = sorted({'mem_len', 'cmem_len'} & set(overrides))
    if chosen:
        raise ValueError(f"{' and '.join(chosen)} are set by the experiment per run: choose them with memories= and "
                         f"remembered=")
    if settings['dashboard']:
        print(demo.start_dashboard(settings['port']))
    sweep, results = sweep_and_evaluate(sweep_points(settings, overrides),
                                        lambda record: evaluate_at_lengths(record, settings['lengths']))
    results.sort(key=lambda r: list(MEMORIES).index(r['memory']))
    write_results(results, results_table(results, settings['lengths']), Path(settings['out']), 'memory_schemes.png',
                  lambda path: plot(results, settings['lengths'], path))
    if sweep.exit_code != 0:
        raise SystemExit(sweep.exit_code)
    return results

if __name__ == '__main__':
    sys.exit(run_script(compare, sys.argv[1:], __doc__, settings=SETTINGS))
