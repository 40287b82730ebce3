"""A run's `log.jsonl` as `MetricsFileWriter` appends to it: a line torn by a killed process costs that line alone."""
import json

from labml_txl.runs.files import read_metrics
from labml_txl.train.metrics_file import MetricsFileWriter


def _append(path, step, value):
    from labml.internal.tracker.indicators.numeric import Scalar
    indicator = Scalar('loss.train', True)
    indicator.collect_value(value)
    writer = MetricsFileWriter(path)
    writer.write(global_step=step, indicators={'loss.train': indicator})
    writer.finish()


def test_a_torn_last_line_is_ended_before_the_next_is_appended(tmp_path):
    path = tmp_path / 'log.jsonl'
    whole = json.dumps({'track': {'loss.train': [[1, [1.0]]]}, 'time': 1.0})
    torn = '{"track": {"loss.train": [[2, [2.'
    path.write_text(whole + '\n' + torn)
    _append(path, 3, 3.0)
    _append(path, 4, 4.0)
    lines = path.read_text().split('\n')
    assert lines[:2] == [whole, torn] and lines[-1] == ''
    # the torn line alone is lost: the steps before it and every one appended after it read back
    assert read_metrics(path) == {'loss.train': [(1, 1.0), (3, 3.0), (4, 4.0)]}


def test_a_whole_file_gets_its_lines_and_nothing_else(tmp_path):
    path = tmp_path / 'log.jsonl'
    _append(path, 1, 1.0)
    _append(path, 2, 2.0)
    lines = path.read_text().split('\n')
    assert len(lines) == 3 and lines[-1] == '' and all(json.loads(line) for line in lines[:2])
    assert read_metrics(path) == {'loss.train': [(1, 1.0), (2, 2.0)]}
