"""
# A run's metrics on disk

Every run keeps the values it tracks in its folder's `log.jsonl`, whether or not a dashboard is up: one JSON
object per line, `{"track": {"loss.train": [[step, [value, ...]], ...], ...}, "time": seconds}`, the format of
labml's own `file` writer. The dashboard imports these files (`labml_txl.dashboard.project_runs`) and
`python -m labml_txl.runs` reads them (`labml_txl.runs.records`).

labml's writer keeps a thread that its first `finish` ends: a monitored loop's end finishes the tracker's
writers, so what a run tracks after its loop (a final evaluation) would be lost, and it writes at most once a
minute. This one appends on the calling thread, every `flush_seconds` and at every `finish`, and keeps working
after one.

A line torn by a process killed while it wrote (or a disk that filled) is ended before the next line is appended,
so the torn line costs itself alone: appended to it, the next line would be torn too, and with it every line a
resumed run writes after it. A resumed run appends the steps from its checkpoint on again: a reader
(`labml_txl.runs.files.merge_metrics`) keeps, for every step, the value written last, and drops the stopped run's steps after the point it resumed from.
"""
import json
import time
from pathlib import Path
from typing import Dict, List, Tuple

from labml.internal.tracker.indicators import Indicator
from labml.internal.tracker.indicators.numeric import NumericIndicator
from labml.internal.tracker.writers import Writer

METRICS_FILE = 'log.jsonl'


class MetricsFileWriter(Writer):
    """
    labml tracker writer that appends every numeric indicator's values to `path`.

    Args:
        path: the run's `log.jsonl`.
        flush_seconds: the longest time values wait in memory (a dashboard following the file lags by this).
    """

    def __init__(self, path: Path, flush_seconds: float = 5.0):
        super().__init__()
        if not flush_seconds > 0:
            raise ValueError(f'flush_seconds={flush_seconds!r} is not accepted: a positive number of seconds')
        self.path = Path(path)
        self.flush_seconds = flush_seconds
        self._pending: Dict[str, List[Tuple[int, list]]] = {}
        self._last_flush = time.time()

    def write(self, *, global_step: int, indicators: Dict[str, Indicator]):
        for indicator in indicators.values():
            if isinstance(indicator, NumericIndicator) and not indicator.is_empty():
                values = [float(v) for v in indicator.get_all_values().reshape(-1)]
                self._pending.setdefault(indicator.mean_key, []).append((global_step, values))
        if time.time() - self._last_flush > self.flush_seconds:
            self.flush()

    def flush(self):
        self._last_flush = time.time()
        if not self._pending:
            return
        line = json.dumps({'track': self._pending, 'time': self._last_flush})
        self._pending = {}
        try:
            with open(self.path, 'a+b') as f:
                # (`a+` appends wherever the position is; it is moved only to read the last byte)
                if f.seek(0, 2) > 0 and (f.seek(-1, 2), f.read(1))[1] != b'\n':
                    f.write(b'\n')
                f.write(line.encode('utf-8') + b'\n')
        except OSError as error:
            # (a failed write of an open file names none: this one names it)
            raise OSError(error.errno, error.strerror, str(self.path)) from error

    def finish(self):
        self.flush()
