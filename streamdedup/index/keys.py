"""A batch's table keys under a plan, sorted once: what lookup, in-batch pairs and insert all read.

Pure numpy and no LMDB, so they can be computed wherever the fingerprints are (a signing worker, while the
index process decides the previous batch) and handed to the index with the batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from .plan import IndexPlan, fold, gather_bits, unpack_bits
from .sorted_rows import expand_ranges, run_starts

__all__ = [
    "FULL_RUN_LEADS",
    "LONE_SEGMENT_LIMIT",
    "RARE_SEGMENT_LIMIT",
    "UNMEASURED",
    "HeldRows",
    "TableKeys",
    "first_copies",
    "most_shared",
    "packed",
    "run_ranks",
    "table_keys",
    "table_rows",
    "with_copies",
]

LONE_SEGMENT_LIMIT = 12
"""Under a candidate bound, a document keyed in at least this many segments verifies only candidates that
share two or more of them. A copy at Jaccard 0.8 keeps each segment with a chance of about 0.8 ** 3 (a
segment is its three features of least hash), so it keeps at most one of 12 about once in 400 copies, and at
Jaccard 0.9 once in 190,000; a candidate that shares one segment of 12 shares a common phrase."""


UNMEASURED = -1
"""The distance of a pair not measured yet (see :meth:`TableKeys.pairs`)."""

FULL_RUN_LEADS = 4
"""Earlier sides of a batch's run of one key as long as ``dedup.key_capacity`` (a template, boilerplate): its
first rows. Its pairs would grow with the run's length times its earlier sides; the rows of such a run share a
common phrase, and a near copy of one of them shares that one's own rarer keys, whose runs are short. The first rows
are where a text made of nothing but common phrases finds its match."""


RARE_SEGMENT_LIMIT = 10
"""Under a candidate bound, a document keyed in at least this many segments whose keys are not full (hold fewer
than ``dedup.key_capacity`` rows) does not follow its full keys to their rows: those rows are the first documents
of a common phrase, the same for every document that has it, and all a full key could lead to. Only a near copy
of one of those first documents could be missed, and it shares the document's rarer segments as well: at
Jaccard 0.8 it keeps none of 10 about once in 1,300 copies, at 0.9 once in 470,000."""


@dataclass(frozen=True)
class HeldRows:
    """How many rows each position's key held in its table (merged and staged) when a lookup read them, and the
    index's count of batches that added keys then: a write that finds the count unmoved need not read them again
    (the rows of an entry-valued table only change with batches that add keys)."""

    counts: np.ndarray
    keyed_writes: int


@dataclass(frozen=True)
class TableKeys:
    """A batch's rows in every table of ``plan``, each table's row sorted by key: ``rows[t, i]`` is the batch
    row at sorted position i of table t, with key ``keys[t, i]`` and stored value ``values[t, i]``.
    ``runs[t, i]`` is true where position i starts a run of equal keys; ``folds`` are the rows' 64-bit folds."""

    plan: IndexPlan
    rows: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    runs: np.ndarray
    folds: np.ndarray
    held: HeldRows | None = None

    def __len__(self) -> int:
        return len(self.folds)

    def with_held(self, held: HeldRows) -> TableKeys:
        return replace(self, held=held)

    @property
    def unkeyed_zero(self) -> bool:
        """Segment plans leave an all-zero segment unkeyed: it stands for "too few features", not a value."""
        return self.plan.kind == "segments"

    def keyed_positions(self) -> np.ndarray:
        """(T, n): whether each position's key is one (a segment plan leaves a segment of too few features
        unkeyed)."""
        return self.keys != 0 if self.unkeyed_zero else np.ones(self.keys.shape, dtype=bool)

    def keyed(self) -> np.ndarray:
        """How many tables key each row."""
        tables, n = self.keys.shape
        if not self.unkeyed_zero:
            return np.full(n, tables, dtype=np.int64)
        return np.bincount(self.rows[self.keyed_positions()], minlength=n)

    def well_shared(self, rows: np.ndarray, shared: np.ndarray) -> np.ndarray:
        """Which candidates of ``rows`` that share ``shared`` tables with them are worth verifying (see
        :data:`LONE_SEGMENT_LIMIT`)."""
        if not self.unkeyed_zero:
            return np.ones(len(rows), dtype=bool)
        return (shared >= 2) | (self.keyed()[rows] < LONE_SEGMENT_LIMIT)

    def unfollowed(self, counts: np.ndarray, key_capacity: int) -> np.ndarray:
        """Flat (T * n) mask of the positions whose key holds ``key_capacity`` rows of ``counts`` (a
        :class:`HeldRows`' counts) in a row keyed in :data:`RARE_SEGMENT_LIMIT` segments or more that hold fewer."""
        full = counts.ravel() >= key_capacity
        rare = self.keyed_positions().ravel() & ~full
        rows = self.rows.ravel()
        rich = np.bincount(rows[rare], minlength=len(self)) >= RARE_SEGMENT_LIMIT
        return full & rich[rows]

    def run_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each run's start and end (exclusive), as flat (T * n) positions. Every table's first position starts a
        run, so a table's last run ends where the next table begins."""
        starts = np.flatnonzero(self.runs.ravel())
        return starts, np.append(starts, self.runs.size)[1:]

    def run_ends(self) -> np.ndarray:
        """Flat (T * n): the end (exclusive, a flat position) of the run each position belongs to."""
        starts, ends = self.run_bounds()
        return np.repeat(ends, ends - starts)

    def subset(self, rows: np.ndarray) -> TableKeys:
        """The keys of batch ``rows`` (ascending) alone, renumbered 0.. in that order: no new sort."""
        n = len(self)
        if len(rows) == n:
            return self
        renumbered = np.full(n, -1, dtype=np.intp)
        renumbered[rows] = np.arange(len(rows))
        mapped = renumbered[self.rows].ravel()
        # Flat positions, found once for three gathers: a 2-D boolean mask is several times slower on each.
        kept = np.flatnonzero(mapped >= 0)
        shape = (len(self.keys), len(rows))
        keys = self.keys.ravel()[kept].reshape(shape)
        values = self.values.ravel()[kept].reshape(shape)
        held = self.held
        if held is not None:
            held = HeldRows(held.counts.ravel()[kept].reshape(shape), held.keyed_writes)
        return TableKeys(self.plan, mapped[kept].reshape(shape), keys, values, _runs(keys), self.folds[rows], held)

    def pairs(
        self,
        fps: np.ndarray,
        earlier_rows: np.ndarray | None = None,
        *,
        key_capacity: int | None = None,
        max_candidates: int | None = None,
        measured: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All (earlier, later, distance) row pairs within the plan's radius that share a key in some table
        (the same guarantee as the stored tables), sorted by (earlier, later); only those whose earlier row is
        one of ``earlier_rows`` (a mask over the rows) when given. As the stored tables bound what a lookup
        finds: only the first ``key_capacity`` rows of a key's run are earlier sides through it (the first
        :data:`FULL_RUN_LEADS` of a run at least that long), and each later row keeps its ``max_candidates``
        earlier rows that share the most tables with it, and the first row of each of its keys' runs, of those
        :meth:`well_shared`. Only kept rows can match and the keys do not know which are kept: the first rows of
        the runs are those most likely kept, where a burst of near copies of one kept text would otherwise crowd
        it out of the most shared. With ``measured=False``, where the radius cuts nothing, each distance is
        :data:`UNMEASURED`, left to whoever needs it."""
        n = len(self)
        none = np.zeros(0, np.intp), np.zeros(0, np.intp), np.zeros(0, np.int64)
        rows = self.rows.ravel()
        positions = np.arange(len(rows))
        # Each position pairs with every later position of its (table, key) run.
        starts, ends = self.run_bounds()
        run_end = np.repeat(ends, ends - starts)
        rank = run_ranks(starts, len(rows))
        later_count = run_end - positions - 1
        later_count[~self.keyed_positions().ravel()] = 0
        if earlier_rows is not None:
            later_count[~earlier_rows[rows]] = 0
        if key_capacity is not None:
            # Only a run as long as key_capacity reaches that rank: such a run leads from its first rows.
            full = run_end - positions + rank >= key_capacity
            later_count[full & (rank >= min(FULL_RUN_LEADS, key_capacity))] = 0
        total = int(later_count.sum())
        if not total:
            return none
        # The pairs outnumber the positions many times over on hot keys: 32-bit indices halve their traffic.
        index = np.dtype(np.int32 if total + len(rows) < 1 << 31 else np.intp)
        first = np.repeat(positions.astype(index), later_count)
        step = np.arange(1, total + 1, dtype=index) - np.repeat(
            (np.cumsum(later_count) - later_count).astype(index), later_count
        )
        narrow_rows = rows.astype(index)
        a, b = narrow_rows[first], narrow_rows[first + step]
        # A pair found through several tables counts once: (later, earlier) packed in one word, one sort, which
        # also groups each later row's candidates for the ranking. The lowest bit is clear for a pair through the
        # first row of a key's run, so such a pair's first word tells. 32-bit words where they fit sort faster.
        word = np.dtype(np.uint32 if 2 * n * n <= 1 << 32 else np.uint64)
        packed = np.maximum(a, b).astype(word) * word.type(2 * n) + np.minimum(a, b).astype(word) * word.type(2)
        packed |= (rank[first] != 0).astype(word)
        packed.sort()
        pair_words = packed >> word.type(1)
        starts = run_starts(pair_words)
        shared = np.diff(np.append(starts, len(packed)))
        pairs = pair_words[starts]
        later, earlier = (pairs // word.type(n)).astype(np.intp), (pairs % word.type(n)).astype(np.intp)
        if max_candidates is not None:
            chosen = (packed[starts] & word.type(1)) == 0
            chosen[most_shared(later, earlier, shared, max_candidates)] = True
            chosen &= self.well_shared(later, shared)
            earlier, later = earlier[chosen], later[chosen]
        order = np.argsort(earlier * n + later)
        earlier, later = earlier[order], later[order]
        if not measured and self.plan.radius >= self.plan.bits:
            return earlier, later, np.full(len(earlier), UNMEASURED, dtype=np.int64)
        distances = np.bitwise_count(fps[earlier] ^ fps[later]).sum(axis=1).astype(np.int64)
        near = distances <= self.plan.radius
        return earlier[near], later[near], distances[near]


def most_shared(
    rows: np.ndarray, named: np.ndarray, shared: np.ndarray, limit: int, *, newest: bool = True
) -> np.ndarray:
    """Indices (ascending) of each row's ``limit`` candidates ``named`` that ``shared`` the most tables with it,
    the highest name (the newest entry, the latest batch row) first among equals, or with ``newest=False`` the
    lowest: a near-copy shares most of its segments, a text that only shares a template's few."""
    if not len(rows):
        return np.zeros(0, dtype=np.intp)
    # Most rows have no more than ``limit`` candidates and keep them all: only the others' are ranked.
    over = np.bincount(rows)[rows] > limit
    if not over.any():
        return np.arange(len(rows))
    if len(rows) > 1 and ((rows[1:] > rows[:-1]) | ((rows[1:] == rows[:-1]) & (named[1:] > named[:-1]))).all():
        return _most_shared_grouped(rows, shared, limit, over, newest)
    ranked = np.flatnonzero(over)
    rows, shared, named = rows[ranked], shared[ranked], named[ranked].astype(np.uint64)
    tie = named.max() - named if newest else named
    word = packed([rows, shared.max() - shared, tie])
    order = np.lexsort((~named if newest else named, -shared, rows)) if word is None else np.argsort(word[0])
    grouped = rows[order]
    starts = run_starts(grouped)
    over[ranked[order[run_ranks(starts, len(order)) < limit]]] = False
    return np.flatnonzero(~over)


def _most_shared_grouped(
    rows: np.ndarray, shared: np.ndarray, limit: int, over: np.ndarray, newest: bool
) -> np.ndarray:
    """:func:`most_shared` of candidates sorted by (row, name) (as a lookup's distinct pairs come), without a
    sort: a histogram of each row's shared counts gives the count its ``limit``-th candidate shares; those sharing
    more stay, and of those sharing exactly as many, the last ones (the highest names; ``newest=False``: the
    first ones) fill the row's quota."""
    # Only the rows over the limit are ranked: renumbered 0.. (they come grouped), one histogram row each.
    ranked = np.flatnonzero(over)
    ranked_shared = shared[ranked]
    starts = run_starts(rows[ranked])
    sizes = np.diff(np.append(starts, len(ranked)))
    group = np.repeat(np.arange(len(starts)), sizes)
    levels = int(ranked_shared.max()) + 1
    histogram = np.bincount(group * levels + ranked_shared, minlength=len(starts) * levels).reshape(-1, levels)
    # at_least[r, s]: the row's candidates sharing s tables or more.
    at_least = np.cumsum(histogram[:, ::-1], axis=1)[:, ::-1]
    threshold = (at_least >= limit).sum(axis=1) - 1
    above = np.take_along_axis(at_least, np.minimum(threshold + 1, levels - 1)[:, None], axis=1).ravel()
    above[threshold + 1 >= levels] = 0
    group_threshold = threshold[group]
    keep = ~over
    keep[ranked[ranked_shared > group_threshold]] = True
    ties = np.flatnonzero(ranked_shared == group_threshold)
    if len(ties):
        tie_groups = group[ties]
        tie_starts = run_starts(tie_groups)
        tie_sizes = np.diff(np.append(tie_starts, len(ties)))
        place = np.arange(len(ties)) - np.repeat(tie_starts, tie_sizes)
        if newest:
            place = np.repeat(tie_sizes, tie_sizes) - place - 1
        keep[ranked[ties[place < limit - above[tie_groups]]]] = True
    return np.flatnonzero(keep)


def packed(columns: list[np.ndarray]) -> tuple[np.ndarray, list[int]] | None:
    """Columns of non-negative integers packed into one word per row (uint32 where they fit, which sorts faster,
    else uint64), the first column in the highest bits, and each column's width: sorting the words orders the
    rows as ``np.lexsort`` of the reversed columns would, in one vectorised sort of one key (an order of magnitude
    faster). None when the columns need more than 64 bits."""
    widths = [max(1, int(column.max()).bit_length()) for column in columns]
    if sum(widths) > 64:
        return None
    unsigned = np.dtype(np.uint32 if sum(widths) <= 32 else np.uint64)
    word = np.zeros(len(columns[0]), dtype=unsigned)
    for column, width in zip(columns, widths, strict=True):
        word <<= unsigned.type(width)
        word |= column.astype(unsigned)
    return word, widths


def run_ranks(starts: np.ndarray, length: int) -> np.ndarray:
    """Each position's place (0, 1, ...) within its run, the runs of ``length`` positions starting at ``starts``
    (ascending, the first 0)."""
    return np.arange(length) - np.repeat(starts, np.diff(np.append(starts, length)))


def first_copies(fps: np.ndarray, *alike: np.ndarray) -> np.ndarray:
    """Each row's first row with the same fingerprint and the same row in every array of ``alike`` (itself when
    it is the first). Rows are grouped by a 64-bit hash of the fingerprint, and those that share it by a hash of
    their rows of ``alike`` as well (so that texts of one fingerprint and different sketches fall apart), then
    checked whole: a row that only shares the hash counts as a first (more pairs, never a wrong one)."""
    rows = np.arange(len(fps))
    if not len(fps):
        return rows
    digest = np.bitwise_xor.reduce(fps, axis=1)
    # A row whose fingerprint no other row has is its own first: only the others hash the rest of their rows.
    _, inverse, counts = np.unique(digest, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts[inverse.reshape(-1)] > 1)
    if not len(shared):
        return rows
    digest = digest[shared]
    for column in alike:
        words = column.reshape(len(fps), -1)[shared].astype(np.uint64)
        digest ^= (words * _row_weights(words.shape[1])).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(digest, return_index=True, return_inverse=True)
    copies = shared[first[inverse.reshape(-1)]]
    same = (fps[shared] == fps[copies]).all(axis=1)
    for column in alike:
        same &= (column[shared] == column[copies]).reshape(len(shared), -1).all(axis=1)
    rows[shared[same]] = copies[same]
    return rows


def with_copies(
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray], copies: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pairs`` (earlier, later, distance, sorted by (earlier, later), between first copies as earlier sides,
    see :func:`first_copies`) and, for each later copy, its first copy and the earlier sides of its first copy:
    a copy is compared with what its first copy was, and with it, whatever the bounds that chose those, so that
    it gets the same verdict (the pairs the bounds drop are the same for both)."""
    earlier, later, distances = pairs
    copied = np.flatnonzero(copies != np.arange(len(copies)))
    if not len(copied):
        return pairs
    first = copies[copied]
    order = np.argsort(first, kind="stable")
    copied, first = copied[order], first[order]
    # Only the pairs whose later row has copies of its own are searched for: a mask finds them at a gather each.
    has_copies = np.zeros(len(copies), dtype=bool)
    has_copies[first] = True
    into = np.flatnonzero(has_copies[later])
    at, hit = expand_ranges(
        np.searchsorted(first, later[into], side="left"), np.searchsorted(first, later[into], side="right")
    )
    pair = into[hit]
    joined_earlier = np.concatenate([earlier, earlier[pair], first]).astype(np.intp)
    joined_later = np.concatenate([later, copied[at], copied]).astype(np.intp)
    joined_distances = np.concatenate([distances, distances[pair], np.zeros(len(copied), dtype=distances.dtype)])
    _, unique = np.unique(joined_earlier * len(copies) + joined_later, return_index=True)
    return joined_earlier[unique], joined_later[unique], joined_distances[unique]


@functools.cache
def _row_weights(width: int) -> np.ndarray:
    """Odd 64-bit weights that hash a row of ``width`` values as their weighted sum (wrapping)."""
    return np.random.default_rng(width).integers(0, 2**63, size=width, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def table_keys(plan: IndexPlan, fps: np.ndarray) -> TableKeys:
    """Every table's keys and values of ``fps`` ((n, plan.bits // 64) uint64), sorted by key per table."""
    key_matrix, values, folds = _key_matrix(plan, fps)
    n = len(fps)
    row_bits = max(1, (n - 1).bit_length())
    if max(plan.key_bits) + row_bits <= 64:
        # (key, row) packed in one word: a row-wise plain sort (vectorised in numpy, several times faster
        # than an argsort) orders every table by key and carries the rows along.
        packed = np.sort((key_matrix << np.uint64(row_bits)) | np.arange(n, dtype=np.uint64), axis=1)
        order = (packed & np.uint64((1 << row_bits) - 1)).astype(np.intp)
        sorted_keys = packed >> np.uint64(row_bits)
    else:
        order = np.argsort(key_matrix, axis=1)
        sorted_keys = np.take_along_axis(key_matrix, order, axis=1)
    sorted_values = folds[order] if values is None else np.take_along_axis(values, order, axis=1)
    return TableKeys(plan, order, sorted_keys, sorted_values, _runs(sorted_keys), folds)


def table_rows(plan: IndexPlan, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unsorted (tables, n) keys and values of ``fps``, and their folds (what removal deletes)."""
    keys, values, folds = _key_matrix(plan, fps)
    return keys, np.broadcast_to(folds, keys.shape) if values is None else values, folds


def _key_matrix(plan: IndexPlan, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Keys as right-aligned uint64 (tables, n) and each table's values likewise (None: the folds are the
    values, as on fingerprints wider than 64 bits); plus the folds."""
    folds = fold(fps)
    size = plan.bits // len(plan.tables)
    if plan.kind == "segments" and 64 % size == 0:
        # Segments tile the words in order: one shift-and-mask over every word gives every table's keys.
        shifts = np.arange(64 // size - 1, -1, -1, dtype=np.uint64) * np.uint64(size)
        mask = np.uint64(2**size - 1)
        keys = ((fps[:, :, None] >> shifts) & mask).reshape(len(fps), len(plan.tables)).T
    else:
        shared = unpack_bits(fps) if plan.kind == "sampled" else None
        keys = np.array([gather_bits(fps, key, shared) for key in plan.tables], dtype=np.uint64)
        keys = keys.reshape(len(plan.tables), len(fps))
    if plan.bits > 64:
        return keys, None, folds
    values = np.array([gather_bits(fps, plan.value_bits(t)) for t in range(len(keys))], dtype=np.uint64)
    return keys, values.reshape(len(keys), len(fps)), folds


def _runs(sorted_keys: np.ndarray) -> np.ndarray:
    runs = np.ones(sorted_keys.shape, dtype=bool)
    runs[:, 1:] = sorted_keys[:, 1:] != sorted_keys[:, :-1]
    return runs
