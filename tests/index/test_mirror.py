import numpy as np

from streamdedup.index.mirror import MIRROR_RECORD_BYTES, MIRROR_ROW_BYTES, RecordCache, TableMirror
from streamdedup.index.sorted_rows import SortedRows


def _rows(count: int) -> SortedRows:
    keys = np.arange(count, dtype=np.uint64)
    return SortedRows(keys, keys + np.uint64(100), 32)


def test_the_budget_is_shared_evenly_and_a_table_over_its_share_is_not_mirrored() -> None:
    # A quarter of the budget for the records read lately, the rest shared evenly by the tables.
    budget = 4 * 3 * MIRROR_RECORD_BYTES
    assert budget * 3 // 4 == 4 * 90 * MIRROR_ROW_BYTES
    mirror = TableMirror.empty(covers=7, tables=4, budget_bytes=budget)
    assert (mirror.covers, mirror.max_rows, mirror.tables) == (7, 90, (None, None, None, None))
    assert mirror.records.max_records == 3
    assert mirror.fits(90) and not mirror.fits(91)
    mirror = TableMirror.empty(covers=7, tables=4, budget_bytes=4 * 10 * MIRROR_ROW_BYTES * 4 // 3)
    assert mirror.max_rows == 10
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


def test_records_are_read_once_until_forgotten_and_the_oldest_go_first() -> None:
    stored = {bytes([i]): b"record %d" % i for i in range(10)}
    asked: list[list[bytes]] = []

    def fetch(keys: list[bytes]) -> list[tuple[bytes, bytes]]:
        asked.append(keys)
        return [(key, stored[key]) for key in keys if key in stored]

    cache = RecordCache(max_records=4)
    keys = [bytes([i]) for i in (1, 2, 3)]
    assert cache.read(keys, fetch) == [b"record 1", b"record 2", b"record 3"]
    assert cache.read(keys, fetch) == [b"record 1", b"record 2", b"record 3"]
    assert asked == [keys]
    # A key no entry has reads as None, and is asked for again next time.
    assert cache.read([b"\x01", b"\xff"], fetch) == [b"record 1", None]
    assert cache.read([b"\xff"], fetch) == [None] and asked[-1] == [b"\xff"]
    # Over its size, the records read first go first.
    assert cache.read([bytes([5]), bytes([6])], fetch) == [b"record 5", b"record 6"]
    assert len(cache) == 4
    asked.clear()
    cache.read(keys, fetch)
    assert asked == [[b"\x01"]]
    # A removed entry's record is forgotten: the next read asks LMDB, which no longer has it.
    del stored[b"\x02"]
    cache.forget([b"\x02"])
    assert cache.read([b"\x02"], fetch) == [None]
