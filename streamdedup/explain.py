"""Why two texts are, or are not, near-duplicates under a configuration: every intermediate value shown."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .decide import Deduplicator, Verdict, open_index
from .document import Document
from .fingerprint import fingerprint_hex
from .settings import Settings

__all__ = ["Explanation", "explain"]


@dataclass(frozen=True)
class Explanation:
    normalized: tuple[str, str]
    fingerprints: tuple[str, str]
    distance: int
    estimated_jaccard: float
    verdict: Verdict

    def lines(self) -> list[str]:
        decision = "kept (novel)" if self.verdict.novel else f"dropped ({self.verdict.reason} duplicate of a)"
        return [
            f"a normalised:      {self.normalized[0]!r}",
            f"b normalised:      {self.normalized[1]!r}",
            f"a fingerprint:     {self.fingerprints[0]}",
            f"b fingerprint:     {self.fingerprints[1]}",
            f"hamming distance:  {self.distance}",
            f"estimated jaccard: {self.estimated_jaccard:.3f}",
            f"decision on b:     {decision}",
        ]


def explain(text_a: str, text_b: str, settings: Settings) -> Explanation:
    """Run ``a`` then ``b`` through the real decision core on a throw-away index."""
    with tempfile.TemporaryDirectory(prefix="streamdedup-explain-") as work, open_index(settings, Path(work)) as index:
        dedup = Deduplicator(settings, index)
        batch = dedup.signer.fingerprinter.fingerprint_batch([text_a, text_b])
        signatures = dedup.signer.sign_batch(batch)
        docs = [Document("a", text_a, 0.0, None), Document("b", text_b, 0.0, None)]
        _, verdict_b = dedup.decide(docs, signatures=signatures)
    fps, sketches = signatures.fingerprints, signatures.sketches
    distance = int(np.bitwise_count(fps[0] ^ fps[1]).sum())
    jaccard = float(dedup.sketcher.jaccard(sketches[:1], sketches[1:])[0])
    hex_a, hex_b = fingerprint_hex(fps)
    return Explanation(
        normalized=(batch.normalized[0], batch.normalized[1]),
        fingerprints=(hex_a, hex_b),
        distance=distance,
        estimated_jaccard=jaccard,
        verdict=verdict_b,
    )

