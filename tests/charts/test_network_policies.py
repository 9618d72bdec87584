"""The chart's NetworkPolicies as rendered: every platform workload is fenced, each component's
port admits exactly the callers the code has (and those callers' pods carry the labels the
policy selects), metrics ports only Prometheus, the sandbox's fenced egress reaches DNS, the
policy and the trace collector, the gateway's client API keys mounted from a Secret that the
kubelet can update in place, an exposed gateway refused without them, and the limits reach the pods."""

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
    "policy": {"executor", "router", "planner", "reward", "sandbox", "worker", "training"},
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


def test_every_service_that_calls_the_policy_is_admitted_by_it(docs):
    callers = {path.parent.name for path in (ROOT / "services").glob("*/*.py") if "gearshift.policy_client import PolicyClient" in path.read_text()}
    assert {"reward", "sandbox"} <= callers  # what the code says, not a list kept beside it
    assert callers <= component_peers(rule_for(named(docs, "NetworkPolicy", name("policy")), "http"))


def egress_to(policy: dict, port: int | str, protocol: str = "TCP") -> list[dict]:
    """The peers of the policy's egress rules that admit port."""
    return [peer for rule in policy["spec"]["egress"] if {"port": port, "protocol": protocol} in rule["ports"] for peer in rule["to"]]


DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}


def test_the_sandboxs_fenced_egress_reaches_dns_the_policy_and_with_tracing_the_collector(docs):
    sandbox = named(docs, "NetworkPolicy", name("sandbox"))
    assert "Egress" in sandbox["spec"]["policyTypes"]
    assert egress_to(sandbox, 53, "UDP") == egress_to(sandbox, 53, "TCP") == [DNS]
    (policy_peer,) = egress_to(sandbox, "http")
    assert policy_peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "policy"
    assert egress_to(sandbox, 4317) == []  # tracing off: no collector
    traced = named(render((), ("tracing.enabled=true", "tracing.otlpEndpoint=http://otel.observability.svc:4318")), "NetworkPolicy", name("sandbox"))
    assert egress_to(traced, 4318) == [MONITORING]
    allowed = {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 443, "protocol": "TCP"}]}
    listed = named(render((), ("sandbox.egressAllowlist[0].to[0].ipBlock.cidr=203.0.113.0/24", "sandbox.egressAllowlist[0].ports[0].port=443",
                               "sandbox.egressAllowlist[0].ports[0].protocol=TCP")), "NetworkPolicy", name("sandbox"))
    assert allowed in listed["spec"]["egress"] and egress_to(listed, 53, "UDP") == [DNS]


@pytest.mark.parametrize("exposed", [("gateway.ingress.enabled=true",), ("gateway.service.type=LoadBalancer",), ("gateway.service.type=NodePort",)])
def test_an_exposed_gateway_without_client_keys_is_refused_in_one_line(exposed):
    with pytest.raises(HelmError) as refused:
        render((), exposed)
    (line,) = [line for line in str(refused.value).splitlines() if line.startswith("Error:")]
    assert "without client keys" in line and "gateway.apiKeys" in line
    keyed = render((), (*exposed, f"gateway.apiKeys.keys.alice={DIGEST}"))
    expected = exposed[0].split("=")[1] if exposed[0].startswith("gateway.service.type") else "ClusterIP"
    assert named(keyed, "Service", name("gateway"))["spec"]["type"] == expected


def test_the_gateways_limits_reach_its_pod_and_every_service_is_bounded():
    docs = render((), ("gateway.limits.requestsPerSecond=5", "gateway.limits.perKey.batch.burst=100", "limits.maxConcurrentRpcs=50"))
    env = {item["name"]: item.get("value") for item in gateway_pod(docs)["containers"][0]["env"]}
    assert (env["GEARSHIFT_GATEWAY__RATE_PER_SECOND"], env["GEARSHIFT_GATEWAY__BURST"]) == ("5", "40")
    assert json.loads(env["GEARSHIFT_GATEWAY__KEY_POLICIES"]) == {"batch": {"burst": 100}}
    for component in ("executor", "store", "router", "sandbox"):
        (container,) = [c for c in named(docs, "Deployment", name(component))["spec"]["template"]["spec"]["containers"] if c["name"] == component]
        assert {"name": "GEARSHIFT_LIMITS__MAX_CONCURRENT_RPCS", "value": "50"} in container["env"], component


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
