"""experiments/memory_schemes.py on tiny settings: a sweep of train_xl.py in which every memory mechanism trains with
the lengths it stands for and is evaluated at each length, the evaluation at the training length equals the run's own
last validation (kept in its log.jsonl), and the table, the numbers and the plot are written; bad settings are
refused before any run."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import memory_schemes  # noqa: E402

from labml_txl.runs.records import find_runs  # noqa: E402
from labml_txl.train.runs import load_trained_run  # noqa: E402
from test_position_schemes import TINY  # noqa: E402


def test_a_tiny_comparison_writes_its_table_numbers_and_plot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / 'out'
    results = memory_schemes.compare(['max_step=3', 'remembered=8', 'compression_rate=2', 'lengths=1,2',
                                      f'out={out}', 'dashboard=False'] + TINY)
    assert [r['memory'] for r in results] == ['none', 'xl', 'compressive', 'rmt', 'rmt_xl', 'knn']
    lengths = {r['memory']: (r['mem_len'], r['cmem_len'], r['n_mem_tokens'], r['knn_mem_size']) for r in results}
    assert lengths == {'none': (0, 0, 0, 0), 'xl': (8, 0, 0, 0), 'compressive': (4, 4, 0, 0), 'rmt': (0, 0, 8, 0),
                       'rmt_xl': (4, 0, 4, 0), 'knn': (4, 0, 0, 64)}
    for r in results:
        assert set(r['bpc']) == {1, 2} and all(math.isfinite(v) and v > 0 for v in r['bpc'].values())
        # The evaluation at the training length is the run's own last validation, computed by another process
        record, = find_runs([r['run']], tmp_path)
        # (the memory tokens' runs: steps of bptt_segments=2 segments, 3 // 2 of them: the same training tokens)
        tokens = r['n_mem_tokens'] > 0
        assert r['steps'] == (1 if tokens else 3) and r['bptt_segments'] == (2 if tokens else 1)
        assert any(tag.startswith('sweep:train_xl-') for tag in record.tags)
        assert r['bpc'][1] == pytest.approx(record.last('loss.valid') / math.log(2), rel=1e-9)
        conf, _ = load_trained_run(r['run'])
        assert (conf.mem_len, conf.cmem_len, conf.n_mem_tokens, conf.knn_mem_size,
                conf.compression_rate) == (*lengths[r['memory']], 2)
        assert conf.knn_k == (4 if r['memory'] == 'knn' else 32)
        # The compressive run trained its compression and reported it apart
        assert (record.last('ar_loss.train') is not None) == (r['memory'] == 'compressive')
    table = (out / 'results.md').read_text()
    assert '| memory | remembered per layer | 8 (1x) | 16 (2x) | minutes |' in table
    assert '| compressed memory | 4 + 4 compressed (conv, rate 2; reaching 12) |' in table
    assert '| memory tokens (RMT) | 8 memory tokens (BPTT over 2 segments) |' in table
    assert ("| memory tokens and Transformer-XL's memory (RMT + XL) | 4 + 4 memory tokens (BPTT over 2 segments) |"
            in table)
    assert "| kNN memory and Transformer-XL's memory | 4 + the 4 nearest of 64 stored (one layer) |" in table
    assert len(json.loads((out / 'results.json').read_text())) == 6
    assert (out / 'memory_schemes.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('argument, message', [
    ('memories=xl,compresive', r"memories \['compresive'\] are not accepted: 'none', 'xl', 'compressive', 'rmt', "
                               r"'rmt_xl' or 'knn'"),
    ('lengths=0,4', r"lengths=.* is not accepted: positive multiples of tgt_len"),
    ('remembered=6', r"remembered=6 is not accepted with compression_rate=4: .* remembered / 2 at least "
                     r"compression_rate"),
    ('mem_len=64', r"mem_len are set by the experiment per run"),
])
def test_bad_settings_are_refused_before_any_run(argument, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        memory_schemes.compare([argument, 'dashboard=False'])
    assert not (tmp_path / 'logs').exists()


def test_memory_tokens_with_xl_need_an_even_number_remembered(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"remembered=7 is not accepted with rmt_xl: .* remembered must be even"):
        memory_schemes.compare(['memories=rmt_xl', 'remembered=7', 'dashboard=False'])
    assert not (tmp_path / 'logs').exists()
