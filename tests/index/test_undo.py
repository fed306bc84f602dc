import io

import numpy as np

from streamdedup.index.undo import Undo, UndoRecord

_RECORD = np.dtype([("fp", "<u8", (2,)), ("time", "<f8")])


def _undo() -> Undo:
    heads = np.zeros(3, dtype=_RECORD)
    heads["fp"] = [[1, 2], [3, 4], [5, 2**64 - 1]]
    heads["time"] = [1.5, 2.5, 3.5]
    return Undo(
        first_seq=1000,
        count=997,
        clock=np.float64(12.0).tobytes(),
        window=np.arange(5, dtype=np.float64).tobytes(),
        removed_seqs=[np.array([7, 9], np.uint64), np.array([2**40], np.uint64)],
        removed_heads=[heads[:2], heads[2:]],
        removed_ids=[b"a", "\u00e9t\u00e9".encode(), b""],
        times={b"k" * 16: None, b"j" * 16: b"\x01" * 16},
        table_rows=[(0, np.array([5, 6], np.uint32), np.array([7, 8], np.uint64)), (3, np.array([9]), np.array([1]))],
    )


def _assert_is_the_undo(record: UndoRecord) -> None:
    undo = _undo()
    assert (record.first_seq, record.count, record.clock, record.window) == (1000, 997, undo.clock, undo.window)
    assert record.seqs.tolist() == [7, 9, 2**40] and record.seqs.dtype == np.uint64
    assert record.heads.dtype == _RECORD and record.heads.tobytes() == np.concatenate(undo.removed_heads).tobytes()
    assert record.ids == undo.removed_ids
    assert record.times == list(undo.times.items())
    tables, keys, values = record.rows
    assert tables.tolist() == [0, 0, 3] and keys.tolist() == [5, 6, 9] and values.tolist() == [7, 8, 1]
    assert keys.dtype == values.dtype == np.uint64


def test_an_undo_record_reads_back_as_it_was_packed() -> None:
    _assert_is_the_undo(UndoRecord.unpack(_undo().pack(), _RECORD))


def test_an_empty_undo_record_reads_back_empty() -> None:
    undo = Undo(5, 0, None, None, [], [], [], {}, [])
    record = UndoRecord.unpack(undo.pack(), _RECORD)
    assert (record.first_seq, record.count, record.clock, record.window) == (5, 0, None, None)
    assert len(record.seqs) == len(record.heads) == 0 and record.ids == [] and record.times == []
    assert all(len(column) == 0 for column in record.rows)


def test_an_undo_record_stored_as_an_npz_archive_reads_back_alike() -> None:
    # The .npz layout earlier versions of streamdedup wrote.
    undo = _undo()
    keys, values = list(undo.times), list(undo.times.values())
    out = io.BytesIO()
    np.savez(
        out,
        header=np.array([undo.first_seq, undo.count], dtype=np.uint64),
        clock=np.frombuffer(undo.clock or b"", dtype=np.uint8),
        has_clock=np.array([True, True]),
        window=np.frombuffer(undo.window or b"", dtype=np.uint8),
        seqs=np.concatenate(undo.removed_seqs),
        heads=np.concatenate(undo.removed_heads).view(np.uint8).ravel(),
        id_lengths=np.array([len(x) for x in undo.removed_ids], dtype=np.int64),
        ids=np.frombuffer(b"".join(undo.removed_ids), dtype=np.uint8),
        time_keys=np.frombuffer(b"".join(keys), dtype=np.uint8),
        time_present=np.array([v is not None for v in values]),
        time_lengths=np.array([len(v or b"") for v in values], dtype=np.int64),
        time_values=np.frombuffer(b"".join(v or b"" for v in values), dtype=np.uint8),
        row_tables=np.array([0, 0, 3], dtype=np.int64),
        row_keys=np.array([5, 6, 9], dtype=np.uint64),
        row_values=np.array([7, 8, 1], dtype=np.uint64),
    )
    _assert_is_the_undo(UndoRecord.unpack(out.getvalue(), _RECORD))
