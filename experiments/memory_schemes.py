r"""
Memory mechanisms side by side: no memory, Transformer-XL's memory, the Compressive Transformer's compressed memory,
the Recurrent Memory Transformer's memory tokens (alone and with Transformer-XL's memory) and the Memorizing
Transformer's kNN memory (with Transformer-XL's memory), each trained on Tiny
Shakespeare at an equal budget (the same model, training tokens, batches and learning-rate schedule) and with an
equal number of remembered states a query attends to beyond its segment, then evaluated on the validation split at
the training length and at 4x and 8x it.

    python experiments/memory_schemes.py [max_step=2000] [memories=none,xl,compressive,rmt,rmt_xl,knn] [remembered=64]
        [compression_rate=4] [compression=conv] [bptt_segments=2] [lengths=1,4,8] [out=logs/memory_schemes]
        [port=5005] [dashboard=True] [key=value ...]

* `memories`: `none` (`mem_len = 0`: a token sees only the tokens before it in its own segment), `xl` (a memory
  of `remembered` hidden states per layer) and `compressive` (a memory of `remembered / 2` and a compressed memory of
  `remembered / 2`, each compressed row made of `compression_rate` memories by `compression`: the same number of
  keys per query as `xl`, reaching `remembered / 2 * (1 + compression_rate)` positions back, the paper's comparison
  at an equal attention cost), `rmt` (`remembered` memory tokens, no Transformer-XL memory: each token attends to
  the `remembered` read tokens and the tokens before it) and `rmt_xl` (a memory of `remembered / 2` and `remembered /
  2` memory tokens, the paper's "RMT + XL") and `knn` (a memory of `remembered / 2`, and one kNN layer near the top
  whose queries attend also to their `remembered / 2` nearest of `8 * remembered` stored keys: `remembered` states
  beyond the segment for that layer's queries, `remembered / 2` for the others'). The memory tokens are trained through `bptt_segments` segments per step,
  so their runs take `max_step / bptt_segments` steps (and warm-up) of that many segments: the same training tokens.
* `lengths`: evaluation lengths as multiples of `tgt_len`. At length $E = k \cdot$ `tgt_len` the text is read in
  segments of $E$ tokens, and every memory is $k$ times as long as in training (`xl`'s `k * remembered`;
  `compressive`'s memory and compressed memory each `k * remembered / 2`; `knn`'s memory and store), so the ratio of
  memory to segment is the training one; the number of memory tokens, and of neighbours, stays the one trained.
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
    'rmt': 'memory tokens (RMT)',
    'rmt_xl': "memory tokens and Transformer-XL's memory (RMT + XL)",
    'knn': "kNN memory and Transformer-XL's memory",
}
# The kNN memory's store, in multiples of `remembered`
KNN_STORE = 8

# The experiment's own settings: type, default, what it is
EXPERIMENT = {'memories': ('list', list(MEMORIES), f"memory mechanisms, separated by commas: {', '.join(MEMORIES)}"),
              'remembered': ('int', 64, 'hidden states each layer keeps per sequence (xl: all memory; compressive: '
                                        'half memory, half compressed)'),
              'bptt_segments': ('int', 2, 'segments the memory tokens are trained through per step (rmt, rmt_xl)'),
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
    require_positive_int('bptt_segments', settings['bptt_segments'])
    rate = overrides.get('compression_rate', default_of(TrainXLConfigs(), 'compression_rate'))
    if 'compressive' in memories and (remembered % 2 or remembered // 2 < rate):
        raise ValueError(f"remembered={remembered} is not accepted with compression_rate={rate}: the compressive "
                         f"run keeps remembered / 2 memories and remembered / 2 compressed ones, so remembered must "
                         f"be even and remembered / 2 at least compression_rate")
    for memory, half in (('rmt_xl', 'memory tokens'), ('knn', 'neighbours of each query')):
        if memory in memories and (remembered % 2 or remembered < 2):
            raise ValueError(f"remembered={remembered} is not accepted with {memory}: it keeps remembered / 2 "
                             f"memories and remembered / 2 {half}, so remembered must be even")
    return {**settings, 'memories': memories, 'lengths': check_length_settings(settings)}

def memory_lengths(memory: str, remembered: int) -> Dict[str, int]:
    """The memory settings of a mechanism keeping `remembered` states a query attends to beyond its segment (the
    kNN layer's queries, for `knn`); every other mechanism off."""
    half = remembered // 2
    off = {'mem_len': 0, 'cmem_len': 0, 'n_mem_tokens': 0, 'knn_mem_size': 0}
    return {**off, **{'none': {},
                      'xl': {'mem_len': remembered},
                      'compressive': {'mem_len': half, 'cmem_len': half},
                      'rmt': {'n_mem_tokens': remembered},
                      'rmt_xl': {'mem_len': half, 'n_mem_tokens': half},
                      'knn': {'mem_len': half, 'knn_mem_size': KNN_STORE * remembered, 'knn_k': half}}[memory]}


def sweep_points(settings: Dict[str, Any], overrides: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One `train_xl.py` run per memory: the model, the overrides, one evaluation at the end; the memory tokens' runs
    with `bptt_segments` segments a step, and as many times fewer steps."""
    config = {**MODEL, **overrides}
    config.setdefault('eval_interval', config['max_step'])
    points = []
    for memory in settings['memories']:
        point = {**config, **memory_lengths(memory, settings['remembered'])}
        if point['n_mem_tokens'] > 0:
            bptt = settings['bptt_segments']
            point.update(bptt_segments=bptt, **{key: max(1, point[key] // bptt)
                                                for key in ('max_step', 'eval_interval', 'warmup_step',
                                                            'checkpoint_interval') if key in point})
        points.append(point)
    return points


def memory_of(conf: TrainXLConfigs) -> str:
    """The memory mechanism of a trained run's configs."""
    if conf.knn_mem_size > 0:
        return 'knn'
    if conf.n_mem_tokens > 0:
        return 'rmt_xl' if conf.mem_len > 0 else 'rmt'
    return 'compressive' if conf.cmem_len > 0 else 'xl' if conf.mem_len > 0 else 'none'


def evaluate_at_lengths(record: RunRecord, lengths: List[int]) -> Dict[str, Any]:
    """A trained run's validation bits per character at each of `lengths` times its `tgt_len`, its memories `k` times
    as long (see the module docstring)."""
    conf, step = load_trained_run(record.uuid)
    bpc = {}
    for k in lengths:
        result = eval_xl.evaluate(conf.model, conf.corpus, 'valid', tgt_len=k * conf.tgt_len, mem_len=k * conf.mem_len,
                                  clamp_len=conf.clamp_len, same_length=conf.same_length, batch_size=conf.batch_size,
                                  cmem_len=k * conf.cmem_len if conf.cmem_len else None,
                                  knn_mem_size=k * conf.knn_mem_size if conf.knn_mem_size else None)
        bpc[k] = result['loss'] / math.log(2)
    return {'memory': memory_of(conf), 'mem_len': conf.mem_len, 'cmem_len': conf.cmem_len,
            'compression_rate': conf.compression_rate, 'compression': conf.compression,
            'n_mem_tokens': conf.n_mem_tokens, 'bptt_segments': conf.bptt_segments, 'knn_mem_size': conf.knn_mem_size,
            'knn_k': conf.knn_k, 'bpc': bpc,
            'run': record.uuid, 'steps': step, 'tgt_len': conf.tgt_len,
            'minutes': (record.updated - record.started) / 60}


def describe(result: Dict[str, Any]) -> str:
    """The memories of a result, for the table: their lengths, and how far back they reach."""
    if result['memory'] == 'none':
        return 'none'
    if result['memory'] == 'xl':
        return f"{result['mem_len']}"
    if result['memory'] in ('rmt', 'rmt_xl'):
        tokens = f"{result['n_mem_tokens']} memory tokens (BPTT over {result['bptt_segments']} segments)"
        return tokens if result['memory'] == 'rmt' else f"{result['mem_len']} + {tokens}"
    if result['memory'] == 'knn':
        return f"{result['mem_len']} + the {result['knn_k']} nearest of {result['knn_mem_size']} stored (one layer)"
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
    chosen = sorted(set(memory_lengths('knn', 2)) & set(overrides))
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
