"""The persistent LMDB segment index (``SegmentIndex``) and its table plans (``IndexPlan``, ``make_plan``)."""

from __future__ import annotations

from .plan import IndexPlan, PlanError, make_plan
from .segment import EntryRecords, IndexStorageError, SearchResult, SegmentIndex

__all__ = [
    "EntryRecords",
    "IndexPlan",
    "IndexStorageError",
    "PlanError",
    "SearchResult",
    "SegmentIndex",
    "make_plan",
]
