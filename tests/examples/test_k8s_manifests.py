"""examples/k8s/ is valid Kubernetes and agrees with itself and with tamis.

Validity: every document against the OpenAPI schemas of Kubernetes 1.33 that
kubernetes-validate bundles (offline), strict, so an unknown or misspelled field fails.
Agreement: the container's arguments parse as ``tamis serve``'s; probes, Service and
scrape annotations name the container's port and the server's liveness/readiness routes;
volumes, claims and cache variables line up; the grace period covers the shutdown; the
autoscaler's metric is the one the Prometheus adapter rule makes of a series tamis serves.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml

K8S_VERSION = "1.33.0"
K8S_DIR = Path(__file__).parents[2] / "examples" / "k8s"


def _documents() -> dict[str, dict]:
    """Every manifest in examples/k8s, keyed ``file:Kind``."""
    documents = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            documents[f"{path.name}:{document['kind']}"] = document
    return documents


DOCUMENTS = _documents()


def _kind(kind: str) -> dict:
    [document] = [d for d in DOCUMENTS.values() if d["kind"] == kind]
    return document


def _container() -> dict:
    [container] = _kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _serve_args():
    from tamis.cli import build_parser
    container = _container()
    assert container["command"] == ["tamis"]
    return build_parser().parse_args(container["args"])   # SystemExit on an unknown flag


def test_the_expected_objects_are_there():
    assert sorted(d["kind"] for d in DOCUMENTS.values()) == [
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Service"]


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_manifest_is_valid_kubernetes(name):
    kubernetes_validate.validate(DOCUMENTS[name], K8S_VERSION, strict=True)


def test_the_validator_catches_a_misspelled_field():
    deployment = copy.deepcopy(_kind("Deployment"))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGet"]["paht"] = probe["httpGet"].pop("path")
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_container_runs_tamis_serve_with_valid_flags():
    args = _serve_args()
    assert args.command == "serve" and args.host == "0.0.0.0"


def test_probes_service_and_scraping_use_the_server_port_and_routes():
    from tamis.server.startup import LIVENESS_PATH, READINESS_PATHS
    deployment, service = _kind("Deployment"), _kind("Service")
    container = _container()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert list(ports.values()) == [_serve_args().port]
    assert container["livenessProbe"]["httpGet"]["path"] == LIVENESS_PATH
    assert container["readinessProbe"]["httpGet"]["path"] in READINESS_PATHS
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert all(port["targetPort"] in ports for port in service["spec"]["ports"])
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == _serve_args().port
    assert annotations["prometheus.io/path"] == "/metrics"


def test_model_cache_volume_lines_up():
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    container = _container()
    claim = _kind("PersistentVolumeClaim")["metadata"]["name"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts.keys() <= volumes.keys()
    [cache] = [name for name, volume in volumes.items()
               if volume.get("persistentVolumeClaim", {}).get("claimName") == claim]
    env = {var["name"]: var.get("value") for var in container["env"]}
    for variable in ("HF_HOME", "TAMIS_CACHE_DIR"):
        assert Path(env[variable]).is_relative_to(mounts[cache]), variable


def test_grace_period_covers_the_pre_stop_sleep_and_the_shutdown():
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    command = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(command[1]) + _serve_args().shutdown_timeout


def _adapter_rule() -> dict:
    [rule] = yaml.safe_load(_kind("ConfigMap")["data"]["config.yaml"])["rules"]
    return rule


def _served_series(namespace: str) -> set[str]:
    """The series names ``tamis serve --metrics-namespace NAMESPACE`` exports."""
    from prometheus_client import generate_latest
    from tamis.server.metrics import ServerMetrics
    engine = SimpleNamespace(last_stats=None, num_in_flight=0)   # before the first step
    text = generate_latest(ServerMetrics(engine, "m", namespace=namespace).registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


@pytest.mark.parametrize("namespace", ["tamis", "vllm"])
def test_autoscaler_metric_is_what_the_adapter_makes_of_a_served_series(namespace):
    hpa, rule = _kind("HorizontalPodAutoscaler"), _adapter_rule()
    [metric] = hpa["spec"]["metrics"]
    wanted = metric["pods"]["metric"]["name"]
    series_pattern = re.search(r'__name__=~"(.*?)"', rule["seriesQuery"]).group(1)
    # The adapter's name rule: `matches` on the series name, then `as`, whose Go group
    # references (${2} or $2) Python writes \g<2>.
    replacement = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule["name"]["as"])
    renamed = {re.sub(rule["name"]["matches"], replacement, series)
               for series in _served_series(namespace)
               if re.search(series_pattern, series) and re.search(rule["name"]["matches"], series)}
    assert renamed == {wanted}
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


def test_autoscaler_targets_the_deployment_below_a_full_batch():
    hpa, deployment = _kind("HorizontalPodAutoscaler"), _kind("Deployment")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"]   # the autoscaler owns the count
    [metric] = hpa["spec"]["metrics"]
    assert 0 < float(metric["pods"]["target"]["averageValue"]) < _serve_args().max_num_seqs
