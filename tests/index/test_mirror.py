import numpy as np

from streamdedup.index.mirror import MIRROR_ROW_BYTES, TableMirror
from streamdedup.index.sorted_rows import SortedRows


def _rows(count: int) -> SortedRows:
    keys = np.arange(count, dtype=np.uint64)
    return SortedRows(keys, keys + np.uint64(100), 32)


def test_the_budget_is_shared_evenly_and_a_table_over_its_share_is_not_mirrored() -> None:
    mirror = TableMirror.empty(covers=7, tables=4, budget_bytes=4 * 10 * MIRROR_ROW_BYTES)
    assert (mirror.covers, mirror.max_rows, mirror.tables) == (7, 10, (None, None, None, None))
    assert mirror.fits(10) and not mirror.fits(11)
    filled = mirror.with_table(1, _rows(10))
    assert [rows is not None for rows in filled.tables] == [False, True, False, False]
    assert filled.tables[1].values.tolist() == list(range(100, 110))
    assert filled.with_table(1, _rows(11)).tables[1] is None
    assert filled.with_table(1, None).tables[1] is None
    # Immutable: what a lookup holds stays as it was.
    assert mirror.tables[1] is None


def test_advancing_keeps_every_table_and_moves_the_count() -> None:
    filled = TableMirror.empty(covers=3, tables=2, budget_bytes=1 << 20).with_table(0, _rows(5))
    advanced = filled.advanced(4)
    assert advanced.covers == 4 and advanced.tables == filled.tables and filled.covers == 3
