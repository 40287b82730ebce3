"""What `labml_txl.configs.validation.resolved` says of a configs object, against the `configs.yaml` labml wrote for
it (`tests/configs/test_configs.py` for configs made in a test, `tests/runs/test_runs_records.py` for a trained run)."""
from typing import Any, Dict

from labml_txl.configs.validation import ResolvedItem


def assert_matches_configs_yaml(items: Dict[str, ResolvedItem], written: Dict[str, Any]) -> None:
    """`resolved(conf)` against the configs.yaml labml wrote for the same conf: the same items computed, every
    value equal where labml wrote data, the option (or labml's string) where it wrote an object's string, and the
    overridden flags equal to is_explicitly_specified."""
    assert set(items) == {key for key, entry in written.items() if entry['order'] != -1}
    for key, item in items.items():
        entry = written[key]
        assert item.computed and item.overridden == entry['is_explicitly_specified'], key
        if not isinstance(entry['computed'], str) or entry['type'] == "<class 'str'>":
            assert item.value == entry['computed'], key
        elif item.option is not None:
            assert item.value == item.option and item.option in entry['options'], key
            assert entry['value'] in (None, item.option), key
        else:
            assert item.value == entry['computed'], key
