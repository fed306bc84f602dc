"""deploy/k8s: every manifest parses and the references between them hold (names, ports, mounts, config)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    DEPLOY,
    dockerfile_env,
    dockerfile_instructions,
    effective_settings,
    load_yaml,
    load_yaml_documents,
    setting_field,
)

K8S = DEPLOY / "k8s"


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_yaml_documents(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def the(kind: str) -> dict[str, Any]:
    (doc,) = [doc for (found_kind, _), doc in manifests().items() if found_kind == kind]
    return doc


def container() -> dict[str, Any]:
    (only,) = the("StatefulSet")["spec"]["template"]["spec"]["containers"]
    return only


POD_NAME = "streamdedup-0"


def container_env() -> dict[str, str]:
    """The container's env as the kubelet resolves it for pod 0 with no optional Secret present."""
    env = {}
    for item in container()["env"]:
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = POD_NAME
        else:
            assert source["secretKeyRef"]["optional"] is True, item["name"]
    return env


def pod_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Settings the pod runs with: the image's ENV, the container's env, the ConfigMap's file."""
    env = {**dockerfile_env(dockerfile_instructions()), **container_env()}
    return effective_settings(monkeypatch, tmp_path, env, the("ConfigMap")["data"]["config.yaml"])


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert {kind for kind, _ in manifests()} == {"ConfigMap", "Service", "StatefulSet"}


def test_statefulset_service_and_selectors_agree() -> None:
    statefulset, service = the("StatefulSet"), the("Service")
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {port["name"]: port["containerPort"] for port in container()["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in container_ports


def test_ports_probes_and_scrape_annotations_match_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = pod_settings(monkeypatch, tmp_path)
    container_ports = {port["name"]: port["containerPort"] for port in container()["ports"]}
    assert container_ports["http"] == settings.metrics.port
    assert settings.metrics.host == "0.0.0.0"
    probes = {name: container()[name]["httpGet"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["startupProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert {probe["port"] for probe in probes.values()} == {"http"}
    annotations = the("StatefulSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == settings.metrics.port
    assert annotations["prometheus.io/path"] == "/metrics"


def test_mounts_config_and_index_volume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    statefulset = the("StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    claims = {claim["metadata"]["name"]: claim for claim in statefulset["spec"]["volumeClaimTemplates"]}
    mounts = {mount["name"]: mount for mount in container()["volumeMounts"]}
    assert set(mounts) == set(volumes) | set(claims)

    config_map = the("ConfigMap")
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    entrypoint = next(i.arguments for i in dockerfile_instructions() if i.keyword == "ENTRYPOINT")
    config_path = Path(json.loads(entrypoint)[2])
    assert mounts["config"]["mountPath"] == str(config_path.parent) and mounts["config"]["readOnly"]
    assert config_path.name in config_map["data"]

    settings = pod_settings(monkeypatch, tmp_path)
    (claim_name,) = claims
    assert settings.index.path.is_relative_to(mounts[claim_name]["mountPath"])
    assert claims[claim_name]["spec"]["accessModes"] == ["ReadWriteOnce"]
    storage = claims[claim_name]["spec"]["resources"]["requests"]["storage"]
    # The index is bounded to what the volume holds, at the disk per kept document of long texts (740 B;
    # bench growth's natural text takes 515) with room to spare.
    assert storage.endswith("Gi")
    assert settings.index.max_entries is not None
    assert settings.index.max_entries * 800 <= 0.8 * int(storage[:-2]) * 2**30


def test_pod_is_locked_down_and_sized() -> None:
    pod = the("StatefulSet")["spec"]["template"]["spec"]
    user = next(i.arguments for i in dockerfile_instructions() if i.keyword == "USER")
    assert pod["securityContext"]["runAsUser"] == int(user.split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    security = container()["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    # With a read-only root, every path the service writes is a mount.
    assert {"/tmp", "/var/lib/streamdedup"} <= {mount["mountPath"] for mount in container()["volumeMounts"]}
    resources = container()["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert pod["terminationGracePeriodSeconds"] >= 30


def test_configmap_keys_are_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = pod_settings(monkeypatch, tmp_path)
    overrides = yaml.safe_load(the("ConfigMap")["data"]["config.yaml"])
    for section, values in overrides.items():
        for key, value in values.items():
            assert getattr(getattr(settings, section), key) in (value, [value]), f"{section}.{key}"


def test_every_env_variable_names_a_setting_and_secrets_come_from_secrets() -> None:
    for item in container()["env"]:
        setting = setting_field(item["name"])
        if "password" in setting[-1]:
            assert "secretKeyRef" in item["valueFrom"], item["name"]


def test_pods_scale_out_with_static_membership_and_the_deployments_transactional_ids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = pod_settings(monkeypatch, tmp_path)
    kafka = settings.kafka
    assert kafka.group_instance_id == POD_NAME
    assert kafka.sequence_topic is not None and kafka.warm_standby
    assert the("StatefulSet")["spec"]["replicas"] >= 2  # a decider and its warm standby
    # The roles' transactional ids derive from the group, not the pod: whichever pod takes a partition or the
    # sequence over fences the one that had it, and another deployment (its own group) never fences this one.
    assert kafka.transactional_id is None
    assert kafka.decider().producer_transactional_id == f"{kafka.group_id}.decider"
    assert kafka.sequencer_transactional_id("news", 0) == f"{kafka.group_id}.sequencer.news.0"


def test_the_topics_the_service_creates_have_three_replicas(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert pod_settings(monkeypatch, tmp_path).kafka.topic_replication_factor == 3
