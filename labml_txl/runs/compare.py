"""
# How runs differ

What sets runs apart, for `python -m labml_txl.runs compare` and `plot` and for a sweep's summary: the config
items whose values differ between them (`differing_items`), a label per run made of those that were overridden
(`run_labels`), and the final metrics of a run (`final_metrics`).

Items are compared by `ConfigValue.value`: data as computed; an object (the model, the optimizer) by the option the
overrides named for it, so an object computed by its default option from other items never differs by itself
(the items it is computed from do).
"""
import json
from typing import Dict, List, Optional, Sequence

from .records import ConfigValue, RunRecord

# The metrics of `final_metrics`, in its order: the last training loss, the last and the smallest validation loss
LOSS_TRAIN = 'loss.train'
LOSS_VALID = 'loss.valid'
FINAL_METRICS = ('step', LOSS_TRAIN, LOSS_VALID, f'min {LOSS_VALID}')


def _comparable(item: Optional[ConfigValue]) -> str:
    if item is None:
        return 'absent'
    if not item.computed:
        return 'not computed'
    return 'value ' + json.dumps(item.value, sort_keys=True, default=str)


def item_text(item: Optional[ConfigValue]) -> str:
    """An item's value as a table or a label shows it: `(absent)` where the run has no such item."""
    return '(absent)' if item is None else item.text


def differing_items(records: Sequence[RunRecord],
                    overridden_only: bool = False) -> Dict[str, List[Optional[ConfigValue]]]:
    """
    The config items whose values differ between runs, in key order.

    Args:
        records: the runs (`find_runs`, `load_runs`).
        overridden_only: only the items that at least one of the runs was given in its overrides (what was chosen,
            not what followed from it: `attention` but not `attn_type`).

    Returns:
        For each such key, the item of each run in the order of `records` (`None` where a run has no such item, a
        run of another script). Items are compared as the module says; one computed by some runs only differs.
    """
    keys = sorted(set().union(*(record.configs for record in records))) if records else []
    differing = {}
    for key in keys:
        items = [record.configs.get(key) for record in records]
        values = {_comparable(item) for item in items}
        if len(values) < 2:
            continue
        if overridden_only and not any(item is not None and item.overridden for item in items):
            continue
        differing[key] = items
    return differing


def run_labels(records: Sequence[RunRecord]) -> List[str]:
    """
    A label per run, in the order of `records`, made of the settings that tell it apart: `attention=alibi mem_len=0`.

    Args:
        records: the runs.

    The settings are the differing items that were overridden (`differing_items(records, overridden_only=True)`),
    else all differing items; runs that no item tells apart get the start of their UUID too, and a run alone or runs
    with the same configs the start of their UUID only.
    """
    differing = differing_items(records, overridden_only=True) or differing_items(records)
    labels = [' '.join(f'{key}={item_text(items[i])}' for key, items in differing.items())
              for i in range(len(records))]
    counts = {label: labels.count(label) for label in labels}
    return [label + f' ({record.uuid[:8]})' if label and counts[label] > 1 else label or record.uuid[:8]
            for label, record in zip(labels, records)]


def final_metrics(record: RunRecord) -> Dict[str, Optional[float]]:
    """
    The end of a run, by the names of `FINAL_METRICS`: `step` (the last step of `loss.train`, labml's global step:
    29 after 30 steps), the last `loss.train`, the last `loss.valid` and `min loss.valid`; None for what the run does
    not have.

    Args:
        record: the run.
    """
    return {'step': record.last_step(LOSS_TRAIN), LOSS_TRAIN: record.last(LOSS_TRAIN),
            LOSS_VALID: record.last(LOSS_VALID), f'min {LOSS_VALID}': record.best(LOSS_VALID)}
