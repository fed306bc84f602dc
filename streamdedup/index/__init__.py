"""The persistent LMDB segment index (``SegmentIndex``), its table plans (``IndexPlan``, ``make_plan``) and a
batch's table keys under a plan (``TableKeys``, ``table_keys``)."""

from __future__ import annotations

from .keys import UNMEASURED, TableKeys, first_copies, table_keys, with_copies
from .plan import IndexPlan, PlanError, make_plan
from .segment import (
    BYTES_PAYLOAD,
    SKETCH_PAYLOAD,
    STORAGE_ERRORS,
    Candidates,
    EntryRecords,
    IndexStorageError,
    SearchResult,
    SegmentIndex,
    planned,
)

__all__ = [
    "BYTES_PAYLOAD",
    "SKETCH_PAYLOAD",
    "STORAGE_ERRORS",
    "UNMEASURED",
    "Candidates",
    "EntryRecords",
    "IndexPlan",
    "IndexStorageError",
    "PlanError",
    "SearchResult",
    "SegmentIndex",
    "TableKeys",
    "first_copies",
    "make_plan",
    "planned",
    "table_keys",
    "with_copies",
]
