"""Table plans: which fingerprint bits key which table of the segment index.

An *exact* plan follows Manku, Jain and Das Sarma (WWW 2007): cut the fingerprint into ``radius + k`` blocks;
two fingerprints within ``radius`` differ in at most ``radius`` blocks, so at least ``k`` blocks agree and one of
the ``C(radius + k, k)`` tables keyed by ``k`` blocks holds the match under the query's own key. A *sampled*
plan (for wide fingerprints and large radii, where exact plans need too many tables or keys too short to
discriminate) keys each table by sampled bit positions; its recall at each distance is computed exactly by
inclusion-exclusion over the tables.

Keys are cut to at most ``log2(expected_entries / min_bucket)`` bits: a bucket then holds several entries,
so its values pack densely into one LMDB dupfixed page instead of paying a node per entry.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal

import numpy as np

__all__ = ["IndexPlan", "PlanError", "fold", "gather_bits", "make_plan", "make_segment_plan", "unpack_bits"]

# What one more table costs per document, in candidate checks (measured with py-lmdb on 1M entries): a
# probe (a B-tree lookup through getmulti, ~1 us) is worth ~32 candidates, and every stored document also
# pays a random put plus its share of copied-on-write pages (~2 us), ~64 more. It weighs tables against
# candidates when choosing a plan.
TABLE_COST_IN_CANDIDATES = 96.0
# Inclusion-exclusion over 2**tables subsets stays cheap up to this many sampled tables.
MAX_SAMPLED_TABLES = 16
MAX_KEY_BITS = 64


class PlanError(ValueError):
    """The plan cannot be built, or a stored plan does not match the requested one."""


@dataclass(frozen=True)
class IndexPlan:
    """Which fingerprint bit positions (0 = leftmost) key each table; see the module docstring."""

    kind: Literal["exact", "sampled", "segments"]
    bits: int
    radius: int
    tables: tuple[tuple[int, ...], ...]
    blocks: int = 0
    keyed_blocks: int = 0
    seed: int = 0
    expected_entries: int = 0

    def __post_init__(self) -> None:
        for key in self.tables:
            if not key or len(key) > MAX_KEY_BITS or len(set(key)) != len(key):
                raise PlanError(f"table keys need 1..{MAX_KEY_BITS} distinct bit positions, got {len(key)}")
            if min(key) < 0 or max(key) >= self.bits:
                raise PlanError(f"key bit positions must lie in [0, {self.bits})")

    @property
    def key_bits(self) -> tuple[int, ...]:
        return tuple(len(key) for key in self.tables)

    def value_bits(self, table: int) -> tuple[int, ...]:
        """Positions of the 64-bit fold stored as the table's value: on 64-bit fingerprints the key already
        holds its own bits, so only the rest is stored (smaller values, same information)."""
        if self.bits == 64:
            keyed = set(self.tables[table])
            return tuple(i for i in range(64) if i not in keyed)
        return tuple(range(64))

    def candidates_per_query(self, entries: int) -> float:
        """Expected stored entries read per query, for uniformly random fingerprints."""
        return float(sum(entries / 2.0**p for p in self.key_bits))

    def recall(self, distance: int) -> float:
        """Probability that a stored fingerprint at ``distance`` (uniformly random differing bits) is found."""
        if distance <= 0:
            return 1.0
        if self.kind == "exact":
            return 1.0 if distance <= self.radius else _sampled_recall(self.bits, self.tables, distance)
        if self.kind == "segments":
            return _segment_recall(self.bits, self.blocks, distance)
        return _sampled_recall(self.bits, self.tables, distance)

    def describe(self) -> dict[str, Any]:
        # A plan never changes, and its recall table costs up to a second on wide fingerprints: the service
        # reads it with every stats refresh.
        return dict(_description(self))

    def _describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bits": self.bits,
            "radius": self.radius,
            "tables": len(self.tables),
            "key_bits": list(self.key_bits),
            "blocks": self.blocks,
            "keyed_blocks": self.keyed_blocks,
            "expected_entries": self.expected_entries,
            "candidates_per_query_at_expected": round(self.candidates_per_query(self.expected_entries), 3),
            "recall": {d: round(self.recall(d), 6) for d in range(self.radius + 1)},
        }

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "bits": self.bits,
                "radius": self.radius,
                "tables": [list(key) for key in self.tables],
                "blocks": self.blocks,
                "keyed_blocks": self.keyed_blocks,
                "seed": self.seed,
                "expected_entries": self.expected_entries,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> IndexPlan:
        data = json.loads(text)
        data["tables"] = tuple(tuple(key) for key in data["tables"])
        return cls(**data)

    def same_lookup(self, other: IndexPlan) -> bool:
        """Whether ``other`` reads and writes the same tables (planning size aside)."""
        return (self.kind, self.bits, self.radius, self.tables) == (other.kind, other.bits, other.radius, other.tables)


def make_plan(
    bits: int,
    radius: int,
    expected_entries: int,
    *,
    max_tables: int = 16,
    min_bucket: float = 8.0,
    max_candidates: float = 2048.0,
    seed: int = 0,
) -> IndexPlan:
    """The cheapest exact plan for (bits, radius, expected size), else a sampled plan.

    Cost per document = candidates at the expected size + TABLE_COST_IN_CANDIDATES x tables. An exact plan is
    taken when its candidates stay under ``max_candidates``; otherwise the sampled plan with the most
    tables allowed (capped at MAX_SAMPLED_TABLES) reaches the best recall at ``radius``; see ``recall``.
    """
    if bits < 64 or bits % 64:
        raise PlanError(f"bits must be a positive multiple of 64, got {bits}")
    if radius < 0 or radius >= bits:
        raise PlanError(f"radius must lie in [0, {bits}), got {radius}")
    if expected_entries < 1 or max_tables < 1:
        raise PlanError("expected_entries and max_tables must be positive")
    key_cap = int(min(MAX_KEY_BITS, max(8, math.floor(math.log2(max(expected_entries / min_bucket, 2.0))))))
    best: tuple[float, IndexPlan] | None = None
    for keyed in range(1, max_tables + 1):
        blocks = radius + keyed
        # C(radius + k, k) grows with k, so the first plan over the cap ends the search.
        if blocks > bits or math.comb(blocks, keyed) > max_tables:
            break
        plan = _exact_plan(bits, radius, blocks, keyed, key_cap, expected_entries)
        candidates = plan.candidates_per_query(expected_entries)
        if candidates > max_candidates:
            continue
        cost = candidates + TABLE_COST_IN_CANDIDATES * len(plan.tables)
        if best is None or cost < best[0]:
            best = (cost, plan)
    if best is not None:
        return best[1]
    tables = min(max_tables, MAX_SAMPLED_TABLES)
    # Shorter keys raise recall and candidates alike: take the shortest key that keeps candidates in budget.
    key_bits = min(key_cap, max(1, math.ceil(math.log2(tables * expected_entries / max_candidates))))
    return _sampled_plan(bits, radius, tables, key_bits, expected_entries, seed)


def make_segment_plan(bits: int, segments: int, radius: int | None = None, *, expected_entries: int = 0) -> IndexPlan:
    """One table per segment of a segmented fingerprint, keyed by the whole segment.

    A small edit changes a few segments of a segmented SimHash and leaves the others equal, so the copy is
    found through any untouched one. An all-zero segment is unkeyed (too few features) and never stored or
    probed. ``radius`` caps the Hamming distance of what is returned; None returns every candidate (the
    caller verifies them).
    """
    size = bits // segments
    if bits % 64 or segments < 2 or bits % segments or size > MAX_KEY_BITS:
        raise PlanError(f"{segments} segments do not cut {bits} bits into keys of at most {MAX_KEY_BITS} bits")
    tables = tuple(tuple(range(g * size, (g + 1) * size)) for g in range(segments))
    return IndexPlan("segments", bits, bits if radius is None else radius, tables, segments, 1, 0, expected_entries)


def _segment_recall(bits: int, segments: int, distance: int) -> float:
    """P(some segment avoids all of `distance` uniformly random differing bits), by inclusion-exclusion.

    Segmented fingerprints do better than this: an edit's differing bits crowd into the segments its
    features fall in, which is why the quality benchmark, not this bound, measures their recall."""
    size = bits // segments
    total = math.comb(bits, distance)
    hit = sum(
        (-1) ** (j + 1) * math.comb(segments, j) * math.comb(bits - j * size, distance) for j in range(1, segments + 1)
    )
    return min(1.0, hit / total)


def _exact_plan(bits: int, radius: int, blocks: int, keyed: int, key_cap: int, expected: int) -> IndexPlan:
    edges = np.linspace(0, bits, blocks + 1).round().astype(int)
    ranges = [tuple(range(edges[i], edges[i + 1])) for i in range(blocks)]
    tables = []
    for chosen in combinations(range(blocks), keyed):
        sizes = [len(ranges[block]) for block in chosen]
        # Cut long keys to a prefix of each chosen block: any subset of the agreeing blocks still agrees,
        # and contiguous runs keep key extraction to a few shifts.
        if sum(sizes) > key_cap:
            sizes = [key_cap // keyed + (i < key_cap % keyed) for i in range(keyed)]
        tables.append(tuple(p for block, size in zip(chosen, sizes, strict=True) for p in ranges[block][:size]))
    return IndexPlan("exact", bits, radius, tuple(tables), blocks, keyed, 0, expected)


def _sampled_plan(bits: int, radius: int, tables: int, key_bits: int, expected: int, seed: int) -> IndexPlan:
    rng = np.random.default_rng(seed)
    pool: list[int] = []
    keys = []
    for _ in range(tables):
        # Disjoint keys while bits last: disjoint tables fail independently-ish, which raises recall.
        if len(pool) < key_bits:
            pool = [int(p) for p in rng.permutation(bits)]
        keys.append(tuple(sorted(pool[:key_bits])))
        pool = pool[key_bits:]
    return IndexPlan("sampled", bits, radius, tuple(keys), 0, 0, seed, expected)


def _sampled_recall(bits: int, tables: tuple[tuple[int, ...], ...], distance: int) -> float:
    """P(some table's key avoids every one of `distance` random differing bits), by inclusion-exclusion."""
    count = len(tables)
    if count > MAX_SAMPLED_TABLES:
        raise PlanError(f"recall is computed for at most {MAX_SAMPLED_TABLES} tables, got {count}")
    masks = np.zeros((count, bits), dtype=np.uint8)
    for t, key in enumerate(tables):
        masks[t, list(key)] = 1
    packed = np.packbits(masks, axis=1).view(np.uint8)
    # union[s] = OR of the key masks of the tables in subset s (bit t of s = table t), doubled per table.
    union = np.zeros((1, packed.shape[1]), dtype=np.uint8)
    members = np.zeros(1, dtype=np.int64)
    for t in range(count):
        union = np.concatenate([union, union | packed[t]])
        members = np.concatenate([members, members + 1])
    sizes = np.bitwise_count(union).sum(axis=1)[1:]
    signs = np.where(members[1:] % 2 == 1, 1.0, -1.0)
    free = np.array([math.comb(bits - int(s), distance) for s in range(bits + 1)], dtype=float)
    total = math.comb(bits, distance)
    return float(np.clip((signs * free[sizes]).sum() / total, 0.0, 1.0))


@functools.cache
def _description(plan: IndexPlan) -> dict[str, Any]:
    return plan._describe()


@functools.cache
def runs(positions: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """Maximal runs of consecutive positions within one 64-bit word: (word, first bit in word, length).
    Cached: a plan asks for the same few key layouts on every batch."""
    out: list[tuple[int, int, int]] = []
    for p in positions:
        if out and out[-1][0] == p // 64 and out[-1][1] + out[-1][2] == p % 64:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((p // 64, p % 64, 1))
    return tuple(out)


def gather_bits(fps: np.ndarray, positions: tuple[int, ...], packed_bits: np.ndarray | None = None) -> np.ndarray:
    """The bits at ``positions`` of each fingerprint, concatenated into a right-aligned uint64.

    Few long runs (exact plans) cost a shift and mask each; scattered positions (sampled plans) go through
    one fancy-indexed gather of the unpacked bits instead (pass ``packed_bits`` = unpack_bits(fps) to share it).
    """
    parts = runs(positions)
    out = np.zeros(len(fps), dtype=np.uint64)
    if len(parts) <= 8:
        for word, first, length in parts:
            chunk = (fps[:, word] >> np.uint64(64 - first - length)) & np.uint64((1 << length) - 1)
            out = (out << np.uint64(length)) | chunk if length < 64 else chunk
        return out
    bits = unpack_bits(fps) if packed_bits is None else packed_bits
    packed = np.packbits(bits[:, list(positions)], axis=1)
    padded = np.zeros((len(fps), 8), dtype=np.uint8)
    padded[:, : packed.shape[1]] = packed
    return padded.view(">u8").ravel().astype(np.uint64) >> np.uint64(8 * 8 - len(positions)) if positions else out


def scatter_bits(values: np.ndarray, positions: tuple[int, ...]) -> np.ndarray:
    """The inverse of ``gather_bits`` on one 64-bit word: place right-aligned ``values`` at ``positions``."""
    parts = runs(positions)
    out = np.zeros(len(values), dtype=np.uint64)
    if len(parts) <= 8:
        shift = len(positions)
        for _, first, length in parts:
            shift -= length
            chunk = (values >> np.uint64(shift)) & np.uint64((1 << length) - 1) if length < 64 else values
            out |= chunk << np.uint64(64 - first - length)
        return out
    bits = np.zeros((len(values), 64), dtype=np.uint8)
    bits[:, list(positions)] = unpack_bits(values.reshape(-1, 1))[:, 64 - len(positions) :]
    return np.packbits(bits, axis=1).view(">u8").ravel().astype(np.uint64)


def unpack_bits(fps: np.ndarray) -> np.ndarray:
    """(n, words) uint64 -> (n, words * 64) uint8 0/1, bit i of the fingerprint in column i."""
    fps = np.ascontiguousarray(fps, dtype=np.uint64)
    return np.unpackbits(fps.astype(">u8").view(np.uint8).reshape(len(fps), fps.shape[1] * 8), axis=1)


def fold(fps: np.ndarray) -> np.ndarray:
    """XOR of the words: popcount(fold(a) ^ fold(b)) <= distance(a, b), a cheap exact lower bound."""
    return np.bitwise_xor.reduce(np.ascontiguousarray(fps, dtype=np.uint64), axis=1)
