"""
# Runs as text tables

The text that `python -m labml_txl.runs` prints: the list of runs (`runs_table`), one run in full (`show_text`)
and runs side by side (`comparison_table`). Every function returns a string; nothing here prints.
"""
import datetime
import math
import textwrap
import time
from typing import List, Optional, Sequence

from ..configs.validation import short_value
from .compare import FINAL_METRICS, LOSS_TRAIN, LOSS_VALID, differing_items, final_metrics, item_text
from .records import RunRecord

# The shortest start of a UUID that a table shows
SHORT_UUID = 8
# The widest cell of `comparison_table` without `full`
CELL_WIDTH = 28


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """
    Columns padded to their widest cell, two spaces apart, a rule under the headers.

    Args:
        headers: the column names.
        rows: the cells, as strings.
        right: the indices of the columns aligned right (numbers).
    """
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return '  '.join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return '\n'.join([line(headers).rstrip(), line(['-' * w for w in widths])]
                     + [line(row).rstrip() for row in rows])


def short_uuids(uuids: Sequence[str], length: int = SHORT_UUID) -> List[str]:
    """The start of each UUID, `length` characters or more: as many as it takes to tell it from every other one."""
    shown = []
    for u in uuids:
        n = length
        while n < len(u) and any(o != u and o.startswith(u[:n]) for o in uuids):
            n += 1
        shown.append(u[:n])
    return shown


def format_number(value: Optional[float], digits: int = 4) -> str:
    """`4.1218`; `-` for None."""
    if value is None:
        return '-'
    if isinstance(value, int):
        return str(value)
    return 'nan' if math.isnan(value) else f'{value:.{digits}f}'


def format_age(seconds: float) -> str:
    """`12 s`, `5 min`, `3 h`, `2 d`."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f'{int(seconds)} s'
    if seconds < 3600:
        return f'{int(seconds // 60)} min'
    if seconds < 2 * 86400:
        return f'{int(seconds // 3600)} h'
    return f'{int(seconds // 86400)} d'


def format_time(seconds: float) -> str:
    """A moment in local time, `2026-12-04 13:33:28`."""
    return datetime.datetime.fromtimestamp(seconds).strftime('%Y-%m-%d %H:%M:%S')


def runs_table(records: Sequence[RunRecord], full: bool = False, now: Optional[float] = None) -> str:
    """
    One line per run: uuid, name, status, step, last loss.train, last loss.valid, age (since its first start) and
    comment (last, whole: the overrides that differ from the defaults), in the order of `records` (`load_runs`:
    first started first).

    Args:
        records: the runs.
        full: whole UUIDs (else the start of each UUID that tells it apart from the others listed).
        now: the time ages are counted to (seconds since the epoch); None for now.
    """
    if not records:
        return 'no runs'
    now = time.time() if now is None else now
    uuids = [r.uuid for r in records] if full else short_uuids([r.uuid for r in records])
    rows = []
    for shown, record in zip(uuids, records):
        final = final_metrics(record)
        rows.append([shown, record.name, record.status, format_number(final['step']),
                     format_number(final[LOSS_TRAIN]), format_number(final[LOSS_VALID]),
                     format_age(now - record.started), record.comment])
    headers = ['uuid', 'name', 'status', 'step', LOSS_TRAIN, LOSS_VALID, 'age', 'comment']
    return format_table(headers, rows, right=(3, 4, 5, 6))


def show_text(record: RunRecord, now: Optional[float] = None) -> str:
    """
    One run in full: where it lies, its name, comment, tags and status, its configs (`key = value`, `*` where
    overridden; then the items it never computed) and the last value of each metric.

    Args:
        record: the run.
        now: the time its age is counted to; None for now.
    """
    now = time.time() if now is None else now
    status = record.status + (f' ({record.status_details})' if record.status_details else '')
    lines = [f'run {record.uuid}',
             f'  folder:   {record.path}',
             f'  name:     {record.name}' + (f' ({record.python_file})' if record.python_file else ''),
             f'  comment:  {record.comment}',
             f"  tags:     {', '.join(record.tags)}",
             f'  status:   {status}',
             f'  started:  {format_time(record.started)} ({format_age(now - record.started)} ago)',
             f'  updated:  {format_time(record.updated)} ({format_age(now - record.updated)} ago)',
             '',
             'configs (* overridden):']
    computed = [item for item in record.configs.values() if item.computed]
    if computed:
        width = max(len(item.key) for item in computed)
        lines += [f"{'*' if item.overridden else ' '} {item.key:<{width}} = {item.text}" for item in computed]
    else:
        lines.append('  (no configs.yaml, or nothing computed)')
    waiting = [item.key + ('*' if item.overridden else '') for item in record.configs.values() if not item.computed]
    if waiting:
        lines += textwrap.wrap(f"not computed: {', '.join(waiting)}", width=110, initial_indent='  ',
                               subsequent_indent='    ', break_on_hyphens=False)
    lines += ['', 'metrics (last value, at step):']
    if record.metrics:
        rows = [[metric, f'{series[-1][1]:.6g}', str(series[-1][0])]
                for metric, series in record.metrics.items()]
        lines += ['  ' + line for line in format_table(['metric', 'last', 'step'], rows, right=(1, 2)).split('\n')]
    else:
        lines.append('  (no log.jsonl, or nothing tracked)')
    return '\n'.join(lines)


def comparison_table(records: Sequence[RunRecord], full: bool = False) -> str:
    """
    One line per run: its UUID, the config items that differ between the runs (`differing_items`; `*` after a value
    that run was given in its overrides), then its final metrics (`final_metrics`: step, last loss.train, last and
    smallest loss.valid).

    Args:
        records: the runs, in the order of the lines.
        full: whole UUIDs and values (else the start of each UUID, values cut to `CELL_WIDTH` characters).
    """
    differing = differing_items(records)
    uuids = [r.uuid for r in records] if full else short_uuids([r.uuid for r in records])
    headers = ['uuid'] + list(differing) + list(FINAL_METRICS)
    rows = []
    for i, (shown, record) in enumerate(zip(uuids, records)):
        cells = [shown]
        for items in differing.values():
            item = items[i]
            text = item_text(item) + ('*' if item is not None and item.overridden else '')
            cells.append(text if full else short_value(text, CELL_WIDTH))
        final = final_metrics(record)
        cells += [format_number(final[name]) for name in FINAL_METRICS]
        rows.append(cells)
    first_metric = 1 + len(differing)
    table = format_table(headers, rows, right=range(first_metric, len(headers)))
    note = ('no config item differs between these runs' if not differing
            else f'{len(differing)} config item{"s" if len(differing) > 1 else ""} differ (* overridden)')
    return f'{table}\n{note}'
