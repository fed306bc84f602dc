"""Why two texts are, or are not, near-duplicates under a configuration: the decision in plain words, what it
rests on (the estimated Jaccard against ``dedup.min_jaccard``, the fingerprint segments the texts share), then
every intermediate value."""

from __future__ import annotations

import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .decide import Deduplicator, open_index
from .document import Document
from .fingerprint import fingerprint_hex
from .index import TableKeys
from .index.keys import LONE_SEGMENT_LIMIT
from .settings import Settings
from .verdicts import Verdict

__all__ = ["Explanation", "explain"]


@dataclass(frozen=True)
class Explanation:
    normalized: tuple[str, str]
    fingerprints: tuple[str, str]
    distance: int
    estimated_jaccard: float
    verdict: Verdict
    # dedup.min_jaccard; None when dedup.verify is off (every candidate is then a duplicate).
    threshold: float | None
    # The index's tables: one per fingerprint segment under a segment plan.
    tables: int
    segmented: bool
    # Tables keying a and b (a segment built from too few features keys none), and those keyed alike in both.
    keyed: tuple[int, int]
    shared: int
    # Shared tables that make a a candidate for b: 2 when b is keyed in many segments under a candidate bound.
    needed: int
    # The largest Hamming distance a lookup returns (index.radius); None: no cutoff.
    radius: int | None
    indexable: tuple[bool, bool]
    sketch_size: int

    @property
    def candidate(self) -> bool:
        """Whether the index would hand a to b's decision at all."""
        near = self.radius is None or self.distance <= self.radius
        return all(self.indexable) and self.shared >= self.needed and near

    def summary(self) -> str:
        """The decision on b and why, in a sentence."""
        jaccard = f"their estimated Jaccard {self.estimated_jaccard:.3f}"
        held = f"the threshold {self.threshold} (dedup.min_jaccard)"
        if not self.indexable[1]:
            why = self.verdict.error or "it has no features to fingerprint"
            return f"b would be kept: {why}, so nothing can match it."
        if not self.indexable[0]:
            return "b would be kept: a has no features to fingerprint, so it is never stored and nothing matches it."
        shared = f"they share {self.shared} of {self._tables()}"
        if not self.verdict.novel:
            kind = "an exact copy" if self.verdict.reason == "exact" else "a near copy"
            compared = f"b would be dropped as {kind} of a: {shared} ({self.needed} needed), so the index compares them"
            if self.threshold is None:
                return (
                    f"{compared}, and with dedup.verify off every candidate is a duplicate ({jaccard} is not checked)."
                )
            return f"{compared}, and {jaccard} is at least {held}."
        if not self.candidate:
            if self.radius is not None and self.distance > self.radius:
                why = f"their Hamming distance {self.distance} is beyond index.radius {self.radius}"
            elif self.shared == 0:
                why = f"they share none of {self._tables()}"
            else:
                why = f"{shared}, and b, keyed in {self.keyed[1]} of them, needs {self.needed}"
            threshold = "" if self.threshold is None else f", threshold {self.threshold}"
            return (
                f"b would be kept: {why}, so the index never compares them "
                f"(estimated Jaccard {self.estimated_jaccard:.3f}{threshold})."
            )
        if self.threshold is not None and self.estimated_jaccard < self.threshold:
            return f"b would be kept: {shared}, so the index compares them, but {jaccard} is below {held}."
        return "b would be kept (novel)."

    def lines(self) -> list[str]:
        decision = "kept (novel)" if self.verdict.novel else f"dropped ({self.verdict.reason} duplicate of a)"
        threshold = (
            "dedup.verify off: not checked"
            if self.threshold is None
            else f"threshold {self.threshold}, dedup.min_jaccard"
        )
        unit = "segments" if self.segmented else "index tables"
        lone = f"; {LONE_SEGMENT_LIMIT} or more keyed need 2" if self.needed > 1 else ""
        radius = " (no index.radius: it decides nothing)" if self.radius is None else f" (index.radius {self.radius})"
        rows = [
            ("decision on b", decision),
            (
                "estimated jaccard",
                f"{self.estimated_jaccard:.3f} ({threshold}; bottom-{self.sketch_size} MinHash sketches)",
            ),
            (
                f"shared {unit}",
                f"{self.shared} of {self.tables}, {self.needed} needed "
                f"(keyed: a {self.keyed[0]}, b {self.keyed[1]}{lone})",
            ),
            ("hamming distance", f"{self.distance} of {len(self.fingerprints[0]) * 4} bits{radius}"),
            ("a normalised", repr(self.normalized[0])),
            ("b normalised", repr(self.normalized[1])),
            ("a fingerprint", self.fingerprints[0]),
            ("b fingerprint", self.fingerprints[1]),
        ]
        return [*textwrap.wrap(self.summary(), 110), "", *(f"{label + ':':<22}{value}" for label, value in rows)]

    def _tables(self) -> str:
        return f"the fingerprint's {self.tables} segments" if self.segmented else f"the index's {self.tables} tables"


def explain(text_a: str, text_b: str, settings: Settings) -> Explanation:
    """Run ``a`` then ``b`` through the real decision core on a throw-away index."""
    with tempfile.TemporaryDirectory(prefix="streamdedup-explain-") as work, open_index(settings, Path(work)) as index:
        dedup = Deduplicator(settings, index)
        batch = dedup.signer.fingerprinter.fingerprint_batch([text_a, text_b])
        signatures = dedup.signer.sign_batch(batch)
        docs = [Document("a", text_a, 0.0, None), Document("b", text_b, 0.0, None)]
        _, verdict_b = dedup.decide(docs, signatures=signatures)
        plan = index.plan
    keys = signatures.keys
    assert keys is not None  # the decision core's signer keys under the index's plan
    fps, sketches = signatures.fingerprints, signatures.sketches
    distance = int(np.bitwise_count(fps[0] ^ fps[1]).sum())
    jaccard = float(dedup.sketcher.jaccard(sketches[:1], sketches[1:])[0])
    hex_a, hex_b = fingerprint_hex(fps)
    keyed = keys.keyed().tolist()
    policy = settings.dedup
    return Explanation(
        normalized=(batch.normalized[0], batch.normalized[1]),
        fingerprints=(hex_a, hex_b),
        distance=distance,
        estimated_jaccard=jaccard,
        verdict=verdict_b,
        threshold=policy.min_jaccard if policy.verify else None,
        tables=len(plan.tables),
        segmented=keys.unkeyed_zero,
        keyed=(keyed[0], keyed[1]),
        shared=_shared_tables(keys),
        # The candidate bound's rule itself, asked whether one shared table would do for b.
        needed=1 if policy.max_candidates is None or keys.well_shared(np.array([1]), np.array([1]))[0] else 2,
        radius=plan.radius if plan.radius < plan.bits else None,
        indexable=(bool(signatures.indexable[0]), bool(signatures.indexable[1])),
        sketch_size=policy.sketch_size,
    )


def _shared_tables(keys: TableKeys) -> int:
    """Tables keying rows 0 and 1 alike (an unkeyed segment shares nothing)."""
    by_row = np.take_along_axis(keys.keys, np.argsort(keys.rows, axis=1), axis=1)
    same = by_row[:, 0] == by_row[:, 1]
    if keys.unkeyed_zero:
        same &= by_row[:, 0] != 0
    return int(same.sum())
