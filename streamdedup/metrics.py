"""Prometheus metrics of the service: definitions on a dedicated registry, updated once per batch.

The service owns one :class:`ServiceMetrics` and calls its ``record_*`` methods with per-batch aggregates
(counts by topic or reason, one duration per stage), never once per message. Every name starts with
``streamdedup_`` (:data:`streamdedup.names.METRIC_PREFIX`), uses base units (seconds, bytes) and counters end
in ``_total``. Labels stay low-cardinality: topics and partitions come from the configuration and the
assignment, reasons and results from fixed sets, so the series count is bounded.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypedDict

import aiokafka
import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from . import __version__
from .names import DEAD_LETTER_REASONS, METRIC_PREFIX

__all__ = [
    "DROP_REASONS",
    "DURATION_BUCKETS",
    "TRANSACTION_RESULTS",
    "WORKER_KINDS",
    "PartitionLag",
    "ServiceMetrics",
    "Stage",
    "VerdictLike",
    "distance_bounds",
    "index_capacity_bytes",
]

NAMESPACE = METRIC_PREFIX.rstrip("_")

DROP_REASONS = ("exact", "near", "redelivered")
TRANSACTION_RESULTS = ("committed", "aborted")
# The service's worker processes: the signing workers and the decision process.
WORKER_KINDS = ("signer", "decision")

# From half a millisecond (one small LMDB lookup) to half a minute (a produce stuck behind a broker outage).
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Stage(StrEnum):
    """A timed step of one batch; each has its own histogram ``streamdedup_<stage>_duration_seconds``."""

    BATCH = "batch"
    FINGERPRINT = "fingerprint"
    INDEX_LOOKUP = "index_lookup"
    PRODUCE = "produce"
    COMMIT = "commit"


_STAGE_HELP = {
    Stage.BATCH: "Wall time to process one batch end to end: decode, decide, index write, produce, commit.",
    Stage.FINGERPRINT: "Time to fingerprint and sketch one batch (or to wait for the signing workers to).",
    Stage.INDEX_LOOKUP: "Time to look up (and insert) one batch in the LMDB index.",
    Stage.PRODUCE: "Time to send one batch's records to Kafka (until every send is acknowledged).",
    Stage.COMMIT: "Time to commit one Kafka transaction (records plus input offsets).",
}


class VerdictLike(Protocol):
    """What :meth:`ServiceMetrics.record_verdicts` reads of a :class:`streamdedup.verdicts.Verdict`."""

    @property
    def novel(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def distance(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """How far the service is behind on one partition.

    records: high watermark minus the next offset to process. seconds: how old the oldest unprocessed record
    is (now minus the timestamp of the last processed record while records > 0; 0 when caught up).
    """

    records: int
    seconds: float


def distance_bounds(radius: int | None, width: int) -> list[int]:
    """Upper bounds of the match-distance histogram: every distance up to a small radius; without a radius
    (segmented fingerprints, where near copies lie tens of bits apart) exact to 3, then 4, 6, 8, 12, ... to
    the width, so the heatmap keeps its shape with about twenty series."""
    if radius is not None:
        return list(range(radius + 1))
    steps = {b for p in (2**e for e in range(2, width.bit_length())) for b in (p, p * 3 // 2) if b <= width}
    return [0, 1, 2, 3, *sorted(steps | {width})]


class _DistanceHistogram(Collector):
    """Histogram of small integer distances, updated a whole batch at a time with numpy.

    prometheus_client's Histogram only observes one value per call; a batch of duplicates is counted here
    with one ``bincount`` instead of a Python call per message.
    """

    def __init__(self, name: str, documentation: str, bounds: Sequence[int]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = np.asarray(bounds, dtype=np.int64)
        # One slot per upper bound and a last one for anything farther.
        self._counts = np.zeros(len(self._bounds) + 1, dtype=np.int64)
        self._sum = 0
        self._lock = threading.Lock()

    def observe_many(self, distances: npt.ArrayLike) -> None:
        values = np.asarray(distances, dtype=np.int64).ravel()
        if values.size == 0:
            return
        if values.min() < 0:
            raise ValueError(f"a Hamming distance cannot be negative, got {int(values.min())}")
        slots = np.searchsorted(self._bounds, values, side="left")
        batch_counts = np.bincount(slots, minlength=self._counts.size)
        with self._lock:
            self._counts += batch_counts
            self._sum += int(values.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total = self._sum
        buckets = [(f"{bound:.1f}", float(count)) for bound, count in zip(self._bounds, cumulative[:-1], strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=float(total))

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._documentation)


class _Common(TypedDict):
    """What every metric of a service shares: its name's prefix and its registry."""

    namespace: str
    registry: CollectorRegistry


class ServiceMetrics:
    """Every metric of the service, registered on its own :class:`CollectorRegistry` (no global state).

    radius: the index's Hamming radius; the match-distance histogram has one bucket per distance up to it.
    dead_letter_reasons, input_topics, output_topics: label values created at zero up front, so ``rate()`` and
    the dashboard see a series before the first event; a dead-letter reason outside the set is refused.
    """

    def __init__(
        self,
        *,
        radius: int | None = 3,
        width: int = 64,
        dead_letter_reasons: Iterable[str] = DEAD_LETTER_REASONS,
        input_topics: Iterable[str] = (),
        output_topics: Iterable[str] = (),
        registry: CollectorRegistry | None = None,
        process_metrics: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        common = _Common(namespace=NAMESPACE, registry=self.registry)

        self.messages_consumed = Counter(
            "messages_consumed", "Records read from the input topics.", ["topic"], **common
        )
        self.messages_published = Counter(
            "messages_published",
            "Records published (novel documents, duplicates, dead letters) by destination topic.",
            ["topic"],
            **common,
        )
        self.messages_dropped = Counter(
            "messages_dropped", "Documents not republished because they duplicate an earlier one.", ["reason"], **common
        )
        self.messages_dead_lettered = Counter(
            "messages_dead_lettered",
            "Records sent to the dead-letter topic instead of being processed.",
            ["reason"],
            **common,
        )
        self.event_times_clamped = Counter(
            "event_times_clamped",
            "Event times further ahead of the wall clock than input.max_future_seconds, clamped to that bound.",
            **common,
        )
        self.stage_duration = {
            stage: Histogram(f"{stage.value}_duration_seconds", _STAGE_HELP[stage], buckets=DURATION_BUCKETS, **common)
            for stage in Stage
        }
        self.match_distance = _DistanceHistogram(
            f"{METRIC_PREFIX}match_distance_bits",
            "Hamming distance from each duplicate to the earlier document it matches.",
            distance_bounds(radius, width),
        )
        self.registry.register(self.match_distance)
        self.index_entries = Gauge("index_entries", "Fingerprints stored in the index.", **common)
        self.index_used_bytes = Gauge(
            "index_used_bytes", "Bytes of the LMDB map in use (pages times page size).", **common
        )
        self.index_map_size_bytes = Gauge("index_map_size_bytes", "Current size of the LMDB memory map.", **common)
        self.index_capacity_bytes = Gauge(
            "index_capacity_bytes",
            "Largest size the LMDB map can grow to: its configured maximum, or what its filesystem can hold.",
            **common,
        )
        self.index_mirror_bytes = Gauge(
            "index_mirror_bytes",
            "Memory the decision process holds in its copies of the index's merged tables and of the times and "
            "sketches it read lately (capped by index.mirror_bytes).",
            **common,
        )
        self.index_mirrored_tables = Gauge(
            "index_mirrored_tables",
            "Index tables whose lookups that copy answers; the others read LMDB's B-trees (slower).",
            **common,
        )
        self.index_expired_entries = Counter(
            "index_expired_entries", "Index entries removed for age or capacity.", **common
        )
        self.index_storage_failing = Gauge(
            "index_storage_failing",
            "1 while the index refuses to store batches (its map at index.max_map_size_bytes, its disk full): "
            "consumption is paused and the batch retried.",
            **common,
        )
        self.index_storage_errors = Counter(
            "index_storage_errors", "Attempts to store a batch that the index refused (full map or disk).", **common
        )
        self.consumer_lag_records = Gauge(
            "consumer_lag_records",
            "Records between the next offset to process and the high watermark.",
            ["topic", "partition"],
            **common,
        )
        self.consumer_lag_seconds = Gauge(
            "consumer_lag_seconds",
            "Age of the oldest unprocessed record (0 when caught up).",
            ["topic", "partition"],
            **common,
        )
        self.assigned_partitions = Gauge("assigned_partitions", "Input partitions assigned to this consumer.", **common)
        self.rebalances = Counter("rebalances", "Consumer group rebalances seen (partition assignments).", **common)
        self.transactions = Counter("transactions", "Kafka transactions by result.", ["result"], **common)
        self.worker_deaths = Counter(
            "worker_deaths",
            "Worker processes that died (killed, out of memory, or while starting); each is replaced.",
            ["worker"],
            **common,
        )
        self.sequencer_partitions = Gauge(
            "sequencer_partitions",
            "Input partitions this instance sequences (kafka.sequence_topic set; 0 otherwise).",
            **common,
        )
        self.decider = Gauge(
            "decider",
            "1 while this instance decides (owns the sequence topic, or the input without one), 0 while it stands by.",
            **common,
        )
        self.standby = Gauge(
            "standby", "1 while this instance follows the decider as its warm standby, 0 otherwise.", **common
        )
        self.standby_lag_records = Gauge(
            "standby_lag_records",
            "Sequence records the decider has decided and this standby's index has not (0 while deciding).",
            **common,
        )
        self.sequenced_records = Counter(
            "sequenced_records", "Input records packed into the sequence topic, by input topic.", ["topic"], **common
        )
        self.sequence_records_written = Counter(
            "sequence_records_written", "Records written to the sequence topic (each packs a batch).", **common
        )
        self.last_commit_timestamp = Gauge(
            "last_commit_timestamp_seconds", "Unix time of the last committed Kafka transaction.", **common
        )
        self.build = Info("build", "Version of streamdedup and of the Kafka client.", **common)
        self.build.info({"version": __version__, "aiokafka_version": aiokafka.__version__})
        if process_metrics:
            ProcessCollector(registry=self.registry)

        for reason in DROP_REASONS:
            self.messages_dropped.labels(reason=reason)
        self._dead_letter_reasons = tuple(dead_letter_reasons)
        for reason in self._dead_letter_reasons:
            self.messages_dead_lettered.labels(reason=reason)
        for result in TRANSACTION_RESULTS:
            self.transactions.labels(result=result)
        for kind in WORKER_KINDS:
            self.worker_deaths.labels(worker=kind)
        for topic in input_topics:
            self.messages_consumed.labels(topic=topic)
            self.sequenced_records.labels(topic=topic)
        for topic in output_topics:
            self.messages_published.labels(topic=topic)
        self._lag_partitions: set[tuple[str, int]] = set()

    def record_consumed(self, per_topic: Mapping[str, int]) -> None:
        """Count a batch of consumed records, ``{topic: count}``."""
        _add(self.messages_consumed, "topic", per_topic)

    def record_published(self, per_topic: Mapping[str, int]) -> None:
        """Count a batch of published records, ``{topic: count}``."""
        _add(self.messages_published, "topic", per_topic)

    def record_dead_lettered(self, per_reason: Mapping[str, int]) -> None:
        """Count a batch of dead letters, ``{reason: count}``."""
        _check_known("dead-letter reason", per_reason, self._dead_letter_reasons)
        _add(self.messages_dead_lettered, "reason", per_reason)

    def record_clamped_times(self, count: int) -> None:
        """Count a batch's event times clamped to ``input.max_future_seconds`` ahead of the wall clock."""
        if count:
            self.event_times_clamped.inc(count)

    def record_dropped(self, per_reason: Mapping[str, int], distances: npt.ArrayLike = ()) -> None:
        """Count a batch of duplicates, ``{reason: count}``, and the distances to their matches."""
        _check_known("drop reason", per_reason, DROP_REASONS)
        _add(self.messages_dropped, "reason", per_reason)
        self.match_distance.observe_many(distances)

    def record_verdicts(self, verdicts: Sequence[VerdictLike]) -> None:
        """Count the duplicates of one batch of verdicts by reason and observe their match distances."""
        duplicates = [verdict for verdict in verdicts if not verdict.novel]
        per_reason: dict[str, int] = {}
        for verdict in duplicates:
            per_reason[verdict.reason] = per_reason.get(verdict.reason, 0) + 1
        distances = [verdict.distance for verdict in duplicates if verdict.distance is not None]
        self.record_dropped(per_reason, distances)

    def timer(self, stage: Stage) -> AbstractContextManager[object]:
        """Context manager timing one ``stage`` of a batch into its histogram."""
        return self.stage_duration[stage].time()

    def observe(self, stage: Stage, seconds: float) -> None:
        """Record a duration measured elsewhere (e.g. reported by the decision core)."""
        self.stage_duration[stage].observe(seconds)

    def record_transaction(self, result: str, seconds: float | None = None) -> None:
        """Count one Kafka transaction (``committed`` or ``aborted``) and how long its commit or abort took."""
        if result not in TRANSACTION_RESULTS:
            raise ValueError(f"unknown transaction result {result!r}; expected one of {TRANSACTION_RESULTS}")
        self.transactions.labels(result=result).inc()
        if seconds is not None:
            self.stage_duration[Stage.COMMIT].observe(seconds)
        if result == "committed":
            self.last_commit_timestamp.set(time.time())

    def record_index(
        self,
        *,
        entries: int,
        used_bytes: int,
        map_size_bytes: int,
        capacity_bytes: int,
        mirror_bytes: int = 0,
        mirrored_tables: int = 0,
        expired: int = 0,
    ) -> None:
        """Set the index size gauges and count entries expired since the last call.

        From ``SegmentIndex.usage()``: entries, used_bytes = ``disk_bytes``, map_size_bytes = ``map_size``,
        mirror_bytes and mirrored_tables; capacity_bytes from :func:`index_capacity_bytes`.
        """
        self.index_entries.set(entries)
        self.index_used_bytes.set(used_bytes)
        self.index_map_size_bytes.set(map_size_bytes)
        self.index_capacity_bytes.set(capacity_bytes)
        self.index_mirror_bytes.set(mirror_bytes)
        self.index_mirrored_tables.set(mirrored_tables)
        if expired:
            self.index_expired_entries.inc(expired)

    def record_storage(self, *, failed: bool) -> None:
        """A batch did (``failed``) or did not fail to store in the index; ``index_storage_failing`` follows."""
        self.index_storage_failing.set(1 if failed else 0)
        if failed:
            self.index_storage_errors.inc()

    def record_assignment(self, partitions: Collection[tuple[str, int]]) -> None:
        """A rebalance finished with ``partitions`` assigned; lag series of revoked partitions are removed."""
        self.rebalances.inc()
        self.assigned_partitions.set(len(partitions))
        for topic, partition in self._lag_partitions - set(partitions):
            self.consumer_lag_records.remove(topic, str(partition))
            self.consumer_lag_seconds.remove(topic, str(partition))
        self._lag_partitions &= set(partitions)

    def record_sequenced(self, topic: str, records: int, written: int) -> None:
        """``records`` of input ``topic`` went to the sequence topic in ``written`` sequence records."""
        self.sequenced_records.labels(topic=topic).inc(records)
        self.sequence_records_written.inc(written)

    def record_roles(
        self, *, sequencing: int | None = None, deciding: bool | None = None, following: bool | None = None
    ) -> None:
        """The input partitions this instance sequences, whether it decides and whether it follows the decider
        (None: unchanged)."""
        if sequencing is not None:
            self.sequencer_partitions.set(sequencing)
        if deciding is not None:
            self.decider.set(1 if deciding else 0)
        if following is not None:
            self.standby.set(1 if following else 0)

    def record_standby_lag(self, records: int) -> None:
        self.standby_lag_records.set(records)

    def record_worker_death(self, kind: str) -> None:
        """A worker process of ``kind`` (one of ``WORKER_KINDS``) died."""
        _check_known("worker kind", {kind: 1}, WORKER_KINDS)
        self.worker_deaths.labels(worker=kind).inc()

    def record_lag(self, lags: Mapping[tuple[str, int], PartitionLag]) -> None:
        """Set the lag of each ``(topic, partition)``; partitions not named keep their last value."""
        for (topic, partition), lag in lags.items():
            self.consumer_lag_records.labels(topic=topic, partition=str(partition)).set(lag.records)
            self.consumer_lag_seconds.labels(topic=topic, partition=str(partition)).set(lag.seconds)
            self._lag_partitions.add((topic, partition))


def index_capacity_bytes(path: str | Path, used_bytes: int, max_map_size: int | None = None) -> int:
    """How large the index can get: the map grows on demand until ``max_map_size`` or until the disk is full.

    The map doubles when full, so used / map size says little; used / capacity is how close the index is
    to refusing writes.
    """
    room = used_bytes + shutil.disk_usage(path).free
    return room if max_map_size is None else min(room, max_map_size)


def _check_known(what: str, counts: Mapping[str, int], known: Sequence[str]) -> None:
    unknown = set(counts) - set(known)
    if unknown:
        raise ValueError(f"unknown {what}(s) {sorted(unknown)}; expected one of {tuple(known)}")


def _add(counter: Counter, label: str, counts: Mapping[str, int]) -> None:
    for value, count in counts.items():
        if count < 0:
            raise ValueError(f"a counter only goes up; got {count} for {label}={value!r}")
        if count:
            counter.labels(**{label: value}).inc(count)
