"""What the decision core needs to know of each text: its fingerprint and its bottom-k sketch.

Signing is the stateless half of the decision core (no index involved), so it can run anywhere: in the
deciding process, or in worker processes (:class:`SignerPool`) while the decider looks up and stores the
previous batch. Both give the same :class:`Signatures` for the same texts and settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from .features import FeatureExtractor
from .fingerprint import FingerprintBatch, Fingerprinter
from .minhash import BottomK
from .settings import DedupSettings, FingerprintSettings
from .workers import worker_pool

__all__ = ["Signatures", "Signer", "SignerPool"]


@dataclass(frozen=True)
class Signatures:
    """Per text: fingerprint row, bottom-k sketch row, error (or None) and whether it had no features."""

    fingerprints: np.ndarray
    sketches: np.ndarray
    errors: tuple[str | None, ...]
    empty: np.ndarray

    def __len__(self) -> int:
        return len(self.errors)

    @property
    def indexable(self) -> np.ndarray:
        """Texts with features and without an error: the ones that can be looked up and stored."""
        failed = np.fromiter((error is not None for error in self.errors), dtype=bool, count=len(self.errors))
        return ~(self.empty | failed)


class Signer:
    """Fingerprints and sketches texts under one configuration."""

    def __init__(self, fingerprint: FingerprintSettings, policy: DedupSettings) -> None:
        self.fingerprinter = Fingerprinter.from_settings(fingerprint)
        self.sketcher = BottomK(policy.sketch_size)
        self._shingler = (
            None
            if policy.sketch_features is None
            else FeatureExtractor(policy.sketch_features, fingerprint.hash, fingerprint.seed)
        )

    def sign(self, texts: Sequence[str]) -> Signatures:
        return self.sign_batch(self.fingerprinter.fingerprint_batch(texts))

    def sign_batch(self, batch: FingerprintBatch) -> Signatures:
        """Signatures of an already fingerprinted batch (the sketch reads its features)."""
        features = batch.features if self._shingler is None else self._shingler.extract(batch.normalized)
        return Signatures(batch.fingerprints, self.sketcher.sketch(features), batch.errors, batch.empty)


_worker_signer: Signer | None = None


def _start_worker(fingerprint: FingerprintSettings, policy: DedupSettings) -> None:
    global _worker_signer
    _worker_signer = Signer(fingerprint, policy)


def _sign_in_worker(texts: list[str]) -> Signatures:
    assert _worker_signer is not None
    return _worker_signer.sign(texts)


class SignerPool:
    """Worker processes (:func:`~streamdedup.workers.worker_pool`) that sign batches, so signing one batch
    overlaps deciding the previous one. ``stop`` is idempotent and waits for the workers to exit."""

    def __init__(self, fingerprint: FingerprintSettings, policy: DedupSettings, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = worker_pool(workers, _start_worker, (fingerprint, policy))

    def submit(self, texts: Sequence[str]) -> Future[Signatures]:
        """The signatures to come; a pool broken by a dead worker fails the future (BrokenProcessPool), not
        the call, so every caller handles it in one place."""
        if self._executor is None:
            raise RuntimeError("the signer pool is stopped")
        try:
            return self._executor.submit(_sign_in_worker, list(texts))
        except BrokenProcessPool as exc:
            failed: Future[Signatures] = Future()
            failed.set_exception(exc)
            return failed

    def stop(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SignerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
