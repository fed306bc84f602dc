"""Recall and loss of a sequence of keep/drop decisions over the labelled stream, overall, by edit and by language.

recall = duplicates dropped / documents labelled ``duplicate`` (an earlier member of their cluster exists);
loss = clearly novel documents dropped / documents labelled ``clearly_novel``. Documents labelled ``other``
count in neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .corpus import CLEARLY_NOVEL, DUPLICATE, BenchDoc

__all__ = ["QualityReport", "Rates", "evaluate"]


@dataclass(frozen=True, slots=True)
class Rates:
    """Counts behind recall and loss for one group of documents."""

    documents: int
    duplicates: int
    duplicates_dropped: int
    novel: int
    novel_dropped: int

    @property
    def recall(self) -> float | None:
        """Share of duplicates dropped; None when the group holds no duplicate."""
        return self.duplicates_dropped / self.duplicates if self.duplicates else None

    @property
    def loss(self) -> float | None:
        """Share of clearly novel documents dropped; None when the group holds none."""
        return self.novel_dropped / self.novel if self.novel else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "documents": self.documents,
            "duplicates": self.duplicates,
            "duplicates_dropped": self.duplicates_dropped,
            "clearly_novel": self.novel,
            "clearly_novel_dropped": self.novel_dropped,
            "recall": self.recall,
            "loss": self.loss,
        }


@dataclass(frozen=True, slots=True)
class QualityReport:
    overall: Rates
    by_edit: dict[str, Rates]
    by_lang: dict[str, Rates]

    def as_dict(self) -> dict[str, object]:
        return {
            "overall": self.overall.as_dict(),
            "by_edit": {key: rates.as_dict() for key, rates in self.by_edit.items()},
            "by_lang": {key: rates.as_dict() for key, rates in self.by_lang.items()},
        }


def evaluate(docs: Sequence[BenchDoc], dropped: Sequence[bool] | np.ndarray) -> QualityReport:
    """Score ``dropped[i]`` (True: document i was dropped as a duplicate) against the labels of ``docs``."""
    dropped = np.asarray(dropped, dtype=bool)
    if dropped.shape != (len(docs),):
        raise ValueError(f"expected {len(docs)} decisions, got {dropped.shape[0] if dropped.ndim else 'a scalar'}")
    labels = np.array([doc.label for doc in docs], dtype=object)
    duplicate = labels == DUPLICATE
    novel = labels == CLEARLY_NOVEL
    edits = np.array([doc.edit for doc in docs], dtype=object)
    langs = np.array([doc.lang for doc in docs], dtype=object)

    def rates(members: np.ndarray) -> Rates:
        return Rates(
            documents=int(members.sum()),
            duplicates=int((members & duplicate).sum()),
            duplicates_dropped=int((members & duplicate & dropped).sum()),
            novel=int((members & novel).sum()),
            novel_dropped=int((members & novel & dropped).sum()),
        )

    everything = np.ones(len(docs), dtype=bool)
    return QualityReport(
        overall=rates(everything),
        by_edit={edit: rates(edits == edit) for edit in sorted(set(edits.tolist()))},
        by_lang={lang: rates(langs == lang) for lang in sorted(set(langs.tolist()))},
    )
