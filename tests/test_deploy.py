"""The reference deployments in ``deploy/`` check out with the tools that run them: HAProxy's configuration with
``haproxy -c``, Prometheus' configuration and alerting rules with ``promtool`` (syntax, and unit tests that each alert
fires), every metric the rules and the Grafana dashboard query is one the server exports, the Compose file against
the Compose schema, and the Helm chart rendered by Helm's own engine and checked against Kubernetes' schemas."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from testkit.cluster import REPO, MissingTool, require_tool, skip_or_fail
from tests.conftest import Server

DEPLOY = REPO / "deploy"
KUBERNETES_VERSION = "1.30"
"""The Kubernetes API the chart's manifests are checked against."""
METRIC = re.compile(r"\b(rtvoice_[a-z0-9_]+)\b")
SUFFIXES = {"_bucket": "histogram", "_sum": "", "_count": "", "_total": "counter", "_created": ""}


def tool(name: str, package: str) -> str:
    try:
        return require_tool(name, package)
    except MissingTool as missing:
        skip_or_fail(missing)
        raise


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_haproxy_configuration_is_valid(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HAPROXY_RUN_DIR": str(tmp_path),
        "RTVOICE_LB_BIND": ":8080",
        "RTVOICE_LB_STATS_BIND": ":8404",
    }
    checked = run([tool("haproxy", "haproxy"), "-c", "-f", str(DEPLOY / "haproxy" / "haproxy.cfg")], env)
    assert checked.returncode == 0, checked.stderr
    assert "ALERT" not in checked.stderr


def test_prometheus_configuration_and_alerting_rules() -> None:
    promtool = tool("promtool", "prometheus")
    prometheus = DEPLOY / "prometheus"
    for command in (
        ["check", "config", str(prometheus / "prometheus.yml")],
        ["check", "rules", str(prometheus / "alerts.yml")],
        ["test", "rules", str(prometheus / "alerts_test.yml")],
    ):
        checked = run([promtool, *command])
        assert checked.returncode == 0, f"promtool {' '.join(command)}:\n{checked.stdout}{checked.stderr}"


def queried_metrics() -> dict[str, set[str]]:
    """Every rtvoice metric named in the alerting rules and the dashboard, with where."""
    found: dict[str, set[str]] = {}
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in METRIC.findall(rule["expr"]):
                found.setdefault(name, set()).add(f"alert {rule['alert']}")
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "rtvoice.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in METRIC.findall(target["expr"]):
                found.setdefault(name, set()).add(f"panel {panel['title']!r}")
    return found


def test_every_queried_metric_is_exported(server: Server) -> None:
    families = {f.name: f.type for f in text_string_to_metric_families(server_metrics(server))}
    queried = queried_metrics()
    assert len(queried) >= 8
    for name, where in sorted(queried.items()):
        family, kind = name, ""
        for suffix, suffix_kind in SUFFIXES.items():
            if name.endswith(suffix) and name.removesuffix(suffix) in families:
                family, kind = name.removesuffix(suffix), suffix_kind
        assert family in families, f"{name} ({', '.join(sorted(where))}) is not exported by the server"
        assert not kind or families[family] == kind, f"{name} is a {families[family]}, queried as a {kind}"


def server_metrics(server: Server) -> str:
    import httpx

    response = httpx.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 200
    return response.text


def test_dashboard_and_its_provisioning_are_grafanas() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "rtvoice.json").read_text())
    assert dashboard["uid"] == "rtvoice" and dashboard["panels"]
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for shown in ("first audio", "real-time factor", "active", "queued", "stall", "whep", "load per replica"):
        assert shown in titles, f"the dashboard shows no {shown}"
    datasources = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = datasources["datasources"][0]["uid"]
    assert all(panel["datasource"]["uid"] == uid for panel in dashboard["panels"])


def test_compose_file_matches_the_compose_schema() -> None:
    checked = run(
        [
            str(Path(sys.executable).parent / "check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(DEPLOY / "compose.yaml"),
        ]
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("haproxy", "prometheus", "grafana", "coturn"):
        assert name in services
    profiles = {profile for service in services.values() for profile in service.get("profiles", [])}
    assert profiles == {"cpu", "gpu"}
    # The files the Compose file mounts exist.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source


VALUES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu, TURN, KEDA, public URLs": {
        "gpu": {"enabled": True, "modelClaim": "cosyvoice2-model"},
        "turn": {"enabled": True, "externalIp": "203.0.113.7"},
        "autoscaling": {"kind": "keda"},
        "whep": {"publicUrlTemplate": "https://$(POD_NAME).tts.example.com"},
    },
    "no autoscaling": {"autoscaling": {"enabled": False}, "replicas": 3, "sharedData": {"existingClaim": "shared"}},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    helm = pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk renders the chart")
    with helm.Chart.load(str(DEPLOY / "helm" / "rtvoice")) as chart:
        rendered = chart.render(values, name="rtvoice", namespace="tts")
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("values", list(VALUES.values()), ids=list(VALUES))
def test_helm_chart_renders_valid_kubernetes_manifests(values: dict[str, Any]) -> None:
    import kubernetes_validate

    manifests = render(values)
    kinds = {doc["kind"] for doc in manifests}
    assert {"StatefulSet", "Service"} <= kinds
    for doc in manifests:
        if doc["apiVersion"].startswith("keda.sh/"):  # a custom resource: no schema in Kubernetes' own
            assert doc["spec"]["triggers"][0]["type"] == "prometheus"
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    workload = next(doc for doc in manifests if doc["kind"] == "StatefulSet")
    container = workload["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["RTVOICE_REPLICA_ID"]["value"] == "$(POD_NAME)"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["lifecycle"]["preStop"]
    if values.get("gpu", {}).get("enabled"):
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "RTVOICE_TURN_SECRET" in env and "valueFrom" in env["RTVOICE_TURN_SECRET"]  # never a literal secret
    if values.get("autoscaling", {}).get("enabled", True):
        assert kinds & {"HorizontalPodAutoscaler", "ScaledObject"}
    else:
        assert workload["spec"]["replicas"] == 3
    if values == {}:
        assert {"PodDisruptionBudget", "PersistentVolumeClaim", "HorizontalPodAutoscaler"} <= kinds
        claim = next(doc for doc in manifests if doc["kind"] == "PersistentVolumeClaim")
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
