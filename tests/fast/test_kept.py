"""`fast.kept`: which views are the last rows of the tensor they view, the case a kept projection may serve."""
import torch

from labml_txl.fast.kept import last_rows_of


def test_last_rows_of_a_table_are_recognised():
    table = torch.randn(7, 1, 4)
    assert last_rows_of(table[3:]) is table
    assert last_rows_of(table[0:]) is table


def test_other_views_are_not_last_rows():
    table = torch.randn(7, 1, 4)
    # Not a view; the first rows; a middle slice; every other row; other features
    for view in (table, table[:3], table[2:5], table[1::2], table[3:, :, :2], table.transpose(1, 2)[3:]):
        assert last_rows_of(view) is None
