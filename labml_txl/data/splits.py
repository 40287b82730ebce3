"""
# Splitting a single-file corpus

enwik8 and text8 are single files of 100,000,000 bytes (characters); the original's `prep_enwik8.py` and
`prep_text8.py` take the last 5,000,000 for the test set, the 5,000,000 before them for the validation set and
everything before that, the first 90,000,000, for training. `split_sizes` checks that a file has exactly the
sizes asked for (the published ones by default; `train_size=None` means "everything before validation and
test", as the original's `data[:-2 * 5000000]`), so a truncated download fails here instead of training on a
different split.
"""
from typing import Optional, Tuple

from ..errors import require_positive_int
from .files import DataFileFormatError


def split_sizes(total: int, train_size: Optional[int], valid_size: int, test_size: int, source: str,
                unit: str) -> Tuple[int, int, int]:
    """`(train, valid, test)` sizes of a `total`-long corpus read from `source`."""
    if train_size is not None:
        require_positive_int('train_size', train_size)
    require_positive_int('valid_size', valid_size)
    require_positive_int('test_size', test_size)
    if train_size is None:
        if total <= valid_size + test_size:
            raise DataFileFormatError(f"{source} has {total:,} {unit}: expected more than valid_size + test_size = "
                             f"{valid_size + test_size:,} so that training gets the rest")
        return total - valid_size - test_size, valid_size, test_size
    expected = train_size + valid_size + test_size
    if total != expected:
        raise DataFileFormatError(f"{source} has {total:,} {unit}: expected train_size + valid_size + test_size = "
                         f"{train_size:,} + {valid_size:,} + {test_size:,} = {expected:,} {unit} (the published "
                         f"file is 100,000,000); pass the sizes of your file, or train_size=None to train on "
                         f"everything before the validation and test {unit}")
    return train_size, valid_size, test_size
