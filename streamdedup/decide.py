"""The decision core: a batch of documents in, one verdict each out; the index updated in one transaction.

Pure numpy/Python: no Kafka, asyncio or metrics here, so the service, the offline mode and the benchmarks
give the same answers on the same stream. A document is a duplicate when an earlier *kept* document (stored,
or earlier in the same batch) lies within the Hamming radius and, when verification is on, its stored
bottom-k MinHash sketch agrees that the two texts overlap enough. Only kept documents enter the index, so
what the index holds is exactly what was published.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise
from operator import itemgetter
from pathlib import Path
from typing import cast, get_args

import numpy as np

from .document import Document
from .index import SKETCH_PAYLOAD, STORAGE_ERRORS, Candidates, SegmentIndex, TableKeys
from .index.keys import most_shared
from .index.packed_ids import PackedIds
from .minhash import SKETCH_DTYPE
from .names import NOT_DECIDED
from .settings import Settings
from .signature import BatchPairs, Signatures, Signer, signing_id
from .verdicts import Reason, Verdicts

__all__ = ["BatchTimings", "Deduplicator", "open_index"]

log = logging.getLogger(__name__)

_REASONS = np.array(get_args(Reason), dtype=object)
_NOVEL, _EXACT, _NEAR, _REDELIVERED, _UNINDEXABLE = range(len(_REASONS))

_FIRST_VERIFIED = 1
"""Stored candidates of each row verified in the first round (see ``Deduplicator._stored_matches``)."""
_DEEPER_EACH_ROUND = 4
"""How many times as deep into each row's candidates a round goes as the one before."""
_EXACT_SHARED = 1 << 16
"""The tables an exact copy found by content counts as sharing: more than any, so it ranks before them all."""

_RESOLVE_ROUNDS = 8
"""Rounds of the vectorised in-batch resolution before the rest goes row by row (``_duplicates_in_stream_order``)."""

# What no single document is to blame for: such errors fail the batch, whose documents then wait for a retry.
_BATCH_ERRORS: tuple[type[BaseException], ...] = (*STORAGE_ERRORS, MemoryError)


@dataclass(frozen=True, slots=True)
class BatchTimings:
    """Seconds spent per stage of the last batch, for whoever measures (the service's metrics, benchmarks);
    ``batches``: how many batches were decided together with it (its share of their time is what it shows), and
    ``leads`` and ``closes`` whether it was the first and the last of them (one call of the decision core began and
    ended with it)."""

    fingerprint: float = 0.0
    lookup: float = 0.0
    store: float = 0.0
    batches: int = 1
    leads: bool = True
    closes: bool = True

    def share(self, fraction: float, batches: int, *, leads: bool, closes: bool) -> BatchTimings:
        """One batch's part of the timings of ``batches`` decided together: ``fraction`` of each stage."""
        return BatchTimings(
            self.fingerprint * fraction, self.lookup * fraction, self.store * fraction, batches, leads, closes
        )


@dataclass(frozen=True)
class _StoredCandidates:
    """Accepted stored candidates, best first within each row: the row, how many kept documents were stored
    after the entry, and where its id, distance and Jaccard estimate are (``slots``)."""

    rows: np.ndarray
    kept_after: np.ndarray
    slots: np.ndarray
    ids: Sequence[str]
    distances: np.ndarray
    jaccard: np.ndarray

    @classmethod
    def none(cls) -> _StoredCandidates:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, empty, empty, [], empty, empty)

    def visible(self, kept_before: np.ndarray | None, max_entries: int | None) -> np.ndarray | None:
        """Which candidates each row sees: those with fewer than ``max_entries`` kept documents between them
        (stored after the entry, and ``kept_before`` the row in its batch); None: all."""
        if kept_before is None or max_entries is None:
            return None
        return self.kept_after + kept_before[self.rows] < max_entries

    def best(self, visible: np.ndarray | None, *, by_id: bool) -> _Matches:
        """Each row's best visible candidate, settled by id or not."""
        order = np.arange(len(self.rows)) if visible is None else np.flatnonzero(visible)
        first = order[np.unique(self.rows[order], return_index=True)[1]]
        slots = self.slots[first]
        return _Matches(
            self.rows[first],
            _ids_at(self.ids, slots),
            self.distances[slots],
            self.jaccard[slots],
            np.full(len(first), by_id),
        )


@dataclass(frozen=True)
class _Passed:
    """The stored candidates (positions in a lookup's :class:`Candidates`) that one round verified and passed,
    with what a match reports, and whether ``max_entries`` can hide them from their row."""

    candidates: np.ndarray
    kept_after: np.ndarray
    ids: PackedIds
    distances: np.ndarray
    jaccard: np.ndarray
    surely_visible: np.ndarray

    def shifted(self, offset: int) -> _Passed:
        """These candidates at positions ``offset`` further (their lookup's candidates joined after others)."""
        return replace(self, candidates=self.candidates + offset)

    @staticmethod
    def ranked(rounds: Sequence[_Passed], query: np.ndarray, found: Candidates) -> _StoredCandidates:
        """Every round's candidates, best first per row: the order they were verified in (most shared tables,
        then earliest stored)."""
        candidates = np.concatenate([each.candidates for each in rounds]) if rounds else np.zeros(0, np.intp)
        if not len(candidates):
            return _StoredCandidates.none()
        order = np.lexsort((found.entries[candidates], -found.shared[candidates], query[candidates]))
        return _StoredCandidates(
            query[candidates[order]],
            np.concatenate([each.kept_after for each in rounds])[order],
            order,
            PackedIds.joined([each.ids for each in rounds]),
            np.concatenate([each.distances for each in rounds]),
            np.concatenate([each.jaccard for each in rounds]),
        )


@dataclass(frozen=True)
class _Matches:
    """Matched rows (ascending, distinct), each with its match's id, Hamming distance and Jaccard estimate, and
    whether the id settled it (a redelivery, or an earlier row of the same id)."""

    rows: np.ndarray
    ids: np.ndarray
    distances: np.ndarray
    jaccard: np.ndarray
    by_id: np.ndarray

    @classmethod
    def none(cls) -> _Matches:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, np.zeros(0, dtype=object), empty, np.zeros(0), np.zeros(0, dtype=bool))

    def over(self, other: _Matches) -> _Matches:
        """These matches, and ``other``'s of the rows these leave unmatched."""
        rows = np.concatenate([self.rows, other.rows])
        first = np.unique(rows, return_index=True)[1]
        return _Matches(
            rows[first],
            np.concatenate([self.ids, other.ids])[first],
            np.concatenate([self.distances, other.distances])[first],
            np.concatenate([self.jaccard, other.jaccard])[first],
            np.concatenate([self.by_id, other.by_id])[first],
        )

    def matched(self, count: int) -> np.ndarray:
        """Whether each of ``count`` rows is matched."""
        matched = np.zeros(count, dtype=bool)
        matched[self.rows] = True
        return matched


def _ids_at(ids: Sequence[str], slots: np.ndarray) -> np.ndarray:
    """The ids at ``slots`` as an object array; packed ids decode only these."""
    chosen = np.empty(len(slots), dtype=object)
    chosen[:] = list(ids.take(slots)) if isinstance(ids, PackedIds) else [ids[slot] for slot in slots.tolist()]
    return chosen


def _duplicates_in_stream_order(matched: np.ndarray, rows: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Which rows are duplicates: those ``matched`` already, and each row with a candidate (an earlier row of the
    pairs ``rows``, ``candidates``) that is not one itself, decided in stream order.

    A row's verdict depends only on earlier rows', so the verdicts are the one fixed point of "duplicate when
    matched or when some candidate is kept". Each round settles at least the next row in order, and settles
    every row whose candidates are settled: a chain of k rows, each the only candidate of the next, takes k
    rounds, a burst of copies of one document two. After a few rounds the rest goes row by row."""
    duplicate = matched.copy()
    for _ in range(_RESOLVE_ROUNDS):
        kept_candidate = np.zeros(len(matched), dtype=bool)
        kept_candidate[rows[~duplicate[candidates]]] = True
        settled = matched | kept_candidate
        if np.array_equal(settled, duplicate):
            return duplicate
        duplicate = settled
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1]))) if len(rows) else rows
    bounds = np.append(starts, len(rows)).tolist()
    for low, high in pairwise(bounds):
        row = int(rows[low])
        duplicate[row] = matched[row] or not duplicate[candidates[low:high]].all()
    return duplicate


_ID, _TIME, _ORIGIN = (itemgetter(Document._fields.index(name)) for name in ("id", "time", "origin"))
_OFFSET = itemgetter(2)
"""An origin's offset: (topic, partition, offset)."""


def _columns(docs: Sequence[Document]) -> tuple[list[str], np.ndarray, list[tuple[str, int, int] | None]]:
    """The documents' ids, event times and origins (without a container object a document, which would set off
    the garbage collector)."""
    times = np.fromiter(map(_TIME, docs), dtype=np.float64, count=len(docs))
    return list(map(_ID, docs)), times, list(map(_ORIGIN, docs))


def _offsets(origins: list[tuple[str, int, int] | None]) -> np.ndarray:
    """Each origin's offset, -1 where there is none (a batch from Kafka has them all, one from a file none)."""
    if None not in origins:
        return np.fromiter(map(_OFFSET, cast("list[tuple[str, int, int]]", origins)), np.int64, len(origins))
    return np.fromiter((-1 if origin is None else origin[2] for origin in origins), np.int64, len(origins))


def _payloads(sketches: np.ndarray) -> np.ndarray:
    """The index's payloads of these sketches: each row's bytes."""
    return np.ascontiguousarray(sketches).view(np.uint8).reshape(len(sketches), sketches.shape[1] * sketches.itemsize)


def open_index(settings: Settings, path: Path, *, durable: bool = True) -> SegmentIndex:
    """The index the settings describe, at ``path``: the one place service and offline mode open it.

    ``durable=False`` skips the fsync per batch (``index.sync``) for a run that cannot resume after an OS
    crash anyway (the offline mode); the index is flushed once when it closes."""
    index_settings = settings.index if durable else settings.index.model_copy(update={"sync": False})
    return SegmentIndex.from_settings(
        index_settings,
        bits=settings.fingerprint.width,
        payload_bytes=settings.dedup.sketch_size * SKETCH_DTYPE.itemsize,
        path=path,
        segments=settings.fingerprint.segments,
        signing=signing_id(settings.fingerprint, settings.dedup),
        key_capacity=settings.dedup.key_capacity,
        payload_kind=SKETCH_PAYLOAD,
    )


class Deduplicator:
    """Fingerprint, look up, decide and remember, one batch at a time."""

    def __init__(self, settings: Settings, index: SegmentIndex) -> None:
        self.settings = settings
        self.index = index
        self.signer = Signer(settings.fingerprint, settings.dedup, index.plan)
        self.sketcher = self.signer.sketcher
        policy = settings.dedup
        self._radius = settings.index.radius
        self._max_age = settings.index.max_age_seconds
        self._max_entries = settings.index.max_entries
        self._verify = policy.verify
        self._min_jaccard = policy.min_jaccard
        self._max_candidates = policy.max_candidates
        self.last_timings = BatchTimings()
        # Per document of the last batch: the stored and in-batch documents its sketch was compared with.
        self.last_candidates = np.zeros(0, dtype=np.int64)

    def decide(
        self,
        docs: Sequence[Document],
        *,
        source_offsets: Mapping[tuple[str, int], int] | None = None,
        signatures: Signatures | None = None,
        part_offsets: Sequence[tuple[int, Mapping[tuple[str, int], int]]] | None = None,
    ) -> Verdicts:
        """Verdicts for ``docs`` in order; kept documents and ``source_offsets`` stored in one transaction.

        ``part_offsets``, in place of ``source_offsets``: ``docs`` are consecutive batches, given as (end, the
        source offsets after it); the index stores each as a batch of its own (in the same transaction), so that
        a rollback to the offsets after any of them is exact.

        ``signatures`` of the documents' texts, when signed elsewhere (a :class:`SignerPool`), save signing here;
        signed under the index's plan, they also save keying the batch.

        A batch whose decision raises (a bug some document sets off) is decided again in halves, each its own
        transaction, down to the documents that fail alone: each of those gets the verdict ``unindexable`` with
        the error and is not stored (the service dead-letters it), and the error is logged; a stream never stops
        on one document.
        Storage errors (a full disk) fail the batch as a whole.
        """
        if signatures is None:
            signatures = self.signer.sign([doc.text for doc in docs])
        elif len(signatures) != len(docs):
            raise ValueError(f"{len(signatures)} signatures for {len(docs)} documents")
        if part_offsets is not None:
            try:
                return self._decide(docs, None, signatures, part_offsets)
            except _BATCH_ERRORS:
                raise
            except Exception:
                # Decided again in halves below, with the offsets after the last part.
                source_offsets = {}
                for _, offsets in part_offsets:
                    source_offsets.update(offsets)
        return self._decided_or_apart(docs, source_offsets, signatures)

    def _decided_or_apart(
        self, docs: Sequence[Document], source_offsets: Mapping[tuple[str, int], int] | None, signatures: Signatures
    ) -> Verdicts:
        try:
            return self._decide(docs, source_offsets, signatures)
        except _BATCH_ERRORS:
            raise
        except Exception as exc:
            if len(docs) == 1:
                return self._unjudged(docs[0], source_offsets, signatures, exc)
            log.warning("deciding %d documents failed (%r); deciding them in halves", len(docs), exc)
            half = len(docs) // 2
            # The batch's offsets go with its last part.
            first = self._decided_or_apart(docs[:half], None, signatures.subset(slice(None, half)))
            second = self._decided_or_apart(docs[half:], source_offsets, signatures.subset(slice(half, None)))
            return Verdicts.joined(first, second)

    def store(
        self,
        docs: Sequence[Document],
        *,
        signatures: Signatures | None = None,
        source_offsets: Mapping[tuple[str, int], int] | None = None,
        part_offsets: Sequence[tuple[int, Mapping[tuple[str, int], int]]] | None = None,
    ) -> None:
        """Store ``docs`` as kept, deciding nothing, and ``source_offsets``, in one LMDB transaction, as
        :meth:`decide` stores the documents it keeps: an index given the documents another decision core kept, in
        its calls, ends as that core's index did, whatever bounds bound its decisions. ``signatures`` as for
        :meth:`decide`; ``part_offsets``, in place of ``source_offsets``: ``docs`` are the kept documents of
        consecutive batches decided in one call, given as (end, the source offsets after it), stored as that call
        stored them."""
        if signatures is None:
            signatures = self.signer.sign([doc.text for doc in docs])
        elif len(signatures) != len(docs):
            raise ValueError(f"{len(signatures)} signatures for {len(docs)} documents")
        if not signatures.indexable.all():
            raise ValueError("a document without features, or that could not be signed, is never kept")
        ids, times, origins = _columns(docs)
        self.index.add(
            ids,
            signatures.fingerprints,
            times=times,
            payloads=_payloads(signatures.sketches),
            origins=origins,
            source_offsets=source_offsets,
            parts=part_offsets,
        )

    def _unjudged(
        self,
        doc: Document,
        source_offsets: Mapping[tuple[str, int], int] | None,
        signatures: Signatures,
        error: Exception,
    ) -> Verdicts:
        """The verdict of a document that cannot be decided: passed on, not stored, with the error."""
        log.error("document %r cannot be decided", doc.id, exc_info=error)
        if source_offsets:
            self.index.add([], signatures.fingerprints[:0], source_offsets=source_offsets)
        reason = f"{NOT_DECIDED}: {type(error).__name__}: {error}"
        return Verdicts(
            np.ones(1, dtype=bool), ["unindexable"], signatures.fingerprints, [None], [None], [None], (reason,)
        )

    def _decide(
        self,
        docs: Sequence[Document],
        source_offsets: Mapping[tuple[str, int], int] | None,
        signatures: Signatures,
        part_offsets: Sequence[tuple[int, Mapping[tuple[str, int], int]]] | None = None,
    ) -> Verdicts:
        started = time.perf_counter()
        if signatures.keys is None or not signatures.keys.plan.same_lookup(self.index.plan):
            signatures = self.signer.keyed(signatures, estimate=False)
        keys, pairs = signatures.keys, signatures.pairs
        assert keys is not None and pairs is not None
        fps, sketches = signatures.fingerprints, signatures.sketches
        ids, times, origins = _columns(docs)
        indexable = signatures.indexable
        id_column = np.empty(len(ids), dtype=object)
        id_column[:] = ids
        fingerprinted = time.perf_counter()

        redeliveries = self._stored_redeliveries(ids, origins, fps, times, sketches)
        stored, stored_counts, lookup = self._stored_matches(ids, origins, fps, times, sketches, indexable, keys)
        self.last_candidates = stored_counts + np.bincount(pairs.later, minlength=len(docs))
        repeats = self._repeated_ids(ids, fps, sketches, indexable)
        # What a row sees depends on how many rows before it are kept (max_entries), which depends on what those
        # rows saw: decide with every candidate visible, then again with the kept counts the verdicts give,
        # until they stay. Row r is settled after r rounds; a batch without a candidate at the edge takes one.
        kept_before: np.ndarray | None = None
        while True:
            redelivered = redeliveries.best(redeliveries.visible(kept_before, self._max_entries), by_id=True)
            # An id settles what it names, whatever a text's nearest match.
            stored_matches = redelivered.over(stored.best(stored.visible(kept_before, self._max_entries), by_id=False))
            matches = stored_matches.over(
                self._resolve_within_batch(id_column, times, fps, sketches, pairs, stored_matches, repeats, kept_before)
            )
            if pairs.copies is not None and self._kept_later_copy(indexable, pairs.copies, matches):
                # Only first copies were candidates, which is exact while no later copy is kept: here one is.
                every_pair = self.signer.keyed(signatures, every_pair=True, estimate=False).pairs
                assert every_pair is not None
                pairs = every_pair
                matches = stored_matches.over(
                    self._resolve_within_batch(
                        id_column, times, fps, sketches, pairs, stored_matches, repeats, kept_before
                    )
                )
            duplicate = matches.matched(len(docs))
            if self._max_entries is None:
                break
            kept = indexable & ~duplicate
            counted = np.concatenate([[0], np.cumsum(kept[:-1])]) if len(kept) else np.zeros(0, dtype=np.int64)
            if kept_before is None:
                if not self._window_cuts(counted, stored, redeliveries, pairs, repeats):
                    break
            elif np.array_equal(counted, kept_before):
                break
            kept_before = counted

        verdicts = self._verdicts(fps, indexable, matches, signatures.errors)

        looked_up = time.perf_counter()
        keep = np.flatnonzero(indexable & ~duplicate)
        # The kept rows' keys as the lookup saw them, with the rows each key holds: not read again to store them.
        kept_keys = keys.subset(keep) if lookup is None else lookup[1].subset(np.searchsorted(lookup[0], keep))
        parts = None
        if part_offsets is not None:
            kept_ends = np.searchsorted(keep, [end for end, _ in part_offsets]).tolist()
            parts = [(kept_end, offsets) for kept_end, (_, offsets) in zip(kept_ends, part_offsets, strict=True)]
        kept_rows = keep.tolist()
        self.index.add(
            list(map(ids.__getitem__, kept_rows)),
            fps[keep],
            times=times[keep],
            payloads=_payloads(sketches[keep]),
            origins=list(map(origins.__getitem__, kept_rows)),
            source_offsets=source_offsets,
            keys=kept_keys,
            parts=parts,
        )
        self.last_timings = BatchTimings(
            fingerprinted - started, looked_up - fingerprinted, time.perf_counter() - looked_up
        )
        return verdicts

    def _verdicts(
        self, fps: np.ndarray, indexable: np.ndarray, matches: _Matches, errors: tuple[str | None, ...]
    ) -> Verdicts:
        """The batch's verdicts, column by column."""
        count = len(fps)
        reason = np.where(indexable, _NOVEL, _UNINDEXABLE)
        exact = (matches.distances == 0) & (not self._verify or matches.jaccard >= 1.0)
        reason[matches.rows] = np.where(matches.by_id, _REDELIVERED, np.where(exact, _EXACT, _NEAR))
        match_ids, distances, jaccards = (np.full(count, None, dtype=object) for _ in range(3))
        match_ids[matches.rows] = matches.ids
        distances[matches.rows] = matches.distances.tolist()
        jaccards[matches.rows] = matches.jaccard.tolist()
        return Verdicts(
            ~matches.matched(count),
            _REASONS[reason].tolist(),
            fps,
            match_ids.tolist(),
            distances.tolist(),
            jaccards.tolist(),
            errors,
        )

    def _accepts(self, jaccard: np.ndarray) -> np.ndarray:
        return jaccard >= self._min_jaccard if self._verify else np.ones(len(jaccard), dtype=bool)

    def _window_cuts(
        self,
        kept_before: np.ndarray,
        stored: _StoredCandidates,
        redeliveries: _StoredCandidates,
        pairs: BatchPairs,
        repeats: BatchPairs,
    ) -> bool:
        """Whether these kept counts hide any candidate from its row (``max_entries``)."""
        hidden = [
            not visible.all()
            for visible in (
                stored.visible(kept_before, self._max_entries),
                redeliveries.visible(kept_before, self._max_entries),
            )
            if visible is not None
        ]
        return any(hidden) or any(
            not self._in_window(kept_before, found.earlier, found.later).all() for found in (pairs, repeats)
        )

    def _in_window(self, kept_before: np.ndarray | None, earlier: np.ndarray, later: np.ndarray) -> np.ndarray:
        """Whether fewer than ``max_entries`` documents were kept between each earlier and later row."""
        if kept_before is None or self._max_entries is None:
            return np.ones(len(earlier), dtype=bool)
        return kept_before[later] - kept_before[earlier] <= self._max_entries

    def _fresh(self, candidate_times: np.ndarray, query_times: np.ndarray) -> np.ndarray:
        """Expiry by each document's own event time, so replays and batch boundaries cannot change it."""
        if self._max_age is None:
            return np.ones(len(candidate_times), dtype=bool)
        return candidate_times >= query_times - self._max_age

    def _ranked(
        self,
        rows: np.ndarray,
        candidates: np.ndarray,
        distances: np.ndarray,
        jaccard: np.ndarray,
        candidate_times: np.ndarray,
        row_times: np.ndarray,
        by_id: np.ndarray,
        visible: np.ndarray,
    ) -> np.ndarray:
        """Indices of the acceptable, ``visible`` (row, earlier row of the batch) pairs, best first within each row:
        one of the same id (``by_id``, accepted whatever its overlap), then nearest, then most overlapping, then
        earliest."""
        # Most candidates fail: sorting only those that pass costs a fraction of sorting them all.
        ok = np.flatnonzero(self._fresh(candidate_times, row_times) & (self._accepts(jaccard) | by_id) & visible)
        return ok[np.lexsort((candidates[ok], -jaccard[ok], distances[ok], ~by_id[ok], rows[ok]))]

    def _stored_redeliveries(
        self,
        ids: list[str],
        origins: list[tuple[str, int, int] | None],
        fps: np.ndarray,
        times: np.ndarray,
        sketches: np.ndarray,
    ) -> _StoredCandidates:
        """Rows carrying the id of a fresh stored document from another origin: an upstream redelivery,
        whatever its text. From the same origin it is a replay of that very record (see ``_stored_matches``)."""
        rows, records = self.index.entries_with_ids(ids)
        if not len(rows):
            return _StoredCandidates.none()
        other = np.fromiter(
            (origins[row] is None or origins[row] != records.origin(i) for i, row in enumerate(rows.tolist())),
            dtype=bool,
            count=len(rows),
        )
        slots = np.flatnonzero(other & self._fresh(records.times, times[rows]))
        rows = rows[slots]
        distances = np.bitwise_count(records.fingerprints[slots] ^ fps[rows]).sum(axis=1)
        jaccard = self.sketcher.jaccard(sketches[rows], records.payloads[slots].view(SKETCH_DTYPE))
        kept_after = self.index.kept_after(records.entries[slots])
        return _StoredCandidates(rows, kept_after, np.arange(len(rows)), [ids[row] for row in rows], distances, jaccard)

    def _repeated_ids(self, ids: list[str], fps: np.ndarray, sketches: np.ndarray, indexable: np.ndarray) -> BatchPairs:
        """Every (earlier, later) pair of rows of one id in the batch, the earlier one indexable (it can be kept
        and stored), with their distance and Jaccard estimate."""
        earlier: list[int] = []
        later: list[int] = []
        if len(set(ids)) < len(ids):
            # Repeated ids are rare: only then a step per row.
            seen: dict[str, list[int]] = {}
            for row, doc_id in enumerate(ids):
                before = seen.setdefault(doc_id, [])
                earlier.extend(before)
                later.extend([row] * len(before))
                if indexable[row]:
                    before.append(row)
        first, then = np.asarray(earlier, dtype=np.intp), np.asarray(later, dtype=np.intp)
        distances = np.bitwise_count(fps[first] ^ fps[then]).sum(axis=1).astype(np.int64)
        return BatchPairs(first, then, distances, self.sketcher.jaccard(sketches[then], sketches[first]))

    def _stored_matches(
        self,
        ids: list[str],
        origins: list[tuple[str, int, int] | None],
        fps: np.ndarray,
        times: np.ndarray,
        sketches: np.ndarray,
        indexable: np.ndarray,
        keys: TableKeys,
    ) -> tuple[_StoredCandidates, np.ndarray, tuple[np.ndarray, TableKeys] | None]:
        """Accepted stored candidates, best first per row; how many stored candidates each row was compared with;
        and the rows looked up in the tables with their keys and the rows each key holds, when the lookup counted
        them.

        A row's candidates are verified in this order: the exact copies the content index finds (see
        ``index.contents``), then the candidates of the tables, most tables shared first, the earliest stored among
        equals; its best candidate is the first in that order that passes. The exact copies go first, every row at
        once, and only the rows they leave open look up the tables: an exact copy costs one probe and one sketch,
        not the rows of its keys. Rounds then verify the first candidate of each row, then 4, 16, ...: a row stops
        at the first round with a candidate that passes and that ``max_entries`` cannot hide, so a near copy costs
        the sketches of a few candidates, not of all of them. The verdicts are those of verifying every one."""
        rows = np.flatnonzero(indexable)
        compared = np.zeros(len(ids), dtype=np.int64)
        if not len(rows) or not len(self.index):
            return _StoredCandidates.none(), compared, None
        # Each row's origin offset (-1 without one): only a candidate stored at the same offset can be its replay.
        offsets = _offsets(origins)
        verified = partial(
            self._verified,
            ids=ids,
            origins=origins,
            offsets=offsets,
            fps=fps,
            times=times,
            sketches=sketches,
            compared=compared,
        )
        settled = np.zeros(len(ids), dtype=bool)
        exact, exact_passed = self._same_contents(rows, fps, sketches, verified, settled)
        looked_up = rows[~settled[rows]]
        lookup_keys = keys.subset(looked_up)
        found = self.index.candidates(fps[looked_up], keys=lookup_keys, max_candidates=self._max_candidates)
        if found.held is not None:
            lookup_keys = lookup_keys.with_held(found.held)
        query = looked_up[found.rows]
        checked = np.zeros(len(found), dtype=bool)
        passed: list[_Passed] = []
        limit = _FIRST_VERIFIED
        while True:
            open_rows = np.flatnonzero(~settled[query])
            if checked[open_rows].all():
                break
            first = most_shared(
                found.rows[open_rows], found.entries[open_rows], found.shared[open_rows], limit, newest=False
            )
            top = open_rows[first]
            limit *= _DEEPER_EACH_ROUND
            batch = verified(top[~checked[top]], query, found)
            checked[top] = True
            passed.append(batch)
            settled[query[batch.candidates[batch.surely_visible]]] = True
        if exact_passed is None:
            return _Passed.ranked(passed, query, found), compared, (looked_up, lookup_keys)
        # Both lookups' candidates as one, each named by its batch row.
        joined = Candidates(
            np.concatenate([exact.rows, query]),
            np.concatenate([exact.entries, found.entries]),
            np.concatenate([exact.shared, found.shared]),
        )
        shifted = [exact_passed, *(each.shifted(len(exact)) for each in passed)]
        return _Passed.ranked(shifted, joined.rows, joined), compared, (looked_up, lookup_keys)

    def _same_contents(
        self,
        rows: np.ndarray,
        fps: np.ndarray,
        sketches: np.ndarray,
        verified: Callable[[np.ndarray, np.ndarray, Candidates], _Passed],
        settled: np.ndarray,
    ) -> tuple[Candidates, _Passed | None]:
        """The stored entries of exactly the same contents as ``rows`` (the content index's), each named by its
        batch row, and those of them that pass, verified first and ranked before every candidate of the tables;
        the rows they settle are marked in ``settled``."""
        payloads = np.ascontiguousarray(sketches[rows]).view(np.uint8).reshape(len(rows), -1)
        same = self.index.same_contents(fps[rows], payloads)
        if same is None or not len(same[0]):
            empty = np.zeros(0, dtype=np.int64)
            return Candidates(empty, empty.astype(np.uint64), empty), None
        at, entries = same
        exact = Candidates(rows[at], entries, np.full(len(at), _EXACT_SHARED, dtype=np.int64))
        passed = verified(np.arange(len(at)), exact.rows, exact)
        settled[exact.rows[passed.candidates[passed.surely_visible]]] = True
        return exact, passed

    def _verified(
        self,
        candidates: np.ndarray,
        query: np.ndarray,
        found: Candidates,
        *,
        ids: list[str],
        origins: list[tuple[str, int, int] | None],
        offsets: np.ndarray,
        fps: np.ndarray,
        times: np.ndarray,
        sketches: np.ndarray,
        compared: np.ndarray,
    ) -> _Passed:
        """Of these ``found`` candidates (positions), those still stored that pass, with their records read;
        ``compared`` counts, per row, the candidates verified."""
        present, candidate_times, payloads = self.index.times_and_payloads(found.entries[candidates])
        if not present.all():
            candidates, candidate_times, payloads = candidates[present], candidate_times[present], payloads[present]
        compared += np.bincount(query[candidates], minlength=len(compared))
        jaccard = self.sketcher.jaccard(sketches, payloads.view(SKETCH_DTYPE), a_rows=query[candidates])
        # Most candidates fail: only those that pass have their records read.
        passing = np.flatnonzero(self._accepts(jaccard) & self._fresh(candidate_times, times[query[candidates]]))
        present, records = self.index.records_of(found.entries[candidates[passing]], payloads=False)
        passing = passing[present]
        candidates, jaccard = candidates[passing], jaccard[passing]
        rows = query[candidates]
        # A replayed record (the same origin) is not its own duplicate.
        replayed = records.origin_rows["offset"] == offsets[rows]
        for i in np.flatnonzero(replayed).tolist():
            replayed[i] = records.origin(i) == origins[int(rows[i])]
        own = np.flatnonzero(~replayed)
        kept_after = self.index.kept_after(found.entries[candidates[own]])
        return _Passed(
            candidates[own],
            kept_after,
            records.ids.take(own),
            np.bitwise_count(records.fingerprints[own] ^ fps[rows[own]]).sum(axis=1).astype(np.int64),
            jaccard[own],
            # Seen by the row whatever the batch keeps before it: fewer kept documents than the batch has rows.
            np.ones(len(own), dtype=bool) if self._max_entries is None else kept_after + len(ids) < self._max_entries,
        )

    @staticmethod
    def _kept_later_copy(indexable: np.ndarray, copies: np.ndarray, matches: _Matches) -> bool:
        """Whether a copy after the first (see ``BatchPairs``) is kept: it stays unmatched though indexable."""
        unmatched = indexable & (copies != np.arange(len(copies))) & ~matches.matched(len(copies))
        return bool(unmatched.any())

    def _resolve_within_batch(
        self,
        ids: np.ndarray,
        times: np.ndarray,
        fps: np.ndarray,
        sketches: np.ndarray,
        pairs: BatchPairs,
        matches: _Matches,
        repeats: BatchPairs,
        kept_before: np.ndarray | None,
    ) -> _Matches:
        """The rows ``matches`` leave unmatched that match an earlier *kept* row of the same batch within
        ``max_entries`` kept documents (``kept_before`` each row; None: all), in stream order: those of the same
        id (``repeats``) first, then the near ones."""
        matched = matches.matched(len(ids))
        # A pair with a side matched already decides nothing (its row is a duplicate, or its candidate is): only
        # the others need their distances and estimates.
        pairs = pairs.estimated(~(matched[pairs.earlier] | matched[pairs.later]), self.sketcher, fps, sketches)
        earlier, later = np.concatenate([repeats.earlier, pairs.earlier]), np.concatenate([repeats.later, pairs.later])
        if not len(earlier):
            return _Matches.none()
        distances = np.concatenate([repeats.distances, pairs.distances])
        jaccard = np.concatenate([repeats.jaccard, pairs.jaccard])
        by_id = np.arange(len(earlier)) < len(repeats.earlier)
        visible = self._in_window(kept_before, earlier, later)
        order = self._ranked(later, earlier, distances, jaccard, times[earlier], times[later], by_id, visible)
        rows, candidates = later[order], earlier[order]
        duplicate = _duplicates_in_stream_order(matched, rows, candidates)
        # Each row matched here takes its best candidate that is kept itself (pairs come best first per row).
        taken = np.flatnonzero(~matched[rows] & ~duplicate[candidates])
        taken = order[taken[np.unique(rows[taken], return_index=True)[1]]]
        return _Matches(later[taken], ids[earlier[taken]], distances[taken], jaccard[taken], by_id[taken])
