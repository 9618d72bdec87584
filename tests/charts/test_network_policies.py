"""The chart's NetworkPolicies as rendered: every platform workload is fenced, each component's
port admits exactly the callers the code has (and those callers' pods carry the labels the
policy selects), metrics ports only Prometheus, and the gateway's client API keys mounted from
a Secret that the kubelet can update in place."""

from __future__ import annotations

import json
import re

import pytest

from tests.charts.k8s import CHART, RELEASE, HelmError, named, of_kind, render, workloads

ROOT = CHART.parents[1]
# Who connects to whom, read from the code: the services' clients (checked against the code
# below), the worker's tasks and the training jobs (store, executor, reward, router, policy),
# the policy's init container asking the store for adapters, the helm test's health checks.
CALLERS = {
    "executor": {"gateway", "worker", "training", "health-check"},
    "router": {"executor", "worker", "health-check"},
    "planner": {"executor", "health-check"},
    "reward": {"executor", "gateway", "worker", "training", "health-check"},
    "sandbox": {"executor", "health-check"},
    "store": {"executor", "gateway", "router", "worker", "training", "policy", "health-check"},
    "policy": {"executor", "router", "planner", "worker", "training"},
    "postgresql": {"store", "store-migrate", "worker", "beat", "training"},
    "redis": {"worker", "beat"},
}
SERVED_PORT = {"policy": "http", "postgresql": "postgres", "redis": "redis"}  # the others: grpc
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def name(component: str) -> str:
    return f"{RELEASE}-{component}"


def component_peers(rule: dict) -> set[str]:
    return {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule.get("from", []) if "podSelector" in peer
            and "namespaceSelector" not in peer}


def rule_for(policy: dict, port: str) -> dict:
    (rule,) = [rule for rule in policy["spec"]["ingress"] if {"port": port, "protocol": "TCP"} in rule["ports"]]
    return rule


@pytest.fixture(scope="module")
def docs():
    return render()


def test_every_platform_workload_is_selected_by_a_network_policy(docs):
    policies = of_kind(docs, "NetworkPolicy")
    for doc, spec in workloads(docs):
        if doc["kind"] in ("Job", "Pod", "CronJob"):
            continue  # they only connect out
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert any(p["spec"]["podSelector"]["matchLabels"].items() <= labels.items() for p in policies), doc["metadata"]["name"]


@pytest.mark.parametrize("component", sorted(CALLERS))
def test_each_component_admits_only_its_callers(docs, component):
    policy = named(docs, "NetworkPolicy", name(component))
    assert policy["spec"]["policyTypes"][0] == "Ingress"
    assert component_peers(rule_for(policy, SERVED_PORT.get(component, "grpc"))) == CALLERS[component]


def test_the_callers_pods_carry_the_labels_the_policies_select(docs):
    pod_labels = [doc["spec"]["template"]["metadata"]["labels"] for doc, _ in workloads(docs) if "template" in doc["spec"]]
    pod_labels += [doc["metadata"]["labels"] for doc in of_kind(docs, "Pod")]
    rendered = {labels["app.kubernetes.io/component"] for labels in pod_labels}
    for component in set().union(*CALLERS.values()) & rendered:
        peer = {"app.kubernetes.io/name": "gearshift", "app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": component}
        assert any(peer.items() <= labels.items() for labels in pod_labels), component


def test_training_jobs_pods_carry_the_training_label(docs):
    template = named(docs, "ConfigMap", name("training-job"))
    assert template is not None and "app.kubernetes.io/component: training" in json.dumps(template["data"]).replace('\\n', '\n')


@pytest.mark.parametrize("service", ["executor", "gateway"])
def test_every_client_a_service_opens_is_admitted(docs, service):
    code = (ROOT / "services" / service / "service.py").read_text()
    (called,) = re.findall(r"service_channel\(name, settings\) for name in \(([^)]*)\)", code)
    for callee in re.findall(r'"(\w+)"', called):
        assert service in component_peers(rule_for(named(docs, "NetworkPolicy", name(callee)), "grpc")), f"{service} -> {callee}"


@pytest.mark.parametrize("component", ["executor", "router", "planner", "reward", "store", "sandbox", "worker"])
def test_metrics_ports_admit_only_prometheus(component):
    assert rule_for(named(render(), "NetworkPolicy", name(component)), "metrics")["from"] == [MONITORING]
    narrowed = render((), ("networkPolicy.metricsPodSelector.matchLabels.app=prometheus",))
    assert rule_for(named(narrowed, "NetworkPolicy", name(component)), "metrics")["from"] == [
        MONITORING | {"podSelector": {"matchLabels": {"app": "prometheus"}}}]


def test_beat_admits_nothing_and_policies_go_with_their_switch(docs):
    assert named(docs, "NetworkPolicy", name("beat"))["spec"]["ingress"] == []
    off = render((), ("networkPolicy.enabled=false",))
    assert [p["metadata"]["name"] for p in of_kind(off, "NetworkPolicy")] == [name("sandbox")]  # the sandbox's is always on


DIGEST = "ab" * 32


def gateway_pod(docs) -> dict:
    return named(docs, "Deployment", name("gateway"))["spec"]["template"]["spec"]


def test_api_keys_are_mounted_from_a_secret_the_kubelet_updates():
    docs = render((), (f"gateway.apiKeys.keys.alice={DIGEST}",))
    secret = named(docs, "Secret", name("api-keys"))
    assert json.loads(secret["stringData"]["api-keys.json"]) == {"alice": DIGEST}
    pod = gateway_pod(docs)
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["GEARSHIFT_GATEWAY__API_KEYS_FILE"] == "/etc/gearshift/api-keys/api-keys.json"
    assert env["GEARSHIFT_GATEWAY__ACCEPT_PLATFORM_TOKEN"] == "false"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "api-keys"]
    assert "subPath" not in mount  # a subPath mount never sees the Secret change: a revoked key would stay
    assert {"name": "api-keys", "secret": {"secretName": name("api-keys")}} in pod["volumes"]


def test_an_existing_secret_replaces_the_charts_and_no_keys_keeps_the_platform_token():
    docs = render((), ("gateway.apiKeys.existingSecret=my-keys", "gateway.apiKeys.acceptPlatformToken=true"))
    assert named(docs, "Secret", name("api-keys")) is None
    env = {item["name"]: item.get("value") for item in gateway_pod(docs)["containers"][0]["env"]}
    assert env["GEARSHIFT_GATEWAY__ACCEPT_PLATFORM_TOKEN"] == "true"
    assert {"name": "api-keys", "secret": {"secretName": "my-keys"}} in gateway_pod(docs)["volumes"]
    plain = {item["name"] for item in gateway_pod(render())["containers"][0]["env"]}
    assert "GEARSHIFT_GATEWAY__API_KEYS_FILE" not in plain  # as before keys: the platform token is the client key


def test_a_key_given_in_clear_is_refused():
    with pytest.raises(HelmError, match="sha256|pattern"):
        render((), ("gateway.apiKeys.keys.alice=gsk-not-a-hash",))
