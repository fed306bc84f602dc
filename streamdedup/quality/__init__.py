"""The labelled near-duplicate quality benchmark: real source texts, edited copies, ground truth, scoring."""

from __future__ import annotations

from .corpus import CLEARLY_NOVEL, DUPLICATE, EDIT_KINDS, OTHER, BenchDoc, build_stream, label_stream, load_stream
from .evaluate import QualityReport, Rates, evaluate
from .similarity import EarlierMatch, jaccard, match_earlier, shingles
from .sources import SourceItem, load_sources

__all__ = [
    "CLEARLY_NOVEL",
    "DUPLICATE",
    "EDIT_KINDS",
    "OTHER",
    "BenchDoc",
    "EarlierMatch",
    "QualityReport",
    "Rates",
    "SourceItem",
    "build_stream",
    "evaluate",
    "jaccard",
    "label_stream",
    "load_sources",
    "load_stream",
    "match_earlier",
    "shingles",
]
