"""deploy/prometheus: promtool accepts the config and the rules, the rule unit tests pass, names line up."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from streamdedup.settings import Settings
from tests.deploy.support import (
    DEPLOY,
    PROMETHEUS_SERIES,
    REPO,
    exported_labels,
    exported_series,
    grouping_labels,
    load_yaml,
    promtool,
    series_in,
)

PROMETHEUS = DEPLOY / "prometheus"


def run_promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    result = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def alert_rules() -> list[dict]:
    return [rule for group in load_yaml(PROMETHEUS / "alerts.yml")["groups"] for rule in group["rules"]]


def test_promtool_checks_the_config_and_its_rule_files() -> None:
    output = run_promtool("check", "config", "prometheus.yml")
    assert "1 rule files found" in output


def test_promtool_checks_the_rules() -> None:
    output = run_promtool("check", "rules", "alerts.yml")
    assert f"{len(alert_rules())} rules found" in output


def test_promtool_rule_unit_tests_pass() -> None:
    assert "SUCCESS" in run_promtool("test", "rules", "alerts.test.yml")


def test_the_unit_tests_cover_every_alert() -> None:
    tests = load_yaml(PROMETHEUS / "alerts.test.yml")["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests for case in test["alert_rule_test"] if not case["exp_alerts"]}
    names = {rule["alert"] for rule in alert_rules()}
    assert tested == fired == quiet == names


def test_the_issue_asks_for_these_alerts_and_the_workers_one() -> None:
    expressions = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    assert set(expressions) == {
        "StreamdedupDown",
        "StreamdedupConsumerLagGrowing",
        "StreamdedupDeadLetterRate",
        "StreamdedupNoCommit",
        "StreamdedupIndexMapNearlyFull",
        "StreamdedupIndexStorageFailing",
        "StreamdedupWorkersDying",
        "StreamdedupSequenceUndecided",
        "StreamdedupStandbyBehind",
    }
    assert "up{" in expressions["StreamdedupDown"]
    assert "streamdedup_consumer_lag_records" in expressions["StreamdedupConsumerLagGrowing"]
    assert "streamdedup_messages_dead_lettered_total" in expressions["StreamdedupDeadLetterRate"]
    assert "streamdedup_last_commit_timestamp_seconds" in expressions["StreamdedupNoCommit"]
    assert "streamdedup_index_capacity_bytes" in expressions["StreamdedupIndexMapNearlyFull"]
    assert "streamdedup_index_storage_failing" in expressions["StreamdedupIndexStorageFailing"]
    assert "streamdedup_worker_deaths_total" in expressions["StreamdedupWorkersDying"]
    assert "streamdedup_decider" in expressions["StreamdedupSequenceUndecided"]
    assert "streamdedup_standby_lag_records" in expressions["StreamdedupStandbyBehind"]


def test_alerts_use_only_exported_series_and_labels() -> None:
    exported = exported_series() | PROMETHEUS_SERIES
    labels = exported_labels()
    for rule in alert_rules():
        assert series_in(rule["expr"]) <= exported, (rule["alert"], series_in(rule["expr"]) - exported)
        assert grouping_labels(rule["expr"]) <= labels, rule["alert"]


def test_every_alert_has_a_severity_and_a_runbook_section() -> None:
    anchors = _anchors(REPO / "docs" / "operations.md")
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert path == "docs/operations.md"
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in docs/operations.md"


def test_scrape_job_targets_the_service_port_and_matches_the_alerts() -> None:
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (target,) = job["static_configs"][0]["targets"]
    compose = load_yaml(DEPLOY / "docker-compose.yml")
    host, port = target.split(":")
    assert host in compose["services"]
    assert int(port) == Settings().metrics.port
    down = next(rule for rule in alert_rules() if rule["alert"] == "StreamdedupDown")
    assert f'job="{job["job_name"]}"' in down["expr"]


def _anchors(markdown: Path) -> set[str]:
    """GitHub-style anchors of the headings (lower case, punctuation dropped, spaces to hyphens)."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
