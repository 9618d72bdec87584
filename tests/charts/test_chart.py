"""The gearshift Helm chart, rendered by the real helm binary over the values matrix, against the
invariants operators rely on: valid Kubernetes 1.35 objects, restricted pod security, probes and
resources everywhere, the sandbox fenced in, PDBs only where they can hold, secrets never inline."""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from gearshift.services.sandbox.isolation import seccomp
from gearshift.settings import Settings
from gearshift.topology import SERVICES

from tests.charts.k8s import (
    CHART,
    COMPONENTS,
    GRPC_SERVICES,
    HTTP_SERVICES,
    KUBE_VERSION,
    RELEASE,
    TRAINER_API,
    HelmError,
    api_versions,
    component_of,
    containers,
    helm,
    named,
    of_kind,
    render,
    scenarios,
    split_image,
    validate_strictly,
    validate_trainjob,
    workloads,
)

SCENARIOS = scenarios()
TRAINJOB = "ci/trainjob-values.yaml"
VLLM_REPLICAS = "ci/vllm-replicas-values.yaml"
GATEWAY_INGRESS = "ci/gateway-ingress-values.yaml"
COMMON_KEYS = {
    "enabled", "image", "replicaCount", "resources", "autoscaling", "pdb", "serviceMonitor",
    "securityContext", "nodeSelector", "tolerations", "affinity", "env", "envFromSecret",
    "terminationGracePeriodSeconds", "podAnnotations", "topologySpreadConstraints", "priorityClassName",
}


def matrix():
    return pytest.mark.parametrize("scenario", list(SCENARIOS))


def rendered(scenario: str):
    return render(SCENARIOS[scenario])


def name(component: str) -> str:
    return f"{RELEASE}-{component}"


def grpc_address(service: str) -> str:
    """Where the chart points in-cluster clients of a gRPC service: its headless Service's DNS name."""
    return f"dns:///{name(service)}-headless.{RELEASE}.svc.cluster.local:50051"


def training_jobs(docs) -> list[dict]:
    """The training runs' Jobs (not the store's migration hook)."""
    return [doc for doc in of_kind(docs, "Job") if component_of(doc) == "training"]


def test_matrix_is_not_trivial():
    assert len(SCENARIOS) >= 8
    assert {"ci/defaults-values.yaml", "values-cpu.yaml", "values-gpu.yaml", "values-production.yaml", TRAINJOB, VLLM_REPLICAS,
            GATEWAY_INGRESS} <= set(SCENARIOS)
    assert api_versions(SCENARIOS[TRAINJOB]) == (TRAINER_API,)


@matrix()
def test_helm_lint_strict_passes(scenario):
    args = [arg for f in SCENARIOS[scenario] for arg in ("-f", str(CHART / f))]
    result = helm("lint", "--strict", str(CHART), *args)
    assert result.returncode == 0, result.stdout + result.stderr


_valid: set[str] = set()  # objects already validated: most are the same in every scenario


@matrix()
def test_every_object_validates_strictly_against_kubernetes(scenario):
    """Built-in kinds against Kubernetes 1.35's schema, TrainJobs against Kubeflow Trainer's
    models, ServiceMonitors against theirs; a kind none of them knows fails (never skipped)."""
    docs = rendered(scenario)
    assert docs
    for doc in docs:
        key = json.dumps(doc, sort_keys=True)
        if key in _valid:
            continue
        validate_strictly(doc)
        _valid.add(key)
    if scenario == TRAINJOB:
        assert of_kind(docs, "TrainJob"), "the trainjob scenario renders TrainJobs"


def node_pod(trainjob: dict) -> dict:
    """The pod template of a TrainJob's runtime patch (the runtime's replicated job `node`)."""
    (patch,) = trainjob["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return node["template"]["spec"]["template"]


UNKNOWN = "not in the model"


@pytest.mark.parametrize(
    "breaking, message",
    [
        (lambda doc: doc["spec"]["trainer"].update(numNode=2), f"/spec/trainer/numNode: {UNKNOWN}"),  # numNodes misspelt
        (lambda doc: doc["spec"].update(ttlSecondsAfterFinished=60), f"/spec/ttlSecondsAfterFinished: {UNKNOWN}"),  # a Job's field
        (lambda doc: doc["spec"]["trainer"].update(numNodes="2"), "numNodes\n  Input should be a valid integer"),
        (lambda doc: node_pod(doc)["spec"].update(automountServiceAccountToken=False), f"automountServiceAccountToken: {UNKNOWN}"),
        (lambda doc: node_pod(doc)["spec"]["containers"][0].update(image="x"), f"containers/0/image: {UNKNOWN}"),
        (lambda doc: node_pod(doc)["spec"]["volumes"][0].update(emptyDirr={}), f"volumes/0/emptyDirr: {UNKNOWN}"),
        (lambda doc: node_pod(doc)["spec"]["nodeSelector"].update(zone=1), "Input should be a valid string"),
    ],
)
def test_an_unknown_or_misspelt_trainjob_field_fails_validation(breaking, message):
    (trainjob,) = of_kind(rendered(TRAINJOB), "TrainJob")
    validate_trainjob(trainjob)
    doc = json.loads(json.dumps(trainjob))
    breaking(doc)
    with pytest.raises(ValueError, match=message):
        validate_trainjob(doc)


def test_an_object_of_a_kind_without_a_schema_fails_validation():
    with pytest.raises(ValueError, match="no schema for example.com/v1 Widget"):
        validate_strictly({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


@matrix()
def test_no_container_runs_as_root_and_pods_meet_the_restricted_profile(scenario):
    checked = 0
    for doc, spec in workloads(rendered(scenario)):
        pod = spec.get("securityContext", {})
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), doc["metadata"]["name"]
        # The one hostPath: the node's seccomp directory, read by the sandbox's init container that
        # waits for its profile (read-only; tests/charts/test_sandbox_seccomp.py).
        host_paths = {volume["name"] for volume in spec.get("volumes", []) if "hostPath" in volume}
        assert host_paths <= ({"node-seccomp"} if doc["metadata"]["name"] == name("sandbox") else set()), doc["metadata"]["name"]
        for container in containers(spec):
            own = container.get("securityContext", {})
            where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            mounts = [mount for mount in container.get("volumeMounts", []) if mount["name"] in host_paths]
            assert all(container["name"] == "seccomp-wait" and mount.get("readOnly") for mount in mounts), where
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
        pod = deployment["spec"]["template"]["spec"]
        for container in containers(pod):
            where = f"{deployment['metadata']['name']}/{container['name']}"
            if container in pod["containers"]:  # an init container runs to completion: no probes
                assert "livenessProbe" in container and "readinessProbe" in container, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"].get(kind, {})), f"{where} {kind}"


@matrix()
def test_grpc_services_use_native_grpc_probes_on_the_grpc_port(scenario):
    """On the gRPC port, or with TLS on the plaintext health port (the kubelet speaks no TLS; test_tls.py)."""
    docs = rendered(scenario)
    for service in GRPC_SERVICES:
        deployment = named(docs, "Deployment", name(service))
        if deployment is None:
            continue
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probed = ports.get("grpc-health", ports["grpc"])
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["grpc"]["port"] == probed, f"{service} {probe}"
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
    # The platform's own rules first (DNS, the policy, the collector with tracing on: test_network_policies.py), then the allowlist.
    own = spec["egress"][:len(spec["egress"]) - len(allowlist)]
    assert spec["egress"][len(own):] == allowlist and 2 <= len(own) <= 3
    assert {"port": 53, "protocol": "UDP"} in own[0]["ports"] and own[-1]["ports"] == [{"port": "http", "protocol": "TCP"}]
    grpc_rule, metrics_rule = spec["ingress"]
    sources = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in grpc_rule["from"]}
    assert sources == {"executor", "health-check"}
    assert all(set(peer) == {"podSelector"} for peer in grpc_rule["from"])  # same namespace only
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_sandbox_egress_is_only_the_platforms_own_by_default_and_the_allowlist_is_rendered_verbatim():
    """DNS and the policy server by default (test_network_policies.py); the allowlist after them."""
    default = named(render(), "NetworkPolicy", name("sandbox"))["spec"]["egress"]
    assert all(peer.get("podSelector") for rule in default for peer in rule["to"])  # no address outside the cluster
    allowed = named(render(("ci/production-values.yaml",)), "NetworkPolicy", name("sandbox"))["spec"]["egress"]
    assert allowed == default + [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 443, "protocol": "TCP"}]}]


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


def autoscaled(docs) -> set[str]:
    """Deployments an HPA or a KEDA ScaledObject (which makes its own HPA) scales."""
    return {doc["spec"]["scaleTargetRef"]["name"] for doc in [*of_kind(docs, "HorizontalPodAutoscaler"), *of_kind(docs, "ScaledObject")]}


@matrix()
def test_pdbs_guard_only_deployments_that_can_keep_a_pod_up(scenario):
    docs = rendered(scenario)
    scaled = autoscaled(docs)
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
    for scaled in of_kind(docs, "ScaledObject"):
        deployment = named(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in deployment["spec"]
        assert named(docs, "HorizontalPodAutoscaler", deployment["metadata"]["name"]) is None, "KEDA makes its own HPA"
        assert scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
        assert scaled["spec"]["triggers"]


@matrix()
def test_secrets_reach_pods_only_through_secret_references(scenario):
    docs = rendered(scenario)
    for _, spec in workloads(docs):
        for container in containers(spec):
            env = {item["name"]: item for item in container.get("env", [])}
            for secret in ("GEARSHIFT_AUTH_TOKEN", "GEARSHIFT_DATABASE_URL", "GEARSHIFT_REDIS_URL", "POSTGRES_PASSWORD"):
                if secret in env:
                    assert "secretKeyRef" in env[secret]["valueFrom"], f"{container['name']} {secret}"
    for service in (*GRPC_SERVICES, *HTTP_SERVICES):
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
    assert "--enable-auto-tool-choice" in args and "--enable-expert-parallel" in args  # Agents-A1 is an MoE
    assert pairs["--tool-call-parser"] == "qwen3_coder" and pairs["--reasoning-parser"] == "qwen3"
    assert pairs["--served-model-name"] == "agents-a1" and pairs["--tensor-parallel-size"] == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    weights = next(v for v in spec["volumes"] if v["name"] == "weights")
    assert weights["persistentVolumeClaim"] == {"claimName": "agents-a1-weights", "readOnly": True}
    assert not {e["name"] for e in container["env"]} & {"GEARSHIFT_AUTH_TOKEN", "GEARSHIFT_REDIS_URL"}

    plain = render(("values-gpu.yaml",), ("policy.vllm.toolCallParser=", "policy.vllm.enableAutoToolChoice=false"))
    plain_args = named(plain, "Deployment", name("policy"))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--tool-call-parser", "--reasoning-parser", "--enable-auto-tool-choice", "--enable-expert-parallel"} & set(plain_args)
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
        (("router.securityContext.runAsNonRoot=false",), "runAsNonRoot"),
        (("router.securityContext.allowPrivilegeEscalation=true",), "allowPrivilegeEscalation"),
        (("podSecurityContext.runAsUser=0",), "runAsUser"),
        (("router.replicas=2",), "at '/router/replicas'"),  # an unknown key (unevaluatedProperties)
        (("policy.engine=sglang",), "engine"),
        (("policy.publishTarget=vllm_lora",), "vllm_lora loads LoRA adapters into vLLM: it needs policy.engine=vllm"),
        (("policy.engine=vllm", "policy.image.repository=vllm/vllm-openai", "policy.image.tag=v0.33.0", "policy.vllm.weights.create=true",
          "policy.publishTarget=builtin"), "with policy.engine=vllm use vllm_lora or deployment"),
        (("training.launcher=slurm",), "launcher"),
    ],
)
def test_values_that_would_break_the_platform_are_refused(sets, message):
    with pytest.raises(HelmError, match=message):
        render((), sets)


def training_runs(docs) -> list[tuple[list[str], list[dict]]]:
    """(the train command's args, the pod's volumes) of every Job, CronJob and TrainJob."""
    runs = [(s["containers"][0]["args"], s["volumes"]) for d, s in workloads(docs) if d["kind"] in ("Job", "CronJob") and component_of(d) == "training"]
    return runs + [(d["spec"]["trainer"]["args"], node_pod(d)["spec"]["volumes"]) for d in of_kind(docs, "TrainJob")]


@pytest.mark.parametrize("values", ["ci/gpu-agents-a1-values.yaml", "ci/cpu-training-values.yaml", TRAINJOB])
def test_every_rendered_training_config_is_valid_for_its_job(values):
    """Each Job's, CronJob's and TrainJob's --config file validates as the job's own config class
    (the job would refuse it at start otherwise: output.dir is required, unknown keys are errors)."""
    from gearshift.job_table import BY_NAME

    docs = render((values,))
    runs = training_runs(docs)
    assert runs
    for args, volumes in runs:
        config_map = next(v["configMap"]["name"] for v in volumes if v["name"] == "config")
        text = named(docs, "ConfigMap", config_map)["data"]["config.yaml"]
        config = BY_NAME[args[0]].config_class().model_validate(yaml.safe_load(text))
        assert str(config.output.dir).startswith("/checkpoints/") and config.store_addr == grpc_address("store")


def test_training_jobs_and_cronjobs_mount_checkpoints_and_use_torchrun_for_several_gpus():
    docs = render(("ci/gpu-agents-a1-values.yaml",))
    (job,) = training_jobs(docs)
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
        "store_addr": grpc_address("store"),
    }

    cpu = render(("ci/cpu-training-values.yaml",))
    (cron,) = of_kind(cpu, "CronJob")
    assert cron["spec"]["schedule"] == "0 3 * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    cron_container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert cron_container["command"] == ["gearshift", "train"] and cron_container["args"][0] == "apo"
    for _, spec in [(d, s) for d, s in workloads(cpu) if d["kind"] in ("Job", "CronJob") and component_of(d) == "training"]:
        claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["shared-checkpoints"]


def train_container(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> tuple[dict, dict, dict]:
    """(container, its env as name -> value, the dshm volume) of the one training Job rendered."""
    docs = render(values_files, ("training.jobs[0].name=check", "training.jobs[0].algorithm=sft", *sets))
    (job,) = training_jobs(docs)
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


def role_rules(docs) -> dict[tuple[str, str], set[str]]:
    """The worker Role's verbs per (API group, resource)."""
    role = named(docs, "Role", name("worker"))
    return {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}


def worker_env(docs) -> dict[str, str | None]:
    container = named(docs, "Deployment", name("worker"))["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value") for item in container["env"]}


def test_worker_may_manage_jobs_and_read_pod_logs_and_is_the_only_pod_with_an_api_token():
    docs = render()
    rules = role_rules(docs)
    assert {"create", "get", "list", "watch", "delete"} <= rules[("batch", "jobs")]
    assert {"get", "list"} <= rules[("", "pods")] and {"get", "list"} <= rules[("", "pods/log")]
    assert {"create", "get", "patch", "delete"} <= rules[("", "configmaps")]  # patch: the owner reference to the run
    assert ("trainer.kubeflow.org", "trainjobs") not in rules  # only with launcher trainjob
    # Publishing: every policy replica's address, and a rolling restart of the policy Deployment alone.
    assert {"get", "list"} <= rules[("discovery.k8s.io", "endpointslices")]
    assert {"get", "patch"} <= rules[("apps", "deployments")] and "get" in rules[("apps", "deployments/status")]
    role = named(docs, "Role", name("worker"))
    assert all(rule["resourceNames"] == [name("policy")] for rule in role["rules"] if rule["apiGroups"] == ["apps"])
    binding = named(docs, "RoleBinding", name("worker"))
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name("worker"), "namespace": RELEASE}]
    for doc, spec in workloads(docs):
        assert spec.get("automountServiceAccountToken") is (component_of(doc) == "worker"), doc["metadata"]["name"]
    template = yaml.safe_load(named(docs, "ConfigMap", name("training-job"))["data"]["job.yaml"])
    kubernetes_validate.validate(template, KUBE_VERSION, strict=True)
    assert template["kind"] == "Job" and template["spec"]["ttlSecondsAfterFinished"] > 0
    assert template["spec"]["template"]["spec"]["serviceAccountName"] == name("training")
    account = named(docs, "ServiceAccount", name("training"))
    assert account["automountServiceAccountToken"] is False
    env = worker_env(docs)
    assert env["GEARSHIFT_KUBERNETES__LAUNCHER"] == "job" and env["GEARSHIFT_KUBERNETES__NODES"] == "1"
    assert env["GEARSHIFT_ORCHESTRATION__PUBLISH_TARGET"] == "builtin"
    assert env["GEARSHIFT_KUBERNETES__POLICY_DEPLOYMENT"] == env["GEARSHIFT_KUBERNETES__POLICY_SERVICE"] == name("policy")


def test_trainjob_scenario_runs_each_run_as_a_trainjob_across_nodes_with_the_jobs_pod():
    docs = rendered(TRAINJOB)
    assert not training_jobs(docs) and not of_kind(docs, "CronJob")
    (trainjob,) = of_kind(docs, "TrainJob")
    assert trainjob["apiVersion"] == TRAINER_API and trainjob["metadata"]["labels"]["gearshift.io/training-run"] == "sft-multinode"
    spec = trainjob["spec"]
    assert spec["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
    assert spec["activeDeadlineSeconds"] == 86400
    trainer = spec["trainer"]
    # torchrun takes nodes, rank and rendezvous from the runtime's PET_* variables.
    assert trainer["command"] == ["torchrun", "-m", "gearshift.cli", "train"]
    assert trainer["args"] == ["sft", "--config", "/etc/gearshift/train/config.yaml"]
    assert trainer["image"] == "gearshift-training-cuda:0.1.0"
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "16", "memory": "128Gi"},
                                           "limits": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 4}}
    env = {item["name"]: item for item in trainer["env"]}
    assert len(env) == len(trainer["env"])
    assert env["OMP_NUM_THREADS"]["value"] == "8" and env["NCCL_DEBUG"]["value"] == "WARN" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["value"] == "1"
    assert "secretKeyRef" in env["GEARSHIFT_AUTH_TOKEN"]["valueFrom"] and env["GEARSHIFT_DATA_DIR"]["value"] == "/checkpoints"
    assert not any(name.startswith("PET_") for name in env)  # the runtime's to set
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == "gearshift.io/chart"
    pod = node_pod(trainjob)
    assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gearshift"  # the store's NetworkPolicy admits it
    pod = pod["spec"]
    assert pod["serviceAccountName"] == name("training")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": name("checkpoints")}
    assert volumes["config"]["configMap"]["name"] == f"{name('train-sft-multinode')}-config"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    (container,) = pod["containers"]
    assert container["name"] == "node"
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]} == {
        "tmp": "/tmp", "dshm": "/dev/shm", "checkpoints": "/checkpoints", "config": "/etc/gearshift/train"}
    # The same pod security as a Job's pod.
    job_pod = yaml.safe_load(named(render(), "ConfigMap", name("training-job"))["data"]["job.yaml"])["spec"]["template"]["spec"]
    assert pod["securityContext"] == job_pod["securityContext"] and container["securityContext"] == job_pod["containers"][0]["securityContext"]
    assert named(docs, "PersistentVolumeClaim", name("checkpoints"))["spec"]["accessModes"] == ["ReadWriteMany"]

    # The worker's template: the same TrainJob, filled in per run.
    template = yaml.safe_load(named(docs, "ConfigMap", name("training-job"))["data"]["job.yaml"])
    validate_trainjob(template)
    assert template["kind"] == "TrainJob" and template["metadata"]["generateName"] == f"{name('train')}-"
    assert {v["name"]: v for v in node_pod(template)["spec"]["volumes"]}["config"]["configMap"]["name"] == "REPLACED-PER-RUN"
    assert template["spec"]["trainer"]["numNodes"] == 2
    assert {"create", "get", "list", "watch", "delete"} <= role_rules(docs)[("trainer.kubeflow.org", "trainjobs")]
    env = worker_env(docs)
    assert (env["GEARSHIFT_KUBERNETES__LAUNCHER"], env["GEARSHIFT_KUBERNETES__NODES"], env["GEARSHIFT_KUBERNETES__TRAINJOB_RUNTIME"]) == (
        "trainjob", "2", "torch-distributed")


def test_a_cpu_trainjob_runs_one_process_per_node():
    docs = render((), ("training.launcher=trainjob", "training.jobs[0].name=cpu", "training.jobs[0].algorithm=apo"), (TRAINER_API,))
    (trainjob,) = of_kind(docs, "TrainJob")
    trainer = trainjob["spec"]["trainer"]
    assert trainer["numNodes"] == 1 and trainer["numProcPerNode"] == 1 and "nvidia.com/gpu" not in trainer["resourcesPerNode"]["limits"]
    assert {item["name"]: item.get("value") for item in trainer["env"]}["OMP_NUM_THREADS"] == "4"
    validate_trainjob(trainjob)


@pytest.mark.parametrize(
    "values_files, sets, message",
    [
        ((TRAINJOB,), (), "training.launcher=trainjob needs Kubeflow Trainer"),  # no CRD in the cluster
        ((), ("training.launcher=trainjob",), "needs Kubeflow Trainer \\(the TrainJob CRD, trainer.kubeflow.org/v1alpha1\\)"),
        ((), ("training.nodes=2",), "training.nodes > 1 needs training.launcher=trainjob"),
    ],
)
def test_trainjobs_are_refused_without_kubeflow_trainer_and_several_nodes_without_trainjobs(values_files, sets, message):
    with pytest.raises(HelmError, match=message):
        render(values_files, sets, ())


@pytest.mark.parametrize(
    "sets, message",
    [
        (("training.envFromSecret=keys",), "a TrainJob's trainer takes env entries only"),
        (("training.schedules[0].name=nightly", "training.schedules[0].algorithm=apo", "training.schedules[0].schedule=0 3 * * *"),
         "training.schedules run as CronJobs, whose Jobs are one pod"),
    ],
)
def test_what_a_trainjob_across_nodes_cannot_do_is_refused(sets, message):
    with pytest.raises(HelmError, match=message):
        render((TRAINJOB,), sets)


@pytest.mark.parametrize(
    "values_files, sets, modes",
    [
        ((), (), ["ReadWriteOnce"]),  # one training pod at a time, nothing else mounts it
        ((TRAINJOB,), (), ["ReadWriteMany"]),  # training pods on two nodes
        ((), ("policy.mountCheckpoints=true",), ["ReadWriteMany"]),  # the policy reads what training writes
        ((VLLM_REPLICAS,), (), ["ReadWriteMany"]),  # vllm_lora mounts it in every replica
        (("ci/production-values.yaml",), (), ["ReadWriteOnce"]),  # two policy replicas, neither mounts it
        ((), ("training.checkpoints.accessModes={ReadWriteOncePod}",), ["ReadWriteOncePod"]),  # given, nothing shared: kept
        ((TRAINJOB,), ("training.checkpoints.accessModes={ReadWriteMany,ReadOnlyMany}",), ["ReadWriteMany", "ReadOnlyMany"]),
    ],
)
def test_checkpoints_claim_is_read_write_many_whenever_pods_on_several_nodes_use_it(values_files, sets, modes):
    claim = named(render(values_files, sets), "PersistentVolumeClaim", name("checkpoints"))
    assert claim["spec"]["accessModes"] == modes


@pytest.mark.parametrize(
    "values_files, sets, because",
    [
        ((TRAINJOB,), ("training.checkpoints.accessModes={ReadWriteOnce}",), "training on 2 nodes"),
        ((), ("policy.mountCheckpoints=true", "training.checkpoints.accessModes={ReadWriteOnce}"), "the policy server reading checkpoints"),
        # An existing claim declared without ReadWriteMany is refused as well.
        ((VLLM_REPLICAS,), ("training.checkpoints.existingClaim=old", "training.checkpoints.accessModes={ReadWriteOnce}"), "policy server"),
    ],
)
def test_checkpoints_access_modes_without_read_write_many_are_refused_when_shared(values_files, sets, because):
    with pytest.raises(HelmError, match="which needs ReadWriteMany") as refused:
        render(values_files, sets)
    assert because in str(refused.value)


def policy_pod(docs) -> dict:
    return named(docs, "Deployment", name("policy"))["spec"]["template"]["spec"]


def test_vllm_replicas_load_published_adapters_at_startup_through_an_init_container():
    docs = rendered(VLLM_REPLICAS)
    assert named(docs, "Deployment", name("policy"))["spec"]["replicas"] == 2
    pod = policy_pod(docs)
    (init,) = pod["initContainers"]
    (vllm,) = pod["containers"]
    # The init container: the gearshift CLI of the training image asks the store for the published adapters.
    assert init["command"] == ["gearshift", "publish-startup-adapters", "--output", "/var/run/gearshift/lora/args"]
    assert split_image(init["image"])[0] == "gearshift-training-cuda"
    env = {item["name"]: item for item in init["env"]}
    assert env["GEARSHIFT_STORE_ADDR"]["value"] == grpc_address("store")
    assert env["GEARSHIFT_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == name("auth")
    assert env["GEARSHIFT_POLICY_CLIENT__MODEL"]["value"] == "smollm2"
    assert not {"GEARSHIFT_REDIS_URL", "GEARSHIFT_DATABASE_URL"} & set(env)
    # One emptyDir shared by both; the adapters' checkpoints mounted read-only in both.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["lora-args"]
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": name("checkpoints"), "readOnly": True}
    for container in (init, vllm):
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["lora-args"]["mountPath"] == "/var/run/gearshift/lora"
        assert mounts["checkpoints"] == {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}
    assert {m["name"]: m for m in vllm["volumeMounts"]}["lora-args"]["readOnly"] is True
    # vLLM's command line appends the file's words to its own args, which stay a list (a rolling publish edits --model).
    shell, flag, script, zero = vllm["command"]
    assert (shell, flag, zero) == ("sh", "-c", "vllm")
    assert script == """eval 'exec python3 -m vllm.entrypoints.openai.api_server "$@"' "$(cat /var/run/gearshift/lora/args)\""""
    assert vllm["args"][:2] == ["--model", "/models/smollm2"] and "--enable-lora" in vllm["args"]
    assert {e["name"]: e.get("value") for e in vllm["env"]}["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # The store lets the policy pods in (their init container asks it for the adapters).
    peers = named(docs, "NetworkPolicy", name("store"))["spec"]["ingress"][0]["from"]
    labels = named(docs, "Deployment", name("policy"))["spec"]["template"]["metadata"]["labels"]
    assert any(peer["podSelector"]["matchLabels"].items() <= labels.items() for peer in peers)
    env = worker_env(docs)
    assert env["GEARSHIFT_ORCHESTRATION__PUBLISH_TARGET"] == "vllm_lora" and env["GEARSHIFT_KUBERNETES__POLICY_SERVICE"] == name("policy")


def test_vllm_without_runtime_lora_has_no_init_container_and_publishes_by_a_rolling_restart():
    docs = render(("values-gpu.yaml",))
    pod = policy_pod(docs)
    (vllm,) = pod["containers"]
    assert "initContainers" not in pod and vllm["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" not in vllm["args"] and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in {e["name"] for e in vllm["env"]}
    assert "checkpoints" not in {v["name"] for v in pod["volumes"]}
    assert worker_env(docs)["GEARSHIFT_ORCHESTRATION__PUBLISH_TARGET"] == "deployment"


def test_vllm_pods_drain_their_requests_before_stopping():
    for docs, grace in ((rendered(VLLM_REPLICAS), 180), (render(("values-gpu.yaml",)), 120)):
        pod = policy_pod(docs)
        assert pod["terminationGracePeriodSeconds"] == grace
        (vllm,) = pod["containers"]
        command = vllm["lifecycle"]["preStop"]["exec"]["command"]
        assert command == ["python3", "-c", (CHART / "files" / "drain-vllm.py").read_text(), "8000", "5"]


def test_the_builtin_server_drains_on_sigterm_after_leaving_the_endpoints():
    pod = policy_pod(render())
    (server,) = pod["containers"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert server["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["GEARSHIFT_GRACE_SECONDS"] == "110"  # uvicorn's drain: the grace less the pause and a margin
    own = policy_pod(render((), ("env.GEARSHIFT_GRACE_SECONDS=30",)))["containers"][0]["env"]
    assert [e["value"] for e in own if e["name"] == "GEARSHIFT_GRACE_SECONDS"] == ["30"]


def serve_metrics(bodies: list[str]):
    """A /metrics server on loopback answering each body in turn (the last one for good)."""
    import http.server
    import threading

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (bodies.pop(0) if len(bodies) > 1 else bodies[0]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def vllm_metrics(running: int, waiting: int) -> str:
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="smollm2"}} {running}.0\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="smollm2"}} {waiting}.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0\n'
    )


def test_the_vllm_drain_waits_until_no_request_runs_or_waits():
    import time

    script = (CHART / "files" / "drain-vllm.py").read_text()
    server = serve_metrics([vllm_metrics(2, 1), vllm_metrics(1, 0), vllm_metrics(0, 1), vllm_metrics(0, 0)])
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", script, str(server.server_address[1]), "0"], timeout=30)
        assert done.returncode == 0 and time.monotonic() - started >= 3  # three busy answers, a second apart
    finally:
        server.shutdown()
    # No server (it already stopped): nothing to wait for.
    done = subprocess.run([sys.executable, "-c", script, str(server.server_address[1]), "0"], timeout=10)
    assert done.returncode == 0


def test_helm_test_pod_checks_every_enabled_service():
    pod = named(render(), "Pod", name("health-check"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["args"] == [f"{s}={grpc_address(s)}" for s in GRPC_SERVICES] + [f"gateway=http://{name('gateway')}:8100/ready"]
    assert HTTP_SERVICES == ("gateway",)
    fewer = named(render((), ("reward.enabled=false", "gateway.enabled=false")), "Pod", name("health-check"))
    assert "reward" not in " ".join(fewer["spec"]["containers"][0]["args"])
    assert "gateway" not in " ".join(fewer["spec"]["containers"][0]["args"])


def test_the_charts_service_lists_are_the_services_table_split_by_protocol():
    """gearshift.grpcServices and gearshift.httpServices, as every pod's address settings show
    them, in the table's order (libs/gearshift/topology.py)."""
    (router,) = named(render(), "Deployment", name("router"))["spec"]["template"]["spec"]["containers"]
    addresses = [item["name"] for item in router["env"] if item["name"].endswith("_ADDR")]
    assert addresses == [f"GEARSHIFT_{spec.address_setting.upper()}" for spec in SERVICES]
    assert [spec.name for spec in SERVICES] == [*GRPC_SERVICES, *HTTP_SERVICES]


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


def test_health_check_script_asks_an_http_service_for_ready(unused_tcp_port):
    """The gateway's target: 200 from /ready is SERVING, 503 is NOT_SERVING, nothing listening is DOWN."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response({"/ready": 200, "/unready": 503}.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args):
            pass

    script = str(CHART / "files" / "check-health.py")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        ok = subprocess.run([sys.executable, script, "5", f"gateway={base}/ready"], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and ok.stdout.split()[-1] == "SERVING", ok.stdout + ok.stderr
        for target, state in ((f"{base}/unready", "NOT_SERVING"), (f"{base}/other", "DOWN (404)"),
                              (f"http://127.0.0.1:{unused_tcp_port}/ready", "DOWN (ConnectionRefusedError)")):
            down = subprocess.run([sys.executable, script, "2", f"gateway={target}"], capture_output=True, text=True, timeout=30)
            assert down.returncode == 1 and down.stdout.rstrip().endswith(state), down.stdout + down.stderr
    finally:
        server.shutdown()


# ---------------------------------------------------------------- the gateway


def gateway_container(docs) -> dict:
    (container,) = named(docs, "Deployment", name("gateway"))["spec"]["template"]["spec"]["containers"]
    return container


def test_gateway_serves_http_probed_on_health_and_ready_with_the_platform_token():
    docs = render()
    container = gateway_container(docs)
    assert container["command"] == ["gearshift", "serve", "gateway"]
    assert container["ports"] == [{"name": "http", "containerPort": 8100, "protocol": "TCP"},
                                  {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]  # /metrics apart from the API
    assert container["startupProbe"]["httpGet"] == container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    env = {item["name"]: item for item in container["env"]}
    assert env["GEARSHIFT_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": name("auth"), "key": "token"}
    # It calls services over gRPC and needs neither the database nor Redis.
    assert not {"GEARSHIFT_DATABASE_URL", "GEARSHIFT_REDIS_URL", "GEARSHIFT_METRICS_PORT"} & set(env)
    assert len(env) == len(container["env"]), "each variable once"
    port, metrics = named(docs, "Service", name("gateway"))["spec"]["ports"]
    assert port == {"name": "http", "port": 8100, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}
    assert metrics == {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}


def test_gateway_settings_from_its_pod_environment_listen_where_the_probes_look_and_call_the_executor(monkeypatch):
    """The pod's environment read as the gateway reads it: its port is the container port the
    probes and the Service use, and the executor it calls is the executor's Service."""
    docs = render((), ("gateway.port=9123",))
    container = gateway_container(docs)
    for item in container["env"]:
        monkeypatch.setenv(item["name"], item.get("value", "from-a-secret"))
    settings = Settings()
    port, metrics = container["ports"]
    # As services/gateway/service.py binds: gateway.port when set, else GEARSHIFT_PORT, else the table's.
    listens = settings.gateway.port if settings.gateway.port is not None else settings.service_port("gateway")
    assert listens == port["containerPort"] == 9123
    assert settings.gateway.metrics_port == metrics["containerPort"] == 9090  # what http_server.serve_metrics binds
    assert named(docs, "Service", name("gateway"))["spec"]["ports"][0]["port"] == 9123
    executor = named(docs, "Service", f"{name('executor')}-headless")["spec"]["ports"][0]
    assert settings.address_of("executor") == f"dns:///{name('executor')}-headless.{RELEASE}.svc.cluster.local:{executor['port']}"
    assert settings.address_of("store") == grpc_address("store") and settings.address_of("reward") == grpc_address("reward")
    assert settings.token() == "from-a-secret"
    (router,) = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"]
    assert {"name": "GEARSHIFT_GATEWAY_ADDR", "value": f"{name('gateway')}:9123"} in router["env"]


def test_gateway_has_no_ingress_by_default_and_one_routing_only_the_api_when_asked():
    assert not of_kind(render(), "Ingress")
    docs = render((GATEWAY_INGRESS,))
    (ingress,) = of_kind(docs, "Ingress")
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert spec["tls"] == [{"hosts": ["api.gearshift.example.com"], "secretName": f"{name('gateway')}-tls"}]
    (rule,) = spec["rules"]
    assert rule["host"] == "api.gearshift.example.com"
    (path,) = rule["http"]["paths"]  # /health, /ready and /metrics stay inside the cluster
    assert (path["path"], path["pathType"]) == ("/v1", "Prefix")
    backend = path["backend"]["service"]
    service = named(docs, "Service", backend["name"])
    assert service is not None and backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    plain = render((), ("gateway.ingress.enabled=true", "gateway.apiKeys.existingSecret=keys", "gateway.ingress.host=gw.example.com", "gateway.ingress.tls.secretName=mine"))
    (ingress,) = of_kind(plain, "Ingress")
    assert "tls" not in ingress["spec"] and "ingressClassName" not in ingress["spec"] and "annotations" not in ingress["metadata"]
    with pytest.raises(HelmError, match="host"):
        render((), ("gateway.ingress.host=Not_A_Host",))


def test_gateway_is_open_to_clients_unless_allow_from_names_them():
    spec = named(render(), "NetworkPolicy", name("gateway"))["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    assert spec["policyTypes"] == ["Ingress"]
    prometheus = {"ports": [{"port": "metrics", "protocol": "TCP"}],
                  "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}
    assert spec["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}, prometheus]  # the API: no `from`, any source
    fenced = named(render((GATEWAY_INGRESS,)), "NetworkPolicy", name("gateway"))["spec"]
    rule, metrics_rule = fenced["ingress"]
    assert metrics_rule == prometheus
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}} in rule["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in rule["from"]  # Prometheus
    assert any(peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "health-check"
               for peer in rule["from"])
    assert named(render((), ("networkPolicy.enabled=false",)), "NetworkPolicy", name("gateway")) is None


def test_gateway_scales_and_is_scraped_like_every_component():
    docs = render((GATEWAY_INGRESS,))
    assert named(docs, "HorizontalPodAutoscaler", name("gateway"))["spec"]["minReplicas"] == 2
    assert "replicas" not in named(docs, "Deployment", name("gateway"))["spec"]
    assert named(docs, "PodDisruptionBudget", name("gateway"))["spec"]["minAvailable"] == 1
    monitor = named(docs, "ServiceMonitor", name("gateway"))
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")  # not the API's port, which clients reach
    assert named(render(), "PodDisruptionBudget", name("gateway")) is None  # one replica: no PDB


def test_a_disabled_gateway_renders_nothing():
    docs = render((GATEWAY_INGRESS,), ("gateway.enabled=false",))
    assert not [doc for doc in docs if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "gateway"]
    assert not [doc for doc in docs if doc["metadata"]["name"] == name("gateway")]


def test_notes_say_how_to_reach_the_gateway_with_the_openai_client():
    def notes(*args: str) -> str:
        result = helm("install", RELEASE, str(CHART), "--namespace", RELEASE, "--dry-run=client", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout.partition("NOTES:")[2]

    default = notes()
    assert f"port-forward svc/{name('gateway')} 8100" in default and "OPENAI_BASE_URL=http://127.0.0.1:8100/v1" in default
    assert "from openai import OpenAI" in default and 'reply.gearshift["mode"]' in default
    assert "OPENAI_BASE_URL=https://api.gearshift.example.com/v1" in notes("-f", str(CHART / GATEWAY_INGRESS))
    assert "gateway is disabled" in notes("--set", "gateway.enabled=false")


def test_every_component_has_its_folder_and_identical_value_sub_keys():
    """Every component's values have the common sub-keys, and its schema is the one component
    definition (which declares them) plus its own keys, closed to any other."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert COMMON_KEYS <= set(schema["$defs"]["component"]["properties"])
    for component in COMPONENTS:
        assert (CHART / "templates" / component).is_dir(), component
        assert COMMON_KEYS <= set(values[component]), component
        properties = schema["properties"][component]
        assert properties["$ref"] == "#/$defs/component" and properties["unevaluatedProperties"] is False, component


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
