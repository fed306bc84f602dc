"""The metric catalogue follows Prometheus conventions, moves as the service reports, and scrapes over HTTP."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import aiohttp
import aiokafka
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

import streamdedup
from streamdedup.health import HealthServer
from streamdedup.index import SegmentIndex
from streamdedup.metrics import (
    DROP_REASONS,
    TRANSACTION_RESULTS,
    WORKER_KINDS,
    PartitionLag,
    ServiceMetrics,
    Stage,
    index_capacity_bytes,
)
from streamdedup.names import DEAD_LETTER_REASONS, METRIC_PREFIX
from streamdedup.verdicts import Verdict

# The catalogue the dashboard, the alerts and docs/operations.md are written against.
EXPECTED_FAMILIES = {
    "streamdedup_messages_consumed": ("counter", {"topic"}),
    "streamdedup_messages_published": ("counter", {"topic"}),
    "streamdedup_messages_dropped": ("counter", {"reason"}),
    "streamdedup_messages_dead_lettered": ("counter", {"reason"}),
    "streamdedup_event_times_clamped": ("counter", set()),
    "streamdedup_batch_duration_seconds": ("histogram", set()),
    "streamdedup_fingerprint_duration_seconds": ("histogram", set()),
    "streamdedup_index_lookup_duration_seconds": ("histogram", set()),
    "streamdedup_produce_duration_seconds": ("histogram", set()),
    "streamdedup_commit_duration_seconds": ("histogram", set()),
    "streamdedup_match_distance_bits": ("histogram", set()),
    "streamdedup_index_entries": ("gauge", set()),
    "streamdedup_index_used_bytes": ("gauge", set()),
    "streamdedup_index_map_size_bytes": ("gauge", set()),
    "streamdedup_index_capacity_bytes": ("gauge", set()),
    "streamdedup_index_mirror_bytes": ("gauge", set()),
    "streamdedup_index_mirrored_tables": ("gauge", set()),
    "streamdedup_index_expired_entries": ("counter", set()),
    "streamdedup_index_storage_failing": ("gauge", set()),
    "streamdedup_index_storage_errors": ("counter", set()),
    "streamdedup_consumer_lag_records": ("gauge", {"topic", "partition"}),
    "streamdedup_consumer_lag_seconds": ("gauge", {"topic", "partition"}),
    "streamdedup_assigned_partitions": ("gauge", set()),
    "streamdedup_rebalances": ("counter", set()),
    "streamdedup_transactions": ("counter", {"result"}),
    "streamdedup_worker_deaths": ("counter", {"worker"}),
    "streamdedup_last_commit_timestamp_seconds": ("gauge", set()),
    "streamdedup_sequencer_partitions": ("gauge", set()),
    "streamdedup_decider": ("gauge", set()),
    "streamdedup_standby": ("gauge", set()),
    "streamdedup_standby_lag_records": ("gauge", set()),
    "streamdedup_sequenced_records": ("counter", {"topic"}),
    "streamdedup_sequence_records_written": ("counter", set()),
    "streamdedup_build": ("info", {"version", "aiokafka_version"}),
}


def populated() -> ServiceMetrics:
    """Metrics with at least one series in every labelled family, so label names are visible."""
    metrics = ServiceMetrics(input_topics=["in"], output_topics=["out"])
    metrics.record_lag({("in", 0): PartitionLag(records=3, seconds=1.5)})
    metrics.record_sequenced("in", 3, 1)
    return metrics


def families(metrics: ServiceMetrics) -> dict[str, object]:
    return {family.name: family for family in metrics.registry.collect() if family.name.startswith(METRIC_PREFIX)}


def value(metrics: ServiceMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_catalogue_is_exactly_the_documented_one() -> None:
    found = {
        name: (family.type, {label for sample in family.samples for label in sample.labels} - {"le"})
        for name, family in families(populated()).items()
    }
    assert found == EXPECTED_FAMILIES


def test_names_follow_prometheus_conventions() -> None:
    for name, family in families(populated()).items():
        assert name.startswith("streamdedup_") and name == name.lower()
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name in {f"{name}_total", f"{name}_created"}, sample.name
            if family.type == "histogram" and not name.endswith("_bits"):
                assert name.endswith("_seconds"), name
        # Units are spelled out: a duration is in seconds, a size in bytes, never milli- or kilo-.
        assert not any(unit in name for unit in ("_ms", "milli", "_kb", "_mb", "kilo"))


def test_labels_stay_low_cardinality_before_any_traffic() -> None:
    metrics = ServiceMetrics(input_topics=["a", "b"])
    dead_lettered = {s.labels["reason"] for s in families(metrics)["streamdedup_messages_dead_lettered"].samples}
    assert dead_lettered == set(DEAD_LETTER_REASONS)
    dropped = {s.labels["reason"] for s in families(metrics)["streamdedup_messages_dropped"].samples}
    assert dropped == set(DROP_REASONS)
    results = {s.labels["result"] for s in families(metrics)["streamdedup_transactions"].samples}
    assert results == set(TRANSACTION_RESULTS)
    workers = {s.labels["worker"] for s in families(metrics)["streamdedup_worker_deaths"].samples}
    assert workers == set(WORKER_KINDS)
    # Pre-created at zero so rate() has a series from the first scrape.
    assert value(metrics, "streamdedup_messages_dead_lettered_total", reason="not_utf8") == 0.0
    assert value(metrics, "streamdedup_messages_consumed_total", topic="b") == 0.0


def test_counters_move_by_batch_totals() -> None:
    metrics = ServiceMetrics()
    metrics.record_consumed({"in": 100})
    metrics.record_consumed({"in": 28, "other": 2})
    metrics.record_published({"out": 70, "dlq": 3})
    metrics.record_dead_lettered({"invalid_json": 2, "too_large": 1})
    metrics.record_dropped({"exact": 40, "near": 15}, distances=np.zeros(55, dtype=np.int64))
    assert value(metrics, "streamdedup_messages_consumed_total", topic="in") == 128
    assert value(metrics, "streamdedup_messages_consumed_total", topic="other") == 2
    assert value(metrics, "streamdedup_messages_published_total", topic="dlq") == 3
    assert value(metrics, "streamdedup_messages_dead_lettered_total", reason="too_large") == 1
    assert value(metrics, "streamdedup_messages_dropped_total", reason="exact") == 40
    assert value(metrics, "streamdedup_messages_dropped_total", reason="near") == 15


def test_verdicts_count_duplicates_and_their_distances() -> None:
    fp = np.zeros(1, dtype=np.uint64)
    verdicts = [
        Verdict(True, "novel", fp),
        Verdict(False, "exact", fp, "a", 0, 1.0),
        Verdict(False, "near", fp, "a", 2, 0.8),
        Verdict(False, "near", fp, "b", 3, 0.6),
        Verdict(True, "unindexable", fp, error="no text"),
    ]
    metrics = ServiceMetrics(radius=3)
    metrics.record_verdicts(verdicts)
    assert value(metrics, "streamdedup_messages_dropped_total", reason="exact") == 1
    assert value(metrics, "streamdedup_messages_dropped_total", reason="near") == 2
    buckets = {
        le: value(metrics, "streamdedup_match_distance_bits_bucket", le=le)
        for le in ("0.0", "1.0", "2.0", "3.0", "+Inf")
    }
    assert buckets == {"0.0": 1, "1.0": 1, "2.0": 2, "3.0": 3, "+Inf": 3}
    assert value(metrics, "streamdedup_match_distance_bits_sum") == 5


@settings(max_examples=50, deadline=None)
@given(
    radius=st.integers(min_value=0, max_value=12),
    batches=st.lists(st.lists(st.integers(min_value=0, max_value=64), max_size=40), max_size=5),
)
def test_batch_distance_histogram_equals_one_observe_per_value(radius: int, batches: list[list[int]]) -> None:
    metrics = ServiceMetrics(radius=radius, process_metrics=False)
    oracle_registry = CollectorRegistry()
    oracle = Histogram(
        "oracle", "one observe per value", buckets=[float(b) for b in range(radius + 1)], registry=oracle_registry
    )
    for batch in batches:
        metrics.match_distance.observe_many(np.array(batch, dtype=np.int64))
        for distance in batch:
            oracle.observe(distance)
    for bound in [f"{float(b)}" for b in range(radius + 1)] + ["+Inf"]:
        assert value(metrics, "streamdedup_match_distance_bits_bucket", le=bound) == oracle_registry.get_sample_value(
            "oracle_bucket", {"le": bound}
        )
    assert value(metrics, "streamdedup_match_distance_bits_count") == oracle_registry.get_sample_value("oracle_count")
    assert value(metrics, "streamdedup_match_distance_bits_sum") == oracle_registry.get_sample_value("oracle_sum")


def test_stage_timers_observe_into_their_own_histogram() -> None:
    metrics = ServiceMetrics()
    with metrics.timer(Stage.FINGERPRINT):
        time.sleep(0.02)
    metrics.observe(Stage.INDEX_LOOKUP, 0.003)
    assert value(metrics, "streamdedup_fingerprint_duration_seconds_count") == 1
    assert 0.02 <= value(metrics, "streamdedup_fingerprint_duration_seconds_sum") < 1.0
    assert value(metrics, "streamdedup_fingerprint_duration_seconds_bucket", le="0.01") == 0
    assert value(metrics, "streamdedup_index_lookup_duration_seconds_bucket", le="0.005") == 1
    assert value(metrics, "streamdedup_index_lookup_duration_seconds_bucket", le="0.0025") == 0
    assert value(metrics, "streamdedup_batch_duration_seconds_count") == 0


def test_transactions_set_the_last_commit_time_only_when_committed() -> None:
    metrics = ServiceMetrics()
    metrics.record_transaction("aborted", seconds=0.2)
    assert value(metrics, "streamdedup_last_commit_timestamp_seconds") == 0
    before = time.time()
    metrics.record_transaction("committed", seconds=0.01)
    assert before <= value(metrics, "streamdedup_last_commit_timestamp_seconds") <= time.time()
    assert value(metrics, "streamdedup_transactions_total", result="committed") == 1
    assert value(metrics, "streamdedup_transactions_total", result="aborted") == 1
    assert value(metrics, "streamdedup_commit_duration_seconds_count") == 2
    assert value(metrics, "streamdedup_commit_duration_seconds_sum") == pytest.approx(0.21)


def test_index_gauges_and_expired_counter() -> None:
    metrics = ServiceMetrics()
    metrics.record_index(entries=1000, used_bytes=409_600, map_size_bytes=1 << 30, capacity_bytes=1 << 34, expired=12)
    metrics.record_index(
        entries=990,
        used_bytes=405_504,
        map_size_bytes=1 << 30,
        capacity_bytes=1 << 34,
        mirror_bytes=31_680,
        mirrored_tables=2,
        expired=10,
    )
    assert value(metrics, "streamdedup_index_entries") == 990
    assert value(metrics, "streamdedup_index_used_bytes") == 405_504
    assert value(metrics, "streamdedup_index_map_size_bytes") == 1 << 30
    assert value(metrics, "streamdedup_index_capacity_bytes") == 1 << 34
    assert value(metrics, "streamdedup_index_mirror_bytes") == 31_680
    assert value(metrics, "streamdedup_index_mirrored_tables") == 2
    assert value(metrics, "streamdedup_index_expired_entries_total") == 22


def test_index_capacity_is_the_disk_room_or_the_configured_maximum(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    capacity = index_capacity_bytes(tmp_path, used_bytes=4096)
    # Other processes write to the same disk meanwhile; allow them a little.
    assert abs(capacity - (4096 + free)) < 64 << 20
    assert index_capacity_bytes(tmp_path, used_bytes=4096, max_map_size=1 << 20) == 1 << 20


def test_real_index_stats_feed_the_gauges(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    fps = rng.integers(0, 2**63, size=(500, 1), dtype=np.uint64)
    with SegmentIndex(tmp_path / "index", bits=64, radius=3, expected_entries=1000) as index:
        index.add([f"doc-{i}" for i in range(500)], fps, times=np.full(500, 1000.0))
        stats = index.stats()
    metrics = ServiceMetrics()
    metrics.record_index(
        entries=stats["entries"],
        used_bytes=stats["disk_bytes"],
        map_size_bytes=stats["map_size"],
        capacity_bytes=index_capacity_bytes(tmp_path, stats["disk_bytes"]),
    )
    assert value(metrics, "streamdedup_index_entries") == 500
    used = value(metrics, "streamdedup_index_used_bytes")
    assert (
        500 * 8
        < used
        <= value(metrics, "streamdedup_index_map_size_bytes")
        < value(metrics, "streamdedup_index_capacity_bytes")
    )


def test_storage_failures_set_the_gauge_until_a_batch_stores_and_are_counted() -> None:
    metrics = ServiceMetrics()
    assert value(metrics, "streamdedup_index_storage_failing") == 0
    metrics.record_storage(failed=True)
    metrics.record_storage(failed=True)
    assert value(metrics, "streamdedup_index_storage_failing") == 1
    metrics.record_storage(failed=False)
    assert value(metrics, "streamdedup_index_storage_failing") == 0
    assert value(metrics, "streamdedup_index_storage_errors_total") == 2


def test_rebalance_drops_lag_series_of_revoked_partitions() -> None:
    metrics = ServiceMetrics()
    metrics.record_assignment([("in", 0), ("in", 1)])
    metrics.record_lag({("in", 0): PartitionLag(10, 2.5), ("in", 1): PartitionLag(0, 0.0)})
    assert value(metrics, "streamdedup_consumer_lag_records", topic="in", partition="0") == 10
    assert value(metrics, "streamdedup_consumer_lag_seconds", topic="in", partition="0") == 2.5
    metrics.record_assignment([("in", 1), ("in", 2)])
    assert value(metrics, "streamdedup_rebalances_total") == 2
    assert value(metrics, "streamdedup_assigned_partitions") == 2
    assert value(metrics, "streamdedup_consumer_lag_records", topic="in", partition="0") is None
    assert value(metrics, "streamdedup_consumer_lag_seconds", topic="in", partition="0") is None
    assert value(metrics, "streamdedup_consumer_lag_records", topic="in", partition="1") == 0


def test_worker_deaths_are_counted_by_kind() -> None:
    metrics = ServiceMetrics()
    metrics.record_worker_death("signer")
    metrics.record_worker_death("signer")
    metrics.record_worker_death("decision")
    assert value(metrics, "streamdedup_worker_deaths_total", worker="signer") == 2
    assert value(metrics, "streamdedup_worker_deaths_total", worker="decision") == 1


def test_build_info_names_both_versions() -> None:
    metrics = ServiceMetrics()
    assert (
        value(metrics, "streamdedup_build_info", version=streamdedup.__version__, aiokafka_version=aiokafka.__version__)
        == 1
    )


def test_bad_reports_are_refused_with_a_clear_error() -> None:
    metrics = ServiceMetrics()
    with pytest.raises(ValueError, match="only goes up"):
        metrics.record_consumed({"in": -1})
    with pytest.raises(ValueError, match="unknown drop reason"):
        metrics.record_dropped({"similar": 1})
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        metrics.record_dead_lettered({"unreadable": 1})
    with pytest.raises(ValueError, match="unknown transaction result"):
        metrics.record_transaction("maybe")
    with pytest.raises(ValueError, match="unknown worker kind"):
        metrics.record_worker_death("helper")
    with pytest.raises(ValueError, match="negative"):
        metrics.match_distance.observe_many([1, -2])
    assert value(metrics, "streamdedup_messages_consumed_total", topic="in") is None


def test_each_instance_has_its_own_registry() -> None:
    first, second = ServiceMetrics(), ServiceMetrics()
    first.record_consumed({"in": 5})
    assert value(second, "streamdedup_messages_consumed_total", topic="in") is None


async def test_scrape_over_http_in_both_exposition_formats() -> None:
    metrics = populated()
    metrics.record_consumed({"in": 7})
    metrics.record_dropped({"near": 2}, [1, 3])
    async with HealthServer(metrics.registry, lambda: {"ready": True}, host="127.0.0.1", port=0) as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = await response.text()
            async with session.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("application/openmetrics-text")
                openmetrics = await response.text()
    scraped = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels or sample.labels.get("topic") == "in" or sample.labels.get("reason") == "near"
    }
    assert scraped["streamdedup_messages_consumed_total"].value == 7
    assert scraped["streamdedup_messages_dropped_total"].value == 2
    assert scraped["streamdedup_match_distance_bits_sum"].value == 4
    assert scraped["streamdedup_consumer_lag_records"].value == 3
    assert "process_resident_memory_bytes" in scraped
    assert openmetrics.endswith("# EOF\n")
    assert 'streamdedup_messages_consumed_total{topic="in"} 7.0' in openmetrics


def test_distance_bounds_without_a_radius_reach_the_width_in_few_buckets() -> None:
    from streamdedup.metrics import distance_bounds

    assert distance_bounds(3, 64) == [0, 1, 2, 3]
    wide = distance_bounds(None, 1024)
    assert wide[:8] == [0, 1, 2, 3, 4, 6, 8, 12] and wide[-3:] == [512, 768, 1024]
    assert len(wide) <= 24 and wide == sorted(set(wide))


@settings(max_examples=25, deadline=None)
@given(batches=st.lists(st.lists(st.integers(min_value=0, max_value=1100), max_size=30), max_size=5))
def test_wide_distance_histogram_equals_one_observe_per_value(batches: list[list[int]]) -> None:
    from streamdedup.metrics import distance_bounds

    metrics = ServiceMetrics(radius=None, width=1024, process_metrics=False)
    bounds = distance_bounds(None, 1024)
    oracle_registry = CollectorRegistry()
    oracle = Histogram("oracle", "one observe per value", buckets=[float(b) for b in bounds], registry=oracle_registry)
    for batch in batches:
        metrics.match_distance.observe_many(np.array(batch, dtype=np.int64))
        for distance in batch:
            oracle.observe(distance)
    for bound in [f"{float(b)}" for b in bounds] + ["+Inf"]:
        assert value(metrics, "streamdedup_match_distance_bits_bucket", le=bound) == oracle_registry.get_sample_value(
            "oracle_bucket", {"le": bound}
        )


def test_roles_and_sequencing_are_reported_as_they_change() -> None:
    metrics = ServiceMetrics()
    metrics.record_roles(sequencing=3, deciding=True)
    metrics.record_sequenced("news", 400, 2)
    metrics.record_sequenced("news", 100, 1)
    metrics.record_standby_lag(7)
    assert value(metrics, "streamdedup_sequencer_partitions") == 3
    assert value(metrics, "streamdedup_decider") == 1
    assert value(metrics, "streamdedup_standby") == 0
    assert value(metrics, "streamdedup_sequenced_records_total", topic="news") == 500
    assert value(metrics, "streamdedup_sequence_records_written_total") == 3
    assert value(metrics, "streamdedup_standby_lag_records") == 7
    # Unnamed roles keep their values.
    metrics.record_roles(following=True)
    assert (value(metrics, "streamdedup_decider"), value(metrics, "streamdedup_standby")) == (1, 1)
    metrics.record_roles(deciding=False, following=False, sequencing=0)
    assert value(metrics, "streamdedup_decider") == value(metrics, "streamdedup_standby") == 0
