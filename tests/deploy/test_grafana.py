"""deploy/grafana: the dashboard's panels, queries and provisioning agree with the metrics and the stack."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.support import (
    DEPLOY,
    PROMETHEUS_SERIES,
    exported_labels,
    exported_series,
    grouping_labels,
    load_yaml,
    promtool,
    series_in,
)

GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "streamdedup.json"

# Grafana's own variables, and what the queries get when Prometheus evaluates them without Grafana.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def queries() -> list[tuple[str, str, str]]:
    """(panel title, refId, expression) of every target."""
    return [(panel["title"], target["refId"], target["expr"]) for panel in panels() for target in panel["targets"]]


def concrete(expr: str, instance: str = ".*") -> str:
    """The expression as Prometheus sees it once Grafana has filled in its variables."""
    for name, value in {**GRAFANA_VARIABLES, "$instance": instance}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown variable left in {expr}"
    return expr


def test_every_panel_the_issue_asks_for_is_there() -> None:
    by_title = {panel["title"]: panel for panel in panels()}
    assert {
        "Throughput",
        "Drop ratio",
        "Dead letters",
        "Consumer lag (records)",
        "Consumer lag (age)",
        "Batch latency p50 / p99",
        "Stage latency p50 / p99",
        "Index size",
        "Index growth",
        "Match distance",
    } <= set(by_title)
    assert by_title["Match distance"]["type"] == "heatmap"
    (heatmap_target,) = by_title["Match distance"]["targets"]
    assert heatmap_target["format"] == "heatmap"
    assert "streamdedup_match_distance_bits_bucket" in heatmap_target["expr"] and "by (le)" in heatmap_target["expr"]
    latency = " ".join(target["expr"] for target in by_title["Batch latency p50 / p99"]["targets"])
    assert "histogram_quantile(0.5," in latency and "histogram_quantile(0.99," in latency


def test_queries_select_only_exported_series_and_labels() -> None:
    exported = exported_series() | PROMETHEUS_SERIES
    labels = exported_labels()
    for title, ref, expr in queries():
        assert series_in(expr), (title, ref)
        assert series_in(expr) <= exported, (title, ref, series_in(expr) - exported)
        assert grouping_labels(expr) <= labels, (title, ref)
        # Every series is narrowed to the instances picked in the dashboard's variable.
        for name in series_in(expr) - {"up"}:
            assert re.search(rf'{name}\{{[^}}]*instance=~"\$instance"', expr), (title, ref, name)


def test_counters_are_only_read_through_rate_or_increase() -> None:
    for title, ref, expr in queries():
        for counter in re.findall(r"\b\w+_total\b", expr):
            assert re.search(rf"\b(rate|increase)\({counter}\{{[^}}]*\}}\[", expr), (title, ref, counter)


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{index}", "expr": concrete(expr)} for index, (_, _, expr) in enumerate(queries())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout


def test_layout_ids_and_datasource_are_consistent() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
    datasource = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    for panel in panels():
        assert panel["datasource"]["uid"] == datasource["uid"]
        assert {target["datasource"]["uid"] for target in panel["targets"]} == {datasource["uid"]}
        assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"])
    (variable,) = board["templating"]["list"]
    assert variable["name"] == "instance" and variable["datasource"]["uid"] == datasource["uid"]
    assert "streamdedup_build_info" in variable["query"]["query"]


def test_provisioning_points_at_the_compose_stack() -> None:
    compose = load_yaml(DEPLOY / "docker-compose.yml")
    grafana = compose["services"]["grafana"]
    mounts = {
        source: target.removesuffix(":ro") for source, _, target in (m.partition(":") for m in grafana["volumes"])
    }
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "streamdedup.yml")["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert (
        grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        == f"{provider['options']['path']}/{DASHBOARD.name}"
    )
    datasource = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", datasource["url"]).groups()
    assert host in compose["services"]
    assert port in {published.split(":")[-1] for published in compose["services"][host]["ports"]}
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape
