"""What the decision core needs to know of each text: its fingerprint and its bottom-k sketch; and, given
the index's table plan, the batch's table keys and its near pairs within the batch.

Signing is the stateless half of the decision core (no index state involved), so it can run anywhere: in the
deciding process, or in worker processes (:class:`SignerPool`) while the decider looks up and stores the
previous batch. Both give the same :class:`Signatures` for the same texts and settings.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from .features import FeatureExtractor
from .fingerprint import FingerprintBatch, Fingerprinter
from .index import UNMEASURED, IndexPlan, TableKeys, first_copies, table_keys, with_copies
from .minhash import EMPTY_SLOT, SKETCH_DTYPE, BottomK
from .names import NOT_SIGNED
from .settings import DedupSettings, FingerprintSettings
from .workers import WorkerProcess

__all__ = ["SIGNING_SCHEME", "BatchPairs", "Signatures", "Signer", "SignerPool", "signing_id"]

_T = TypeVar("_T")

SIGNING_SCHEME = 3
"""Incremented whenever the same settings give other fingerprints or sketches than before (2: each segment samples its
own features, and a feature's segment is its identity's range; 3: sketches of 31-bit values, 4 bytes each), so that
an index built by older code refuses to be searched with the new ones."""

SIGNER_NICENESS = 10
"""Signing workers run batches ahead of the decider, which is serial: when both want one core, the decider
should have it (at nice 10 the scheduler gives a signer about a tenth of a contested core)."""


@dataclass(frozen=True)
class BatchPairs:
    """Indexable texts of one batch that share a table key and lie within the plan's radius, sorted by
    (earlier, later): their rows, Hamming distance and the Jaccard estimate of their sketches (``UNMEASURED`` and
    NaN where not made yet: see :meth:`Signer.keyed` and :meth:`estimated`).

    Of texts signed alike (the same fingerprint and sketch: copies), only the first is ever an earlier side, and
    each later copy is paired with its first copy and with the earlier sides of its first copy, whatever the
    candidate bounds: a later copy can be kept only where the stored entries' expiry sets it apart from the
    first, and ``copies`` (each row's first copy, None when every pair is here) lets the decision core see that
    and ask for every pair. A storm of n copies then makes n pairs, not n**2 / 2 in every table."""

    earlier: np.ndarray
    later: np.ndarray
    distances: np.ndarray
    jaccard: np.ndarray
    copies: np.ndarray | None = None

    def estimated(self, keep: np.ndarray, sketcher: BottomK, fps: np.ndarray, sketches: np.ndarray) -> BatchPairs:
        """The pairs where ``keep`` (a mask), each with its distance and Jaccard estimate: those not made yet made
        now."""
        earlier, later = self.earlier[keep], self.later[keep]
        distances, jaccard = self.distances[keep], self.jaccard[keep]
        unmeasured = np.flatnonzero(distances == UNMEASURED)
        if len(unmeasured):
            apart = fps[earlier[unmeasured]] ^ fps[later[unmeasured]]
            distances[unmeasured] = np.bitwise_count(apart).sum(axis=1)
        missing = np.flatnonzero(np.isnan(jaccard))
        if len(missing):
            jaccard[missing] = sketcher.jaccard(sketches, sketches[earlier[missing]], a_rows=later[missing])
        return BatchPairs(earlier, later, distances, jaccard, self.copies)


@dataclass(frozen=True)
class Signatures:
    """Per text: fingerprint row, bottom-k sketch row, error (or None) and whether it had no features. Signed
    under a table plan, also the batch's ``keys`` under it and its near ``pairs``."""

    fingerprints: np.ndarray
    sketches: np.ndarray
    errors: tuple[str | None, ...]
    empty: np.ndarray
    keys: TableKeys | None = None
    pairs: BatchPairs | None = None

    def __len__(self) -> int:
        return len(self.errors)

    @classmethod
    def joined(cls, parts: Sequence[Signatures]) -> Signatures:
        """The signatures of consecutive batches as one batch's, without keys and pairs (pairs across the
        batches are not in any part's): keying the whole finds them. One part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([part.fingerprints for part in parts]),
            np.concatenate([part.sketches for part in parts]),
            tuple(error for part in parts for error in part.errors),
            np.concatenate([part.empty for part in parts]),
        )

    def subset(self, rows: slice | Sequence[int]) -> Signatures:
        """The signatures of these rows alone, without the batch's keys and pairs (keying the rows makes theirs)."""
        errors = self.errors[rows] if isinstance(rows, slice) else tuple(self.errors[row] for row in rows)
        return Signatures(self.fingerprints[rows], self.sketches[rows], errors, self.empty[rows])

    @property
    def indexable(self) -> np.ndarray:
        """Texts with features and without an error: the ones that can be looked up and stored."""
        if self.errors.count(None) == len(self.errors):
            # The common batch, without an error: no Python step per text.
            return ~self.empty
        failed = np.fromiter((error is not None for error in self.errors), dtype=bool, count=len(self.errors))
        return ~(self.empty | failed)


def signing_id(fingerprint: FingerprintSettings, policy: DedupSettings) -> str:
    """How texts are signed, in a few words an index records: the scheme and a digest of every setting that
    shapes a fingerprint or a sketch. The same id means the same signatures for the same texts."""
    shaping = {
        "fingerprint": fingerprint.model_dump(mode="json"),
        "sketch_size": policy.sketch_size,
        "sketch_features": None if policy.sketch_features is None else policy.sketch_features.model_dump(mode="json"),
    }
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]
    return f"scheme {SIGNING_SCHEME}, settings {digest}"


class Signer:
    """Fingerprints and sketches texts under one configuration; with a table ``plan`` (the index's), also
    keys the batch and finds its near pairs, the index-free part of a lookup."""

    def __init__(self, fingerprint: FingerprintSettings, policy: DedupSettings, plan: IndexPlan | None = None) -> None:
        self.plan = plan
        self._key_capacity = policy.key_capacity
        self._max_candidates = policy.max_candidates
        # A sketch of the fingerprint's own features reads each document's sketch_size first ones.
        keep = policy.sketch_size if policy.sketch_features is None else 0
        self.fingerprinter = Fingerprinter.from_settings(fingerprint, keep_features=keep)
        self.sketcher = BottomK(policy.sketch_size)
        self._shingler = (
            None
            if policy.sketch_features is None
            else FeatureExtractor(policy.sketch_features, fingerprint.hash, fingerprint.seed)
        )

    def sign(self, texts: Sequence[str]) -> Signatures:
        """The texts' signatures. A batch whose signing raises (a step that works on the whole batch, set off by
        one text) is signed again in halves, down to the texts that fail alone: each of those gets an error,
        "could not sign this text: Class: message", and is neither looked up nor stored. The halves' keys are
        left for the decision core to make."""
        try:
            return self.sign_batch(self.fingerprinter.fingerprint_batch(texts))
        except Exception as exc:
            if len(texts) <= 1:
                return self._unsigned(len(texts), exc)
            half = len(texts) // 2
            return Signatures.joined([self.sign(texts[:half]), self.sign(texts[half:])])

    def _unsigned(self, count: int, error: Exception) -> Signatures:
        width = self.fingerprinter.width // 64
        return Signatures(
            np.zeros((count, width), dtype=np.uint64),
            np.full((count, self.sketcher.k), EMPTY_SLOT, dtype=SKETCH_DTYPE),
            (f"{NOT_SIGNED}: {type(error).__name__}: {error}",) * count,
            np.zeros(count, dtype=bool),
        )

    def sign_batch(self, batch: FingerprintBatch) -> Signatures:
        """Signatures of an already fingerprinted batch (the sketch reads its features)."""
        features = batch.features if self._shingler is None else self._shingler.extract(batch.normalized)
        signatures = Signatures(batch.fingerprints, self.sketcher.sketch(features), batch.errors, batch.empty)
        return signatures if self.plan is None else self.keyed(signatures)

    def keyed(self, signatures: Signatures, *, every_pair: bool = False, estimate: bool = True) -> Signatures:
        """``signatures`` with their table keys under this signer's plan and their near pairs (see
        :class:`BatchPairs`: only first copies as the earlier side, unless ``every_pair``). ``estimate=False``
        leaves the pairs' Jaccard estimates, and their distances where the radius cuts nothing, to be made where
        needed: the decision core, which keys batches joined after signing, needs only the pairs of texts the
        index does not match already (about a quarter on natural text)."""
        if self.plan is None:
            raise ValueError("a signer without a table plan cannot key signatures")
        fps = signatures.fingerprints
        keys = table_keys(self.plan, fps)
        copies = first_copies(fps, signatures.sketches)
        firsts = copies == np.arange(len(copies))
        earlier, later, distances = keys.pairs(
            fps,
            None if every_pair else firsts,
            key_capacity=self._key_capacity,
            max_candidates=self._max_candidates,
            measured=estimate,
        )
        # As a stored copy is found by its contents (``index.contents``) whatever its keys, a copy in
        # the batch is compared with its first copy, and with what that was compared with: a bound never lets a
        # copy through that its first copy did not get past.
        earlier, later, distances = with_copies((earlier, later, distances), copies)
        indexable = signatures.indexable
        usable = indexable[earlier] & indexable[later]
        earlier, later, distances = earlier[usable], later[usable], distances[usable]
        jaccard = (
            self.sketcher.jaccard(signatures.sketches, signatures.sketches[earlier], a_rows=later)
            if estimate
            else np.full(len(earlier), np.nan)
        )
        pairs = BatchPairs(earlier, later, distances, jaccard, None if every_pair else copies)
        return replace(signatures, keys=keys, pairs=pairs)


def _sign(signer: Signer, texts: list[str]) -> Signatures:
    return signer.sign(texts)


class SignerPool:
    """Worker processes (:class:`~streamdedup.workers.WorkerProcess`) that sign batches, so signing one batch
    overlaps deciding the previous one. Batches go to the workers in turn; each worker's are signed in order.
    A dead worker fails the futures of its batches with :class:`~streamdedup.workers.WorkerDied`, and
    ``on_death(pool)`` is called (from a helper thread) as it dies. ``stop`` is idempotent and waits for the
    workers to exit."""

    def __init__(
        self,
        fingerprint: FingerprintSettings,
        policy: DedupSettings,
        workers: int,
        plan: IndexPlan | None = None,
        *,
        on_death: Callable[[SignerPool], None] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        died = None if on_death is None else functools.partial(on_death, self)
        self._processes = [
            WorkerProcess(
                Signer,
                (fingerprint, policy, plan),
                name=f"streamdedup-signer-{n}",
                niceness=SIGNER_NICENESS,
                on_death=died,
            )
            for n in range(workers)
        ]
        self._turn = 0
        self._stopped = False

    @property
    def pids(self) -> list[int | None]:
        """The workers' process ids."""
        return [process.pid for process in self._processes]

    def submit(self, texts: Sequence[str]) -> Future[Signatures]:
        return self.run(_sign, list(texts))

    def run(self, function: Callable[..., _T], *args: Any) -> Future[_T]:
        """``function(signer, *args)`` in the next worker in turn (``function`` importable, so that it pickles):
        work that belongs with signing, such as reading the records whose texts it signs."""
        if self._stopped:
            raise RuntimeError("the signer pool is stopped")
        turn, self._turn = self._turn, (self._turn + 1) % self.workers
        result: Future[_T] = self._processes[turn].submit(function, *args)
        return result

    def warm_up(self) -> list[Future[Signatures]]:
        """An empty batch for every worker: each builds its lookup tables now (~0.3 s), not in its first batch."""
        if self._stopped:
            raise RuntimeError("the signer pool is stopped")
        return [process.submit(_sign, []) for process in self._processes]

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        # Batches already submitted are still signed: the workers finish them before they exit.
        for process in self._processes:
            process.stop()

    def __enter__(self) -> SignerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
