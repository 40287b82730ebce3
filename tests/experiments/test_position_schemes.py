"""experiments/position_schemes.py on tiny settings: a sweep of train_xl.py in which every scheme and memory setting
trains and is evaluated at each length, the evaluation at the training length equals the run's own last validation
(kept in its log.jsonl), and the table, the numbers and the plot are written; bad settings are refused before any
run."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import position_schemes  # noqa: E402

from labml_txl.runs.records import find_runs  # noqa: E402
from labml_txl.sweep import SweepResult  # noqa: E402

TINY = ['n_layer=1', 'd_model=16', 'n_head=2', 'd_head=8', 'd_inner=32', 'tgt_len=8', 'batch_size=4',
        'warmup_step=1', 'max_eval_steps=-1']


def test_a_tiny_comparison_writes_its_table_numbers_and_plot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / 'out'
    results = position_schemes.compare(['max_step=3', 'schemes=relative,alibi', 'lengths=1,2', f'out={out}',
                                        'dashboard=False'] + TINY)
    assert [(r['scheme'], r['memory']) for r in results] == [('relative', False), ('relative', True),
                                                              ('alibi', False), ('alibi', True)]
    for r in results:
        assert set(r['bpc']) == {1, 2} and all(math.isfinite(v) and v > 0 for v in r['bpc'].values())
        # The evaluation at the training length is the run's own last validation, computed by another process
        # (the same segments and sums in the same order; the logged value read back from JSON exactly)
        record, = find_runs([r['run']], tmp_path)
        assert r['steps'] == 3 and any(tag.startswith('sweep:train_xl-') for tag in record.tags)
        assert r['bpc'][1] == pytest.approx(record.last('loss.valid') / math.log(2), rel=1e-9)
    table = (out / 'results.md').read_text()
    assert '| scheme | memory | 8 (1x) | 16 (2x) | minutes |' in table and table.count('| ALiBi |') == 2
    assert len(json.loads((out / 'results.json').read_text())) == 4
    assert (out / 'position_schemes.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('argument, message', [
    ('schemes=relative,rotory', r"schemes \['rotory'\] are not accepted: 'absolute', .* or 't5_bias'"),
    ('lengths=0,4', r"lengths=.* is not accepted: positive multiples of tgt_len"),
    ('memory=sometimes', r"memory='sometimes' is not accepted: 'both', 'with' or 'without'"),
    ('mem_len=64', r"attention and mem_len are set by the experiment per run"),
])
def test_bad_settings_are_refused_before_any_run(argument, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        position_schemes.compare([argument, 'dashboard=False'])
    assert not (tmp_path / 'logs').exists()


def test_a_scheme_that_cannot_train_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    # absolute_deeper needs n_head * d_head = d_model: once found after absolute had trained, with nothing written
    monkeypatch.chdir(tmp_path)
    tiny = [t for t in TINY if not t.startswith('d_model=')] + ['d_model=32']
    with pytest.raises(SystemExit) as stopped:
        position_schemes.compare(['max_step=2', 'schemes=absolute,absolute_deeper', 'memory=without', 'lengths=1',
                                  f'out={tmp_path / "out"}', 'dashboard=False'] + tiny)
    assert stopped.value.code == 2 and not (tmp_path / 'logs').exists()
    assert 'n_head * d_head = 2 * 8 = 16 is not accepted with attn_type=3' in capsys.readouterr().err


def test_what_finished_is_written_when_a_later_run_fails(tmp_path, monkeypatch):
    # A run that fails while training (a divergence, a full disk): the sweep goes on and says so with exit code 1;
    # here the second scheme's run is made to fail by not running it
    monkeypatch.chdir(tmp_path)
    out = tmp_path / 'out'
    real_sweep = position_schemes.run_sweep

    def second_run_fails(script, points):
        finished = real_sweep(script, points[:1])
        return SweepResult(finished.sweep, finished.records, finished.out, 1)

    monkeypatch.setattr(position_schemes, 'run_sweep', second_run_fails)
    with pytest.raises(SystemExit) as stopped:
        position_schemes.compare(['max_step=2', 'schemes=absolute,relative', 'memory=without', 'lengths=1',
                                  f'out={out}', 'dashboard=False'] + TINY)
    assert stopped.value.code == 1
    results = json.loads((out / 'results.json').read_text())
    assert [(r['scheme'], r['memory']) for r in results] == [('absolute', False)]
    assert '| absolute, fixed sinusoids added to the input | none |' in (out / 'results.md').read_text()
