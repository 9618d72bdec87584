"""Serving that scales out and rolls over without losing work (issue 48), as the chart renders it:
headless Services that clients balance calls over, drains on stop, rollouts that never lower
capacity, one Celery beat, migrations as a Helm hook, and KEDA autoscaling on load validated
against KEDA's own CRD schema."""

from __future__ import annotations

import copy
import os
import subprocess
import time

import jsonschema
import pytest
import yaml
from gearshift.settings import Settings

from tests.charts.k8s import (
    CHART,
    COMPONENTS,
    GRPC_SERVICES,
    HTTP_SERVICES,
    RELEASE,
    HelmError,
    api_versions,
    component_of,
    named,
    of_kind,
    render,
    validate_strictly,
    workloads,
)

KEDA = "ci/keda-values.yaml"
KEDA_API = ("keda.sh/v1alpha1/ScaledObject",)
EXTERNAL_DB = ("postgresql.bundled=false", "postgresql.external.existingSecret=db", "postgresql.external.secretKey=url")
# Defaults of terminationGracePeriodSeconds: a gRPC call's deadline, an episode, a request, a
# worker's hand-back of its task, the beat's sync; the policy keeps its own.
GRACE = {"router": 150, "planner": 150, "reward": 150, "sandbox": 150, "store": 150, "executor": 345, "gateway": 645,
         "worker": 300, "beat": 30, "policy": 120}


def name(component: str) -> str:
    return f"{RELEASE}-{component}"


def pod(docs, component: str) -> dict:
    return named(docs, "Deployment", name(component))["spec"]["template"]["spec"]


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


# ---------------------------------------------------------------- headless Services and addresses


@pytest.mark.parametrize("service", GRPC_SERVICES)
def test_every_grpc_service_has_a_headless_service_of_ready_pods_on_its_grpc_port(service):
    docs = render()
    headless = named(docs, "Service", f"{name(service)}-headless")
    assert headless is not None
    spec = headless["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is False
    assert spec["ports"] == [{"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}]
    deployment = named(docs, "Deployment", name(service))
    assert spec["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # The ClusterIP Service stays beside it (port-forwards, the metrics port the ServiceMonitor scrapes).
    plain = named(docs, "Service", name(service))
    assert "clusterIP" not in plain["spec"] and {p["name"] for p in plain["spec"]["ports"]} == {"grpc", "metrics"}


def test_the_gateway_is_http_and_keeps_only_its_clusterip_service():
    docs = render()
    assert HTTP_SERVICES == ("gateway",)
    assert named(docs, "Service", name("gateway")) is not None
    assert named(docs, "Service", f"{name('gateway')}-headless") is None
    headless = {doc["metadata"]["name"] for doc in of_kind(docs, "Service") if doc["spec"].get("clusterIP") == "None"}
    assert headless == {f"{name(s)}-headless" for s in GRPC_SERVICES}


@pytest.mark.parametrize("sets, namespace, domain", [((), RELEASE, "cluster.local"), (("clusterDomain=corp.internal",), RELEASE, "corp.internal")])
def test_in_cluster_clients_resolve_every_grpc_service_through_its_headless_dns_name(sets, namespace, domain):
    docs = render((), sets)
    expected = {f"GEARSHIFT_{s.upper()}_ADDR": f"dns:///{name(s)}-headless.{namespace}.svc.{domain}:50051" for s in GRPC_SERVICES}
    expected["GEARSHIFT_GATEWAY_ADDR"] = f"{name('gateway')}:8100"  # HTTP: host:port of its Service
    checked = 0
    for doc, spec in workloads(docs):
        for container in spec["containers"]:
            env = {key: item.get("value") for key, item in env_of(container).items()}
            addresses = {key: value for key, value in env.items() if key.endswith("_ADDR")}
            if addresses:
                assert addresses == expected, doc["metadata"]["name"]
                checked += 1
    assert checked >= len(COMPONENTS) - 1  # every platform pod but the policy's


def test_the_settings_read_the_headless_targets_as_grpc_targets(monkeypatch):
    """The router's pod environment as gearshift reads it: each address a dns:/// target (clients
    balance round_robin over what it resolves to)."""
    (container,) = pod(render(), "router")["containers"]
    for item in container["env"]:
        monkeypatch.setenv(item["name"], item.get("value", "from-a-secret"))
    settings = Settings()
    for service in GRPC_SERVICES:
        assert settings.address_of(service) == f"dns:///{name(service)}-headless.{RELEASE}.svc.cluster.local:50051"
    assert settings.address_of("gateway") == f"{name('gateway')}:8100"


# ---------------------------------------------------------------- drains and rollouts


@pytest.mark.parametrize("component", list(GRACE))
def test_each_component_has_its_own_termination_grace_period(component):
    docs = render()
    assert pod(docs, component)["terminationGracePeriodSeconds"] == GRACE[component]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values[component]["terminationGracePeriodSeconds"] == GRACE[component]


@pytest.mark.parametrize("component", [*GRPC_SERVICES, *HTTP_SERVICES, "policy"])
def test_a_stopping_service_pod_leaves_the_endpoints_then_drains_what_the_grace_leaves(component):
    (container,) = pod(render(), component)["containers"]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert env_of(container)["GEARSHIFT_GRACE_SECONDS"]["value"] == str(GRACE[component] - 5 - 5)
    (changed,) = pod(render((), (f"{component}.terminationGracePeriodSeconds=100", "preStopSeconds=8")), component)["containers"]
    assert changed["lifecycle"] == {"preStop": {"sleep": {"seconds": 8}}}
    assert env_of(changed)["GEARSHIFT_GRACE_SECONDS"]["value"] == "87"


def test_a_grace_seconds_setting_of_ones_own_wins_and_is_set_once():
    for sets in (("env.GEARSHIFT_GRACE_SECONDS=42",), ("executor.env.GEARSHIFT_GRACE_SECONDS=42",)):
        (container,) = pod(render((), sets), "executor")["containers"]
        assert [item["value"] for item in container["env"] if item["name"] == "GEARSHIFT_GRACE_SECONDS"] == ["42"]


def test_the_worker_and_beat_have_no_endpoints_to_leave():
    docs = render()
    for component in ("worker", "beat"):
        (container,) = pod(docs, component)["containers"]
        assert "lifecycle" not in container and "GEARSHIFT_GRACE_SECONDS" not in env_of(container)


def test_vllm_keeps_its_drain_script_with_the_charts_pause():
    (vllm,) = pod(render(("values-gpu.yaml",), ("preStopSeconds=9",)), "policy")["containers"]
    assert vllm["lifecycle"]["preStop"]["exec"]["command"][-2:] == ["8000", "9"]
    assert "GEARSHIFT_GRACE_SECONDS" not in env_of(vllm)


@pytest.mark.parametrize("values_files", [(), ("values-gpu.yaml",), ("values-production.yaml",)])
def test_platform_deployments_roll_without_lowering_capacity(values_files):
    docs = render(values_files)
    vllm = bool(values_files) and values_files[0] == "values-gpu.yaml"
    for deployment in of_kind(docs, "Deployment"):
        component = component_of(deployment)
        strategy = deployment["spec"]["strategy"]
        if component == "beat":
            assert strategy == {"type": "Recreate"}  # two beats would send every task twice
        elif component == "policy" and vllm:
            assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}  # no spare GPU
        else:
            assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}, component


# ---------------------------------------------------------------- pod placement extras


def test_pod_annotations_priority_class_and_topology_spread_reach_the_pod_template():
    docs = render((KEDA,), (), KEDA_API)
    template = named(docs, "Deployment", name("executor"))["spec"]["template"]
    assert template["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    spec = template["spec"]
    assert spec["priorityClassName"] == "gearshift-serving"
    (constraint,) = spec["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
    # None given: the component's own pods.
    assert constraint["labelSelector"] == {"matchLabels": named(docs, "Deployment", name("executor"))["spec"]["selector"]["matchLabels"]}
    given = {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"team": "a"}}}
    docs = render((), ("router.topologySpreadConstraints[0].maxSkew=2", "router.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
                       "router.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
                       "router.topologySpreadConstraints[0].labelSelector.matchLabels.team=a"))
    assert pod(docs, "router")["topologySpreadConstraints"] == [given]
    plain = pod(render(), "router")
    assert not {"priorityClassName", "topologySpreadConstraints"} & set(plain)
    assert "annotations" not in named(render(), "Deployment", name("router"))["spec"]["template"]["metadata"]


# ---------------------------------------------------------------- Celery beat


def test_beat_is_one_replica_of_celery_beat_with_the_workers_environment():
    docs = render()
    deployment = named(docs, "Deployment", name("beat"))
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["celery", "-A", "gearshift.orchestration.app", "beat", "--loglevel", "INFO",
                                    "--schedule", "/tmp/celerybeat-schedule"]
    assert container["image"].startswith("gearshift-worker:")
    env = env_of(container)
    assert env["GEARSHIFT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == name("postgresql")
    assert env["GEARSHIFT_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == name("redis")
    (worker,) = pod(docs, "worker")["containers"]
    assert worker["command"] == ["celery", "-A", "gearshift.orchestration.app", "worker", "--queues", "default,training",
                                 "--concurrency", "2", "--loglevel", "INFO"]  # unchanged
    for doc in docs:
        if component_of(doc) == "beat":
            assert doc["kind"] in ("Deployment", "ServiceAccount", "NetworkPolicy"), doc["kind"]  # no Service, HPA, PDB


@pytest.mark.parametrize("sets", [("beat.enabled=false",), ("worker.enabled=false",)])
def test_beat_runs_only_beside_the_charts_worker_and_when_enabled(sets):
    assert named(render((), sets), "Deployment", name("beat")) is None


@pytest.mark.parametrize("sets, message", [
    (("beat.replicaCount=2",), "/beat/replicaCount"),
    (("beat.autoscaling.enabled=true",), "/beat/autoscaling/enabled"),
    (("beat.serviceMonitor.enabled=true",), "/beat/serviceMonitor/enabled"),
])
def test_a_second_beat_is_refused(sets, message):
    with pytest.raises(HelmError, match=message):
        render((), sets)


def beat_probe(directory) -> list[str]:
    (container,) = pod(render(), "beat")["containers"]
    assert container["livenessProbe"]["exec"] == container["readinessProbe"]["exec"] == container["startupProbe"]["exec"]
    shell, flag, script = container["livenessProbe"]["exec"]["command"]
    assert "/tmp " in script
    return [shell, flag, script.replace("/tmp ", f"{directory} ")]


@pytest.mark.parametrize("backend_files", [["celerybeat-schedule"], ["celerybeat-schedule.dat", "celerybeat-schedule.dir"]])
def test_the_beat_probe_passes_on_a_fresh_schedule_file_and_fails_on_a_stale_or_missing_one(tmp_path, backend_files):
    probe = beat_probe(tmp_path)
    assert subprocess.run(probe).returncode != 0  # not started
    for file in backend_files:
        (tmp_path / file).write_bytes(b"")
    assert subprocess.run(probe).returncode == 0
    stale = time.time() - 16 * 60
    for file in backend_files:
        os.utime(tmp_path / file, (stale, stale))
    assert subprocess.run(probe).returncode != 0  # beat stopped ticking


# ---------------------------------------------------------------- migrations as a hook


def migration(docs) -> dict:
    return named(docs, "Job", name("store-migrate"))


def test_migrations_run_in_a_hook_job_in_the_stores_image_with_its_database_url():
    docs = render(("ci/production-values.yaml",), ("store.env.GEARSHIFT_STORE__DB_THREADS=4",))
    job = migration(docs)
    annotations = job["metadata"]["annotations"]
    assert annotations == {"helm.sh/hook": "pre-install,pre-upgrade", "helm.sh/hook-weight": "-5",
                           "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
    assert job["spec"]["backoffLimit"] == 3 and job["spec"]["activeDeadlineSeconds"] == 900
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (store,) = pod(docs, "store")["containers"]
    assert container["command"] == ["gearshift", "migrate"]
    assert container["image"] == store["image"] and container["resources"] == store["resources"]
    assert container["securityContext"] == store["securityContext"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec  # the store's account does not exist yet at pre-install
    assert component_of(job) != "store"  # its pod joins neither the store's Service nor its PDB
    env = env_of(container)
    assert env["GEARSHIFT_STORE__DB_THREADS"]["value"] == "4"
    # Every pod that opens the database skips its own migration (and only checks the schema).
    for component in ("store", "worker", "beat"):
        (container,) = pod(docs, component)["containers"]
        assert env_of(container)["GEARSHIFT_STORE__MIGRATE_ON_START"]["value"] == "false", component
    (api,) = pod(docs, "router")["containers"]
    assert "GEARSHIFT_STORE__MIGRATE_ON_START" not in env_of(api)


def test_the_sandbox_advertises_its_pods_own_address_for_sessions():
    (container,) = pod(render(), "sandbox")["containers"]
    env = env_of(container)
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    names = [item["name"] for item in container["env"]]
    assert names.index("POD_IP") < names.index("GEARSHIFT_SANDBOX__ADVERTISE_ADDRESS")  # $(POD_IP) expands only then
    assert env["GEARSHIFT_SANDBOX__ADVERTISE_ADDRESS"]["value"] == "$(POD_IP):50051"


def test_a_url_given_in_values_reaches_the_pre_install_job_through_a_hook_secret_created_first():
    docs = render(("ci/production-values.yaml",))
    job = migration(docs)
    ref = env_of(job["spec"]["template"]["spec"]["containers"][0])["GEARSHIFT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    secret = named(docs, "Secret", ref["name"])
    assert secret["metadata"]["annotations"]["helm.sh/hook"] == job["metadata"]["annotations"]["helm.sh/hook"]
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    urls = named(docs, "Secret", name("external-urls"))
    assert "helm.sh/hook" not in urls["metadata"].get("annotations", {})  # the store's own Secret stays a release object
    assert secret["stringData"][ref["key"]] == urls["stringData"]["database-url"]


def test_an_existing_database_secret_is_read_by_the_job_as_by_the_store():
    docs = render((), EXTERNAL_DB + ("redis.bundled=false", "redis.external.existingSecret=r"))
    job = migration(docs)
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    job_ref = env_of(job["spec"]["template"]["spec"]["containers"][0])["GEARSHIFT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    store_ref = env_of(pod(docs, "store")["containers"][0])["GEARSHIFT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert job_ref == store_ref == {"name": "db", "key": "url"}
    assert not [doc for doc in of_kind(docs, "Secret") if "helm.sh/hook" in doc["metadata"].get("annotations", {})]


def test_with_the_bundled_postgres_the_job_migrates_upgrades_and_the_store_the_first_schema():
    """No database exists before the install; a post-install Job would deadlock `helm install
    --wait` (store pods that do not migrate never get ready on an empty database)."""
    docs = render()
    job = migration(docs)
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    ref = env_of(job["spec"]["template"]["spec"]["containers"][0])["GEARSHIFT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": name("postgresql"), "key": "database-url"}
    assert "GEARSHIFT_STORE__MIGRATE_ON_START" not in env_of(pod(docs, "store")["containers"][0])


@pytest.mark.parametrize("sets", [("store.migrations.enabled=false",), ("store.enabled=false",)])
def test_without_the_hook_the_store_migrates_at_start_up(sets):
    docs = render(("ci/production-values.yaml",), sets)
    assert migration(docs) is None and not [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == name("store-migrate")]
    store = named(docs, "Deployment", name("store"))
    if store:
        assert "GEARSHIFT_STORE__MIGRATE_ON_START" not in env_of(store["spec"]["template"]["spec"]["containers"][0])


def test_the_stores_pods_read_the_hooks_setting_as_migrate_on_start_off(monkeypatch):
    (store,) = pod(render(("ci/production-values.yaml",)), "store")["containers"]
    for item in store["env"]:
        monkeypatch.setenv(item["name"], item.get("value", "postgresql+psycopg://u:p@db/x"))
    assert Settings().store.migrate_on_start is False


def test_the_migration_backoff_and_deadline_come_from_values():
    job = migration(render((), ("store.migrations.backoffLimit=0", "store.migrations.activeDeadlineSeconds=60")))
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 60


# ---------------------------------------------------------------- autoscaling: HPA and KEDA


def scaled_objects(docs) -> dict[str, dict]:
    return {component_of(doc): doc for doc in of_kind(docs, "ScaledObject")}


def test_the_keda_scenario_names_the_keda_api_for_its_cluster():
    assert api_versions((KEDA,)) == KEDA_API


def test_keda_scales_each_component_on_its_own_load_restricted_to_this_releases_pods():
    docs = render((KEDA,))
    objects = scaled_objects(docs)
    assert set(objects) == {"executor", "gateway", "sandbox", "worker", "policy"}
    queries = {
        "executor": f'sum(gearshift_executor_episodes_in_flight{{namespace="{RELEASE}",service="{name("executor")}"}})',
        "gateway": f'sum(gearshift_gateway_in_flight{{namespace="{RELEASE}",service="{name("gateway")}"}})',
        "sandbox": f'sum(sandbox_busy_workers{{namespace="{RELEASE}",service="{name("sandbox")}"}})',
        "policy": f'sum(vllm:num_requests_waiting{{namespace="{RELEASE}",service="{name("policy")}"}})',
    }
    thresholds = {"executor": "8", "gateway": "16", "sandbox": "12", "policy": "4"}
    for component, query in queries.items():
        spec = objects[component]["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name(component)}
        (trigger,) = spec["triggers"]
        assert trigger == {"type": "prometheus", "metricType": "AverageValue", "metadata": {
            "serverAddress": "http://prometheus-k8s.monitoring.svc:9090", "query": query, "threshold": thresholds[component]}}
        # The series carry the service label because the component's ServiceMonitor scrapes its Service.
        assert named(docs, "ServiceMonitor", name(component)) is not None
        assert named(docs, "HorizontalPodAutoscaler", name(component)) is None
        assert "replicas" not in named(docs, "Deployment", name(component))["spec"]
    assert (objects["executor"]["spec"]["minReplicaCount"], objects["executor"]["spec"]["maxReplicaCount"]) == (2, 20)
    # The router has no load metric: it keeps the CPU HPA, with its behavior.
    router = named(docs, "HorizontalPodAutoscaler", name("router"))
    assert router["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 120}}


def test_the_worker_scales_on_the_training_queue_read_from_the_bundled_redis():
    docs = render((KEDA,))
    (trigger,) = scaled_objects(docs)["worker"]["spec"]["triggers"]
    assert trigger == {"type": "redis", "metadata": {
        "address": f"{name('redis')}.{RELEASE}.svc.cluster.local:6379", "listName": "training", "listLength": "2", "databaseIndex": "0"},
        "authenticationRef": {"name": name("worker")}}
    auth = named(docs, "TriggerAuthentication", name("worker"))
    assert auth["spec"] == {"secretTargetRef": [{"parameter": "password", "name": name("redis"), "key": "password"}]}
    password = named(docs, "StatefulSet", name("redis"))["spec"]["template"]["spec"]["containers"][0]
    assert env_of(password)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": name("redis"), "key": "password"}
    # The KEDA operator may reach Redis; without KEDA only the platform pods may.
    rules = named(docs, "NetworkPolicy", name("redis"))["spec"]["ingress"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in rules[-1]["from"]
    assert len(named(render(), "NetworkPolicy", name("redis"))["spec"]["ingress"]) == 1


def test_with_an_external_redis_the_worker_scales_on_the_queue_gauge():
    docs = render((KEDA,), ("redis.bundled=false", "redis.external.existingSecret=r"))
    (trigger,) = scaled_objects(docs)["worker"]["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    # Every worker reports the queue's one length: the largest, not the sum.
    assert trigger["metadata"]["query"] == (
        f'max(gearshift_celery_queue_length{{namespace="{RELEASE}",service="{name("worker")}",queue="training"}})')
    assert trigger["metadata"]["threshold"] == "2"
    assert not of_kind(docs, "TriggerAuthentication")


def test_the_worker_serves_its_queue_gauge_on_the_metrics_port_for_a_service_monitor():
    docs = render((), ("worker.serviceMonitor.enabled=true",))
    (container,) = pod(docs, "worker")["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert env_of(container)["GEARSHIFT_ORCHESTRATION__METRICS_PORT"]["value"] == "9090"
    service = named(docs, "Service", name("worker"))
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    monitor = named(docs, "ServiceMonitor", name("worker"))
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_builtin_policy_scales_on_its_generations_in_flight():
    sets = ("policy.autoscaling.enabled=true", "policy.autoscaling.keda.enabled=true", "policy.serviceMonitor.enabled=true")
    (trigger,) = scaled_objects(render((), sets, KEDA_API))["policy"]["spec"]["triggers"]
    assert trigger["metadata"]["query"] == f'sum(gearshift_policy_in_flight{{namespace="{RELEASE}",service="{name("policy")}"}})'


def test_behavior_reaches_the_hpa_and_kedas_hpa_alike():
    behavior = yaml.safe_load((CHART / KEDA).read_text())["executor"]["autoscaling"]["behavior"]
    keda = scaled_objects(render((KEDA,)))["executor"]["spec"]
    assert keda["advanced"] == {"horizontalPodAutoscalerConfig": {"behavior": behavior}}
    hpa = named(render((KEDA,), (), ()), "HorizontalPodAutoscaler", name("executor"))
    assert hpa["spec"]["behavior"] == behavior
    assert "behavior" not in named(render(("ci/production-values.yaml",)), "HorizontalPodAutoscaler", name("executor"))["spec"]


def test_without_kedas_api_in_the_cluster_the_hpa_stands_in():
    docs = render((KEDA,), (), ())
    assert not of_kind(docs, "ScaledObject") and not of_kind(docs, "TriggerAuthentication")
    hpas = {doc["spec"]["scaleTargetRef"]["name"] for doc in of_kind(docs, "HorizontalPodAutoscaler")}
    assert {name(c) for c in ("executor", "gateway", "sandbox", "worker", "policy", "router")} <= hpas
    assert len(named(docs, "NetworkPolicy", name("redis"))["spec"]["ingress"]) == 1


@pytest.mark.parametrize("sets, message", [
    (("executor.autoscaling.keda.enabled=true", "executor.serviceMonitor.enabled=true"), "executor.autoscaling.keda.enabled needs executor.autoscaling.enabled"),
    (("router.autoscaling.enabled=true", "router.autoscaling.keda.enabled=true", "router.serviceMonitor.enabled=true"), "the router has no load metric"),
    (("executor.autoscaling.enabled=true", "executor.autoscaling.keda.enabled=true"), "which Prometheus has only with executor.serviceMonitor.enabled"),
    (("executor.autoscaling.enabled=true", "executor.autoscaling.keda.enabled=true", "executor.serviceMonitor.enabled=true",
      "executor.autoscaling.keda.threshold=null"), "executor.autoscaling.keda needs a threshold"),
    (("executor.autoscaling.keda.threshold=0",), "/executor/autoscaling/keda/threshold"),
    (("executor.autoscaling.behavior.scaleUpp.policies=x",), "scaleUpp"),
])
def test_keda_settings_that_cannot_work_are_refused(sets, message):
    with pytest.raises(HelmError, match=message):
        render((), sets, KEDA_API)


def test_rendered_scaled_objects_validate_against_kedas_crd_and_a_broken_one_fails():
    docs = render((KEDA,))
    scaled = scaled_objects(docs)["executor"]
    validate_strictly(scaled)
    validate_strictly(named(docs, "TriggerAuthentication", name("worker")))
    breakages = [
        lambda d: d["spec"].update(minReplicas=2),  # the HPA's name for minReplicaCount
        lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=8),  # trigger metadata are strings
        lambda d: d["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"].update(stabilizationWindow=0),
        lambda d: d["spec"]["scaleTargetRef"].pop("name"),
        lambda d: d.update(apiVersion="keda.sh/v1beta1"),
    ]
    for breaking in breakages:
        broken = copy.deepcopy(scaled)
        breaking(broken)
        with pytest.raises(jsonschema.ValidationError):
            validate_strictly(broken)
    auth = copy.deepcopy(named(docs, "TriggerAuthentication", name("worker")))
    auth["spec"]["secretTargetRef"][0]["secret"] = auth["spec"]["secretTargetRef"][0].pop("name")
    with pytest.raises(jsonschema.ValidationError):
        validate_strictly(auth)
