from __future__ import annotations

import numpy as np
import pytest

from streamdedup.verdicts import Verdict, Verdicts


def verdicts_of(reasons: list[str], start: int = 0) -> Verdicts:
    n = len(reasons)
    matched = [None if reason in ("novel", "unindexable") else f"d{row}" for row, reason in enumerate(reasons)]
    return Verdicts(
        np.array([reason in ("novel", "unindexable") for reason in reasons]),
        reasons,  # type: ignore[arg-type]
        np.arange(start, start + 2 * n, dtype=np.uint64).reshape(n, 2),
        matched,
        [None if match is None else row for row, match in enumerate(matched)],
        [None if match is None else 0.5 for match in matched],
        (None,) * n,
    )


def test_verdicts_split_into_the_parts_they_were_joined_from() -> None:
    verdicts = verdicts_of(["novel", "near", "unindexable", "exact", "redelivered"])
    parts = verdicts.split([2, 0, 3])
    assert [len(part) for part in parts] == [2, 0, 3]
    assert [v.match_id for part in parts for v in part] == [None, "d1", None, "d3", "d4"]
    rejoined = Verdicts.joined(Verdicts.joined(parts[0], parts[1]), parts[2])
    assert rejoined.reasons == verdicts.reasons
    assert rejoined.fingerprints.tolist() == verdicts.fingerprints.tolist()
    assert rejoined.novel.tolist() == [True, False, True, False, False]
    with pytest.raises(ValueError, match="parts of 4 documents"):
        verdicts.split([4])


def test_rows_read_as_the_columns_say_and_only_novel_indexable_documents_are_stored() -> None:
    verdicts = verdicts_of(["novel", "near", "unindexable"], start=10)
    assert verdicts.stored.tolist() == [True, False, False]
    row = verdicts[1]
    assert type(row) is Verdict and (row.novel, row.reason, row.match_id, row.distance) == (False, "near", "d1", 1)
    assert row.fingerprint.tolist() == [12, 13]
    assert [v.reason for v in verdicts] == ["novel", "near", "unindexable"]
    assert [v.reason for v in verdicts[1:]] == ["near", "unindexable"]
