import numpy as np

from streamdedup.index.mirror import RecordCache, TableMirror, mirror_row_bytes
from streamdedup.index.sorted_rows import SortedRows


def _rows(count: int) -> SortedRows:
    keys = np.arange(count, dtype=np.uint64)
    return SortedRows(keys, keys + np.uint64(100), 32)


def test_the_budget_is_shared_evenly_and_a_table_over_its_share_is_not_mirrored() -> None:
    # Half the budget for the records read lately, the rest shared evenly by the tables: 16 bytes a row of
    # 32-bit keys (key 4, value 8, directory 4), 20 of 64-bit keys.
    assert (mirror_row_bytes(32), mirror_row_bytes(64)) == (16, 20)
    budget = 2 * 3 * RecordCache.row_bytes(256)
    assert budget - budget // 2 == 4 * 12 * mirror_row_bytes(32) + 48
    mirror = TableMirror.empty(covers=7, tables=4, budget_bytes=budget, payload_bytes=256, key_bits=32)
    assert (mirror.covers, mirror.max_rows, mirror.tables) == (7, 12, (None, None, None, None))
    assert mirror.records.slots == 3
    assert mirror.fits(12) and not mirror.fits(13)
    budget = 2 * 4 * 10 * mirror_row_bytes(64)
    mirror = TableMirror.empty(covers=7, tables=4, budget_bytes=budget, payload_bytes=8, key_bits=64)
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
    empty = TableMirror.empty(covers=3, tables=2, budget_bytes=1 << 20, payload_bytes=8, key_bits=32)
    filled = empty.with_table(0, _rows(5))
    advanced = filled.advanced(4)
    assert advanced.covers == 4 and advanced.tables == filled.tables and filled.covers == 3


def test_times_and_payloads_are_read_once_until_forgotten_or_displaced() -> None:
    stored = {entry: (float(entry) / 2, np.full(4, entry, dtype=np.uint8)) for entry in range(20)}
    asked: list[list[int]] = []

    def fetch(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        asked.append(entries.tolist())
        held = [entry for entry in entries.tolist() if entry in stored]
        times = np.array([stored[entry][0] for entry in held], dtype=np.float64)
        payloads = np.array([stored[entry][1] for entry in held], dtype=np.uint8).reshape(-1, 4)
        return np.array(held, dtype=np.uint64), times, payloads

    def read(cache: RecordCache, entries: list[int]) -> tuple[list[bool], list[float], list[int]]:
        present, times, payloads = cache.read(np.array(entries, dtype=np.uint64), fetch)
        return present.tolist(), times.tolist(), payloads[:, 0].tolist()

    cache = RecordCache(slots=8, payload_bytes=4)
    # Any order, repeats allowed: each distinct entry is fetched once, ascending.
    assert read(cache, [3, 1, 2, 1]) == ([True] * 4, [1.5, 0.5, 1.0, 0.5], [3, 1, 2, 1])
    assert read(cache, [1, 2, 3]) == ([True] * 3, [0.5, 1.0, 1.5], [1, 2, 3])
    assert asked == [[1, 2, 3]] and len(cache) == 3
    # An entry no longer stored reads as absent (zeros), and is asked for again next time.
    assert read(cache, [30, 1]) == ([False, True], [0.0, 0.5], [0, 1])
    assert read(cache, [30]) == ([False], [0.0], [0]) and asked[-1] == [30]
    # Entries of one slot (their key modulo 8) read together: both are returned, one of them is held.
    asked.clear()
    assert read(cache, [4, 12]) == ([True, True], [2.0, 6.0], [4, 12])
    assert read(cache, [4, 12]) == ([True, True], [2.0, 6.0], [4, 12])
    assert len(asked) == 2 and asked[1] in ([4], [12])
    # A removed entry is forgotten: the next read asks LMDB, which no longer has it.
    del stored[2]
    cache.forget(np.array([2, 9], dtype=np.uint64))
    assert read(cache, [2, 3]) == ([False, True], [0.0, 1.5], [0, 3]) and asked[-1] == [2]
    # Without slots (no memory for them) every read goes to LMDB.
    uncached = RecordCache(slots=0, payload_bytes=4)
    asked.clear()
    assert read(uncached, [5, 5]) == ([True, True], [2.5, 2.5], [5, 5])
    assert read(uncached, [5]) == ([True], [2.5], [5])
    assert asked == [[5], [5]]
