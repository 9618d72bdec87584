"""The gearshift Helm chart, rendered by the real helm binary over the values matrix, against the
invariants operators rely on: valid Kubernetes 1.35 objects, restricted pod security, probes and
resources everywhere, the sandbox fenced in, PDBs only where they can hold, secrets never inline."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml
from gearshift.services.sandbox.isolation import seccomp
from gearshift.topology import SERVICES

from tests.charts.k8s import (
    CHART,
    COMPONENTS,
    GRPC_SERVICES,
    KUBE_VERSION,
    RELEASE,
    HelmError,
    component_of,
    containers,
    helm,
    named,
    of_kind,
    render,
    scenarios,
    split_image,
    workloads,
)

SCENARIOS = scenarios()
SERVICE_MONITOR_SCHEMA = json.loads((CHART.parent.parent / "tests/charts/servicemonitor.schema.json").read_text())
COMMON_KEYS = {
    "enabled", "image", "replicaCount", "resources", "autoscaling", "pdb", "serviceMonitor",
    "securityContext", "nodeSelector", "tolerations", "affinity", "env", "envFromSecret",
}


def matrix():
    return pytest.mark.parametrize("scenario", list(SCENARIOS))


def rendered(scenario: str):
    return render(SCENARIOS[scenario])


def name(component: str) -> str:
    return f"{RELEASE}-{component}"


def test_matrix_is_not_trivial():
    assert len(SCENARIOS) >= 8
    assert {"ci/defaults-values.yaml", "values-cpu.yaml", "values-gpu.yaml", "values-production.yaml"} <= set(SCENARIOS)


@matrix()
def test_helm_lint_strict_passes(scenario):
    args = [arg for f in SCENARIOS[scenario] for arg in ("-f", str(CHART / f))]
    result = helm("lint", "--strict", str(CHART), *args)
    assert result.returncode == 0, result.stdout + result.stderr


_valid: set[str] = set()  # objects already validated: most are the same in every scenario


@matrix()
def test_every_object_validates_strictly_against_kubernetes(scenario):
    docs = rendered(scenario)
    assert docs
    for doc in docs:
        key = json.dumps(doc, sort_keys=True)
        if key in _valid:
            continue
        if doc["kind"] == "ServiceMonitor":  # a CRD: kubernetes-validate has no schema for it
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        _valid.add(key)


@matrix()
def test_no_container_runs_as_root_and_pods_meet_the_restricted_profile(scenario):
    checked = 0
    for doc, spec in workloads(rendered(scenario)):
        pod = spec.get("securityContext", {})
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), doc["metadata"]["name"]
        assert not any("hostPath" in volume for volume in spec.get("volumes", [])), doc["metadata"]["name"]
        for container in containers(spec):
            own = container.get("securityContext", {})
            where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            assert own.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, where
            assert own.get("runAsUser", pod.get("runAsUser", 1)) != 0, where
            assert own.get("allowPrivilegeEscalation") is False, where
            assert not own.get("privileged"), where
            assert own.get("readOnlyRootFilesystem") is True, where
            assert own.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not own.get("capabilities", {}).get("add"), where
            seccomp = own.get("seccompProfile", pod.get("seccompProfile", {}))
            assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), where
            checked += 1
    assert checked


@matrix()
def test_every_deployment_has_probes_and_resources(scenario):
    deployments = of_kind(rendered(scenario), "Deployment")
    assert deployments
    for deployment in deployments:
        for container in containers(deployment["spec"]["template"]["spec"]):
            where = f"{deployment['metadata']['name']}/{container['name']}"
            assert "livenessProbe" in container and "readinessProbe" in container, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"].get(kind, {})), f"{where} {kind}"


@matrix()
def test_grpc_services_use_native_grpc_probes_on_the_grpc_port(scenario):
    docs = rendered(scenario)
    for service in GRPC_SERVICES:
        deployment = named(docs, "Deployment", name(service))
        if deployment is None:
            continue
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["grpc"]["port"] == grpc_port, f"{service} {probe}"
            assert "service" not in container[probe]["grpc"]  # "" = the server's overall health
        assert container["command"] == ["gearshift", "serve", service]
        ports = {p["name"]: p for p in named(docs, "Service", name(service))["spec"]["ports"]}
        assert ports["grpc"]["appProtocol"] == "grpc" and "metrics" in ports


@matrix()
def test_sandbox_accepts_only_the_executor_and_has_no_egress_beyond_the_allowlist(scenario):
    docs = rendered(scenario)
    if named(docs, "Deployment", name("sandbox")) is None:
        pytest.skip("sandbox disabled in this scenario")
    policy = named(docs, "NetworkPolicy", name("sandbox"))
    assert policy is not None, "the sandbox must always have its NetworkPolicy"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "sandbox"
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    allowlist = yaml.safe_load((CHART / SCENARIOS[scenario][-1]).read_text()).get("sandbox", {}).get("egressAllowlist", [])
    assert spec["egress"] == allowlist
    grpc_rule, metrics_rule = spec["ingress"]
    sources = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in grpc_rule["from"]}
    assert sources == {"executor", "health-check"}
    assert all(set(peer) == {"podSelector"} for peer in grpc_rule["from"])  # same namespace only
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_sandbox_egress_is_empty_by_default_and_the_allowlist_is_rendered_verbatim():
    default = named(render(), "NetworkPolicy", name("sandbox"))["spec"]
    assert default["egress"] == []
    allowed = named(render(("ci/production-values.yaml",)), "NetworkPolicy", name("sandbox"))["spec"]
    assert allowed["egress"] == [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 443, "protocol": "TCP"}]}]


def test_sandbox_runs_under_the_charts_own_seccomp_profile_which_is_fresh():
    docs = render()
    (container,) = named(docs, "Deployment", name("sandbox"))["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["seccompProfile"] == {"type": "Localhost", "localhostProfile": "gearshift/sandbox-seccomp.json"}
    (router,) = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"]
    assert router["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    profile = json.loads((CHART / "files" / "sandbox-seccomp.json").read_text())
    assert profile == seccomp.pod_profile(), (
        "stale: .venv/bin/python -m gearshift.services.sandbox.isolation.seccomp > charts/gearshift/files/sandbox-seccomp.json")
    (rule,) = profile["syscalls"]
    assert rule["action"] == "SCMP_ACT_ERRNO" and profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert {"unshare", "mount", "umount2", "pivot_root"}.isdisjoint(rule["names"])  # what builds each call's namespaces
    assert {"ptrace", "setns", "bpf", "perf_event_open", "keyctl", "kexec_load", "init_module", "io_uring_setup"} <= set(rule["names"])


def test_sandbox_pod_gets_its_own_user_namespace_when_asked():
    spec = named(render(), "Deployment", name("sandbox"))["spec"]["template"]["spec"]
    assert "hostUsers" not in spec
    docs = render((), ("sandbox.hostUsers=false",))
    spec = named(docs, "Deployment", name("sandbox"))["spec"]["template"]["spec"]
    assert spec["hostUsers"] is False
    assert "hostUsers" not in named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]
    kubernetes_validate.validate(named(docs, "Deployment", name("sandbox")), KUBE_VERSION, strict=True)


def test_store_accepts_only_platform_pods_of_this_release():
    spec = named(render(), "NetworkPolicy", name("store"))["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    grpc_rule = spec["ingress"][0]
    assert grpc_rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/part-of": "gearshift"}}}
    ]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]


@pytest.mark.parametrize(
    "sets, expected",
    [
        ((), False),
        (("router.replicaCount=2",), True),
        (("router.autoscaling.enabled=true", "router.replicaCount=1"), True),
        (("router.replicaCount=3", "router.pdb.enabled=false"), False),
        (("router.autoscaling.enabled=true", "router.pdb.enabled=false"), False),
        (("router.replicaCount=0",), False),
    ],
)
def test_pdb_only_when_replicas_above_one_or_autoscaling(sets, expected):
    docs = render((), sets)
    assert (named(docs, "PodDisruptionBudget", name("router")) is not None) is expected


def test_pdb_min_available_wins_over_the_default_max_unavailable():
    pdb = named(render((), ("router.replicaCount=3", "router.pdb.minAvailable=2")), "PodDisruptionBudget", name("router"))
    assert pdb["spec"] == {
        "minAvailable": 2,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "gearshift", "app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "router"}},
    }


@matrix()
def test_pdbs_guard_only_deployments_that_can_keep_a_pod_up(scenario):
    docs = rendered(scenario)
    scaled = {hpa["spec"]["scaleTargetRef"]["name"] for hpa in of_kind(docs, "HorizontalPodAutoscaler")}
    for pdb in of_kind(docs, "PodDisruptionBudget"):
        deployment = named(docs, "Deployment", pdb["metadata"]["name"])
        assert deployment["metadata"]["name"] in scaled or deployment["spec"]["replicas"] > 1


@matrix()
def test_autoscaled_deployments_leave_replicas_to_the_hpa(scenario):
    docs = rendered(scenario)
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        deployment = named(docs, "Deployment", hpa["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in deployment["spec"]
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        assert hpa["spec"]["metrics"]


@matrix()
def test_secrets_reach_pods_only_through_secret_references(scenario):
    docs = rendered(scenario)
    for _, spec in workloads(docs):
        for container in containers(spec):
            env = {item["name"]: item for item in container.get("env", [])}
            for secret in ("GEARSHIFT_AUTH_TOKEN", "GEARSHIFT_DATABASE_URL", "GEARSHIFT_REDIS_URL", "POSTGRES_PASSWORD"):
                if secret in env:
                    assert "secretKeyRef" in env[secret]["valueFrom"], f"{container['name']} {secret}"
    for service in GRPC_SERVICES:
        deployment = named(docs, "Deployment", name(service))
        if deployment:
            env = {item["name"] for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert "GEARSHIFT_AUTH_TOKEN" in env
            assert {f"GEARSHIFT_{spec.address_setting.upper()}" for spec in SERVICES} <= env  # the services table's settings
            assert ("GEARSHIFT_DATABASE_URL" in env) is (service == "store")


def test_token_secret_is_generated_unless_an_existing_one_is_named():
    secret = named(render(), "Secret", name("auth"))
    assert len(secret["data"]["token"]) > 40
    docs = render((), ("auth.existingSecret=my-token",))
    assert named(docs, "Secret", name("auth")) is None
    router = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"][0]
    token = next(item for item in router["env"] if item["name"] == "GEARSHIFT_AUTH_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == "my-token"


def test_bundled_databases_are_single_replica_statefulsets_and_external_ones_come_from_secrets():
    bundled = render()
    for db in ("postgresql", "redis"):
        statefulset = named(bundled, "StatefulSet", name(db))
        assert statefulset["spec"]["replicas"] == 1
        assert statefulset["spec"]["volumeClaimTemplates"]
    external = render(("ci/production-values.yaml",))
    assert not of_kind(external, "StatefulSet")
    urls = named(external, "Secret", name("external-urls"))["stringData"]
    assert urls["database-url"].startswith("postgresql+psycopg://") and urls["redis-url"].startswith("redis://")
    with pytest.raises(HelmError, match="postgresql.external.existingSecret or postgresql.external.url"):
        render((), ("postgresql.bundled=false",))


def test_vllm_policy_runs_on_gpu_nodes_with_configurable_parsers_and_weights_from_a_pvc():
    docs = render(("values-gpu.yaml", "values-agents-a1.yaml"))
    deployment = named(docs, "Deployment", name("policy"))
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    args = container["args"]
    pairs = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert "--enable-auto-tool-choice" in args
    assert pairs["--tool-call-parser"] == "qwen3_coder" and pairs["--reasoning-parser"] == "qwen3"
    assert pairs["--served-model-name"] == "agents-a1" and pairs["--tensor-parallel-size"] == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    weights = next(v for v in spec["volumes"] if v["name"] == "weights")
    assert weights["persistentVolumeClaim"] == {"claimName": "agents-a1-weights", "readOnly": True}
    assert not {e["name"] for e in container["env"]} & {"GEARSHIFT_AUTH_TOKEN", "GEARSHIFT_REDIS_URL"}

    plain = render(("values-gpu.yaml",), ("policy.vllm.toolCallParser=", "policy.vllm.enableAutoToolChoice=false"))
    plain_args = named(plain, "Deployment", name("policy"))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--tool-call-parser", "--reasoning-parser", "--enable-auto-tool-choice"} & set(plain_args)
    router = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in router["env"]}
    assert env["GEARSHIFT_POLICY_CLIENT__URL"] == f"http://{name('policy')}:8000/v1" and env["GEARSHIFT_POLICY_CLIENT__MODEL"] == "agents-a1"


@pytest.mark.parametrize(
    "sets, message",
    [
        (("policy.engine=vllm", "policy.vllm.weights.create=true"), "set policy.image to a vLLM"),
        (("policy.engine=vllm", "policy.image.repository=vllm/vllm-openai", "policy.image.tag=v0.33.0"), "reads weights from a PVC"),
        (("policy.vllm.enableAutoToolChoice=true", "policy.engine=vllm", "policy.image.repository=vllm/vllm-openai",
          "policy.image.tag=v0.33.0", "policy.vllm.weights.create=true"), "needs policy.vllm.toolCallParser"),
        (("worker.serviceMonitor.enabled=true",), "worker exposes no metrics port"),
        (("router.securityContext.runAsNonRoot=false",), "runAsNonRoot"),
        (("router.securityContext.allowPrivilegeEscalation=true",), "allowPrivilegeEscalation"),
        (("podSecurityContext.runAsUser=0",), "runAsUser"),
        (("router.replicas=2",), "additional properties 'replicas' not allowed"),
        (("policy.engine=sglang",), "engine"),
    ],
)
def test_values_that_would_break_the_platform_are_refused(sets, message):
    with pytest.raises(HelmError, match=message):
        render((), sets)


@pytest.mark.parametrize("values", ["ci/gpu-agents-a1-values.yaml", "ci/cpu-training-values.yaml"])
def test_every_rendered_training_config_is_valid_for_its_job(values):
    """Each Job's and CronJob's --config file validates as the job's own config class (the job
    would refuse it at start otherwise: output.dir is required, unknown keys are errors)."""
    from gearshift.training.jobs import BY_NAME

    docs = render((values,))
    runs = [(d, s) for d, s in workloads(docs) if d["kind"] in ("Job", "CronJob")]
    assert runs
    for _, spec in runs:
        container = spec["containers"][0]
        config_map = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "config")
        text = named(docs, "ConfigMap", config_map)["data"]["config.yaml"]
        config = BY_NAME[container["args"][0]].config_class().model_validate(yaml.safe_load(text))
        assert str(config.output.dir).startswith("/checkpoints/") and config.store_addr == f"{name('store')}:50051"


def test_training_jobs_and_cronjobs_mount_checkpoints_and_use_torchrun_for_several_gpus():
    docs = render(("ci/gpu-agents-a1-values.yaml",))
    (job,) = of_kind(docs, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["torchrun", "--standalone", "--nproc-per-node", "4"]
    assert container["args"] == ["distill", "--config", "/etc/gearshift/train/config.yaml"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    config = named(docs, "ConfigMap", f"{name('train-distill')}-config")
    assert yaml.safe_load(config["data"]["config.yaml"]) == {
        "teachers": {"math": "smollm2", "code": "smollm2", "search": "smollm2"},
        "optim": {"max_steps": 200},
        # Defaults every job needs: its checkpoint directory on the claim, and this release's store.
        "output": {"dir": "/checkpoints/distill"},
        "store_addr": f"{name('store')}:50051",
    }

    cpu = render(("ci/cpu-training-values.yaml",))
    (cron,) = of_kind(cpu, "CronJob")
    assert cron["spec"]["schedule"] == "0 3 * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    cron_container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert cron_container["command"] == ["gearshift", "train"] and cron_container["args"][0] == "apo"
    for _, spec in [(d, s) for d, s in workloads(cpu) if d["kind"] in ("Job", "CronJob")]:
        claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["shared-checkpoints"]


def train_container(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> tuple[dict, dict, dict]:
    """(container, its env as name -> value, the dshm volume) of the one training Job rendered."""
    docs = render(values_files, ("training.jobs[0].name=check", "training.jobs[0].algorithm=sft", *sets))
    (job,) = of_kind(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert len(env) == len(container["env"]), "no variable twice"
    return container, env, next(v for v in pod["volumes"] if v["name"] == "dshm")


NCCL_ENV = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


@pytest.mark.parametrize(
    "gpus, cpu, command, threads, shm",
    [
        ("0", "4", ["gearshift", "train"], "4", "2Gi"),
        ("1", "6", ["gearshift", "train"], "6", "2Gi"),
        ("2", "4", ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "gearshift.cli", "train"], "2", "4Gi"),
        ("2", "3000m", ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "gearshift.cli", "train"], "1", "4Gi"),
        ("0", "2500m", ["gearshift", "train"], "2", "2Gi"),
        ("4", "2", ["torchrun", "--standalone", "--nproc-per-node", "4", "-m", "gearshift.cli", "train"], "1", "8Gi"),
    ],
)
def test_training_pods_give_torchrun_its_threads_nccl_env_and_shared_memory(gpus, cpu, command, threads, shm):
    container, env, dshm = train_container((), (f"training.gpus={gpus}", f"training.resources.limits.cpu={cpu}"))
    assert container["command"] == command
    assert env["OMP_NUM_THREADS"] == threads
    assert {name: env.get(name) for name in NCCL_ENV} == (NCCL_ENV if gpus != "0" else dict.fromkeys(NCCL_ENV))
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}


def test_training_env_and_shm_size_win_over_the_defaults():
    sets = ("training.gpus=2", "training.env.OMP_NUM_THREADS=3", "training.env.NCCL_DEBUG=INFO", "training.shmSize=5Gi")
    _, env, dshm = train_container((), sets)
    assert env["OMP_NUM_THREADS"] == "3" and env["NCCL_DEBUG"] == "INFO" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert dshm["emptyDir"]["sizeLimit"] == "5Gi"


def test_gpu_values_run_the_cuda_training_image():
    container, env, dshm = train_container(("values-gpu.yaml",))
    assert split_image(container["image"])[0] == "gearshift-training-cuda" and container["command"] == ["gearshift", "train"]
    assert env["OMP_NUM_THREADS"] == "8" and env["NCCL_DEBUG"] == "WARN"
    assert dshm["emptyDir"]["sizeLimit"] == "16Gi"
    cpu_container, _, _ = train_container()
    assert split_image(cpu_container["image"])[0] == "gearshift-training"


def test_a_changed_training_run_gets_a_new_job_name_and_an_unchanged_one_keeps_it():
    base = ("ci/cpu-training-values.yaml",)
    first = of_kind(render(base), "Job")[0]["metadata"]["name"]
    assert of_kind(render(base), "Job")[0]["metadata"]["name"] == first
    changed = of_kind(render(base, ("training.jobs[0].config.epochs=3",)), "Job")[0]["metadata"]["name"]
    assert changed != first and changed.startswith(name("train-sft-bootstrap"))


def test_worker_may_manage_jobs_and_read_pod_logs_and_is_the_only_pod_with_an_api_token():
    docs = render()
    role = named(docs, "Role", name("worker"))
    rules = {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert {"create", "get", "list", "watch", "delete"} <= rules[("batch", "jobs")]
    assert "get" in rules[("", "pods/log")]
    binding = named(docs, "RoleBinding", name("worker"))
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name("worker"), "namespace": RELEASE}]
    for doc, spec in workloads(docs):
        assert spec.get("automountServiceAccountToken") is (component_of(doc) == "worker"), doc["metadata"]["name"]
    template = yaml.safe_load(named(docs, "ConfigMap", name("training-job"))["data"]["job.yaml"])
    kubernetes_validate.validate(template, KUBE_VERSION, strict=True)
    assert template["spec"]["ttlSecondsAfterFinished"] > 0


def test_helm_test_pod_checks_every_enabled_grpc_service():
    pod = named(render(), "Pod", name("health-check"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["args"] == [f"{s}={name(s)}:50051" for s in GRPC_SERVICES]
    fewer = named(render((), ("reward.enabled=false",)), "Pod", name("health-check"))
    assert "reward" not in " ".join(fewer["spec"]["containers"][0]["args"])


async def test_health_check_script_passes_on_a_serving_service_and_fails_on_a_dead_one(settings, unused_tcp_port):
    import asyncio

    from gearshift.server import running
    from gearshift.services.router.service import build

    script = str(CHART / "files" / "check-health.py")
    async with running(await build(settings), settings) as server:
        ok = await asyncio.create_subprocess_exec(
            sys.executable, script, "5", f"router=127.0.0.1:{server.port}", stdout=subprocess.PIPE
        )
        out, _ = await ok.communicate()
        assert ok.returncode == 0 and b"SERVING" in out
        down = await asyncio.create_subprocess_exec(
            sys.executable, script, "2", f"router=127.0.0.1:{server.port}", f"store=127.0.0.1:{unused_tcp_port}",
            stdout=subprocess.PIPE,
        )
        out, _ = await down.communicate()
        assert down.returncode == 1 and b"DOWN (UNAVAILABLE)" in out


def test_every_component_has_its_folder_and_identical_value_sub_keys():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    for component in COMPONENTS:
        assert (CHART / "templates" / component).is_dir(), component
        assert COMMON_KEYS <= set(values[component]), component
        properties = schema["properties"][component]
        properties = properties.get("properties") or schema["$defs"]["component"]["properties"]
        assert COMMON_KEYS <= set(properties), component


def test_every_component_template_goes_through_the_one_helper():
    for component in COMPONENTS:
        source = (CHART / "templates" / component / f"{component}.yaml").read_text()
        assert 'include "gearshift.grpcService"' in source or 'include "gearshift.component"' in source, component
        assert "kind: Deployment" not in source, component


def test_secret_settings_come_from_a_named_secret_and_both_policy_engines_are_scraped():
    docs = render(("ci/gpu-agents-a1-values.yaml",))
    policy = named(docs, "Deployment", name("policy"))["spec"]["template"]["spec"]["containers"][0]
    assert policy["envFrom"] == [{"secretRef": {"name": "vllm-api-key"}}]
    for scenario in (docs, render(("ci/production-values.yaml",))):  # vLLM, built-in
        monitor = named(scenario, "ServiceMonitor", name("policy"))
        assert monitor["spec"]["endpoints"][0] | {"port": "http", "path": "/metrics"} == monitor["spec"]["endpoints"][0]
    router = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"][0]
    assert "envFrom" not in router
