"""The index's format: the version and layout recorded in its ``meta`` database when it is created, and whether a
caller's settings are compatible with an index that exists.

Format 1 had no staged rows; format 2 stored folds in every plan's tables; formats 1-3 kept every table as dupsort
rows; format 4 had no undo records; formats 1-5 stored entry keys in tables as 8 bytes, in the rows layout; formats
1-6 stored each record at full width; formats 1-7 kept ids as B-tree keys; formats 1-8 had no content index;
formats 6-9 stored sorted runs as chunks of rows. All read as format 10 (with none staged, with fold values, with
the rows layout, with nothing to undo, with 8-byte entry keys, with fixed records, with ids as keys, without
contents) and are marked 10 when opened to write: older code must not misread new indexes, nor write batches that
the undo records, the ids or the contents would then not account for. An index whose runs are chunked has them
rewritten whole by the first process that opens it to write (``chunked_runs``), in the transaction that marks it,
and cannot be opened read-only before. A new entry-valued index keeps its tables as sorted runs (``table``) and
packs its records (``record``); every new index keeps its ids as hashed runs (``ids``) and its entries by content
(``contents``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..settings import IndexSettings
from .plan import IndexPlan, PlanError, make_plan, make_segment_plan
from .record import BYTES_PAYLOAD, FIXED_RECORDS, PACKED_RECORDS, PAYLOAD_KINDS, RecordLayout
from .table import TableLayout

__all__ = [
    "ENTRY_KEY_BYTES",
    "ENTRY_VALUES",
    "FOLD_VALUES",
    "FORMAT_VERSION",
    "IdLayout",
    "IndexFormat",
    "mark_current",
    "planned",
]

FORMAT_VERSION = 10
_READABLE_FORMATS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
_CHUNKED_RUN_FORMATS = (6, 7, 8, 9)
_META_FORMAT = b"format"
FOLD_VALUES, ENTRY_VALUES = "folds", "entries"
IdLayout = Literal["keys", "runs"]
ENTRY_KEY_BYTES = 6
"""Bytes of an entry key in a table row: 2**48 entries (at 100,000 stored a second, for 89 years), and a table row
costs LMDB 20 bytes where 8-byte keys take 22."""


@dataclass(frozen=True)
class IndexFormat:
    """What an index's stored rows mean: its plan, payload width, time bucket, signing, and layouts."""

    plan: IndexPlan
    payload_bytes: int
    time_bucket: float
    signing: str | None
    entry_valued: bool
    """The tables' values name entries (else folds: the rest of the 64-bit fold, see the ``segment`` docstring)."""
    table_layout: TableLayout
    entry_key_bytes: int
    """Bytes of each entry key an entry-valued table stores."""
    record_layout: str
    payload_kind: str
    """What payloads hold: bytes stored as given, or bottom-k sketches (see ``record``)."""
    id_layout: IdLayout = "keys"
    """How ids lead to their entries (see ``ids``)."""
    contents: bool = False
    """Whether entries are found by their content (see ``contents``): every index created from format 9 on."""
    chunked_runs: bool = False
    """Whether its sorted runs are stored as chunks of rows, as formats 6-9 stored them: the index's opener
    rewrites them (``SortedRuns.unchunk``) and then calls :func:`mark_current`."""

    @classmethod
    def opened(
        cls,
        env: Any,
        read: Callable[[], Any],
        meta: Any,
        path: Path,
        *,
        readonly: bool,
        bits: int | None,
        radius: int | None,
        expected_entries: int,
        payload_bytes: int | None,
        plan: IndexPlan | None,
        max_tables: int,
        time_bucket: float,
        signing: str | None,
        payload_kind: str = BYTES_PAYLOAD,
    ) -> IndexFormat:
        """The format stored at ``meta`` (recorded from these arguments in a new index), checked against them;
        ``read`` begins a read transaction of ``env``."""
        if payload_kind not in PAYLOAD_KINDS:
            raise ValueError(f"payload_kind must be one of {PAYLOAD_KINDS}, got {payload_kind!r}")
        with read() as txn:
            stored = txn.get(_META_FORMAT, db=meta) if meta is not None else None
        chunked = False
        if stored is None:
            if readonly:
                raise PlanError(f"{path} holds no segment index")
            if bits is None or radius is None:
                raise PlanError("bits and radius are required to create an index")
            if plan is None:
                plan = make_plan(bits, radius, expected_entries, max_tables=max_tables)
            entry_valued = _entries_in_tables(plan)
            fmt = {
                "version": FORMAT_VERSION,
                "plan": json.loads(plan.to_json()),
                "payload_bytes": int(payload_bytes or 0),
                "time_bucket": float(time_bucket),
                "table_values": ENTRY_VALUES if entry_valued else FOLD_VALUES,
                "table_layout": "runs" if entry_valued else "buckets",
                "entry_key_bytes": ENTRY_KEY_BYTES,
                "signing": signing,
                "records": PACKED_RECORDS,
                "payload": payload_kind,
                "ids": "runs",
                "contents": True,
            }
            with env.begin(write=True) as txn:
                txn.put(_META_FORMAT, json.dumps(fmt, sort_keys=True).encode(), db=meta)
        else:
            fmt = json.loads(stored)
            if fmt["version"] not in _READABLE_FORMATS:
                raise PlanError(
                    f"{path}: index format {fmt['version']}, this code reads formats {_READABLE_FORMATS}; run the "
                    "streamdedup version that wrote it, or point index.path at a new folder (it fills as documents "
                    "arrive)"
                )
            chunked = fmt["version"] in _CHUNKED_RUN_FORMATS and _has_runs(fmt)
            if chunked and readonly:
                raise PlanError(
                    f"{path}: index format {fmt['version']} stores its sorted runs in chunks, which this version "
                    "reads once rewritten: open the index to write once (streamdedup index compact PATH with the "
                    "service stopped, or the service's next start, rewrites them in one transaction), or read it "
                    "with the version that wrote it"
                )
            if fmt["version"] != FORMAT_VERSION and not readonly and not chunked:
                with env.begin(write=True) as txn:
                    mark_current(txn, meta)
        opened = cls(
            IndexPlan.from_json(json.dumps(fmt["plan"])),
            int(fmt["payload_bytes"]),
            float(fmt["time_bucket"]),
            fmt.get("signing"),
            fmt.get("table_values", FOLD_VALUES) == ENTRY_VALUES,
            fmt.get("table_layout", "rows"),
            int(fmt.get("entry_key_bytes", 8)),
            fmt.get("records", FIXED_RECORDS),
            fmt.get("payload", BYTES_PAYLOAD),
            fmt.get("ids", "keys"),
            bool(fmt.get("contents", False)),
            chunked,
        )
        opened.check_compatible(path, bits, radius, payload_bytes, plan, signing)
        return opened

    def check_compatible(
        self,
        path: Path,
        bits: int | None,
        radius: int | None,
        payload_bytes: int | None,
        plan: IndexPlan | None,
        signing: str | None,
    ) -> None:
        stored = self.plan
        problems = []
        if signing is not None and signing != self.signing:
            # Fingerprints made another way rarely come within the radius of the stored ones: lookups would miss
            # their copies, silently.
            problems.append(f"signing {signing} (stored: {self.signing or 'none recorded, an older index'})")
        if bits is not None and bits != stored.bits:
            problems.append(f"bits {bits} (stored {stored.bits})")
        if radius is not None and radius != stored.radius:
            problems.append(f"radius {radius} (stored {stored.radius})")
        if payload_bytes is not None and payload_bytes != self.payload_bytes:
            problems.append(f"payload_bytes {payload_bytes} (stored {self.payload_bytes})")
        if plan is not None and not plan.same_lookup(stored):
            problems.append("a different table plan")
        if not problems:
            return
        if signing is not None and signing != self.signing:
            advice = (
                "its fingerprints and sketches were made another way (older code or other settings) and cannot be "
                "compared with new ones; move it aside or point index.path at a new folder, which fills as documents "
                "arrive (the entries it held would have expired within index.max_age_seconds)"
            )
        else:
            advice = "open it with the stored settings, or export/import it into a new index"
        raise PlanError(f"index at {path} is incompatible with the requested {', '.join(problems)}; {advice}")

    @property
    def words(self) -> int:
        return self.plan.bits // 64

    @property
    def table_values(self) -> str:
        return ENTRY_VALUES if self.entry_valued else FOLD_VALUES

    @cached_property
    def record(self) -> np.dtype:
        """An entry's record ahead of its id: fingerprint, event time, origin, payload."""
        return np.dtype(
            [
                ("fp", "<u8", (self.words,)),
                ("time", "<f8"),
                ("topic", "<u4"),
                ("partition", "<i4"),
                ("offset", "<i8"),
                ("payload", "u1", (self.payload_bytes,)),
            ]
        )

    @cached_property
    def records(self) -> RecordLayout:
        """How records of :attr:`record` heads are laid out in LMDB."""
        return RecordLayout(self.record, self.record_layout, self.payload_kind)

    @cached_property
    def key_bytes(self) -> list[int]:
        return [math.ceil(len(key) / 8) for key in self.plan.tables]

    @cached_property
    def value_bytes(self) -> list[int]:
        if self.entry_valued:
            return [self.entry_key_bytes] * len(self.plan.tables)
        return [math.ceil(len(self.plan.value_bits(t)) / 8) for t in range(len(self.plan.tables))]


def mark_current(txn: Any, meta: Any) -> None:
    """Mark an older index as this format: older code must not write to it (format 1 code misses staged rows)."""
    fmt = json.loads(txn.get(_META_FORMAT, db=meta))
    fmt["version"] = FORMAT_VERSION
    txn.put(_META_FORMAT, json.dumps(fmt, sort_keys=True).encode(), db=meta)


def _has_runs(fmt: dict[str, Any]) -> bool:
    return fmt.get("table_layout") == "runs" or fmt.get("ids") == "runs" or bool(fmt.get("contents"))


def _entries_in_tables(plan: IndexPlan) -> bool:
    """Whether a new index under ``plan`` stores entry keys in its tables. A fold is kept as the value only where
    it can reject candidates before their records are read: on 64-bit fingerprints, or under a radius."""
    return plan.bits > 64 and plan.radius >= plan.bits


def planned(settings: IndexSettings, *, bits: int, segments: int = 1) -> IndexPlan:
    """The table plan a new index under ``settings`` gets (``segments`` > 1: one table per segment)."""
    if segments > 1:
        return make_segment_plan(bits, segments, settings.radius, expected_entries=settings.expected_entries)
    radius = bits if settings.radius is None else settings.radius
    return make_plan(bits, radius, settings.expected_entries, max_tables=settings.max_tables)
