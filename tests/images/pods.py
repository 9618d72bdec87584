"""The chart's pods as `docker run` commands: each rendered workload's container spec (command,
environment with its Secret and field references, user, read-only root, capabilities, seccomp,
volumes, resource limits) turned into the engine's flags, so the image tests run what the chart
renders rather than a copy of it.

A node is a directory (node_dir): hostPath volumes are its folders bound into the container, and
a Localhost seccomp profile is read from its kubelet directory, where the chart's installer
DaemonSet, run as a container beforehand, wrote it. Init containers run to completion, in order,
before the pod's container.

What has no engine equivalent is left out on purpose: probes (tests/images runs them itself),
Services (network aliases stand in: every Service selecting the pod gives it the names a pod of
the namespace resolves, <name> through <name>.<namespace>.svc.<clusterDomain>; containers
sharing an alias are all answered by the engine's DNS, round robin, as a headless Service's
name resolves to every ready pod), Ingresses (a port published on
loopback stands in, for the components a test names), NetworkPolicies, `hostUsers`
(user namespaces are daemon-wide in the engine) and the scheduling fields.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.charts.k8s import CHART, pod_spec

KUBELET_SECCOMP = "var/lib/kubelet/seccomp"  # where a node's kubelet finds Localhost profiles (under node_dir)
_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


@dataclass
class ContainerRun:
    """One pod's container as the engine runs it: `docker run` + flags + image + arguments."""

    name: str  # the workload's name (gearshift-router), the container's name; a replica's is <name>-<replica>
    component: str
    image: str
    entrypoint: list[str] | None  # the container's `command` (replaces the image's ENTRYPOINT)
    args: list[str]  # the container's `args` (replace the image's CMD)
    env: dict[str, str]
    flags: list[str] = field(default_factory=list)  # user, security, resources
    mounts: list[str] = field(default_factory=list)  # --tmpfs / --mount flags
    volumes: dict[str, str] = field(default_factory=dict)  # named volume -> mount path (claims)
    files: dict[Path, str] = field(default_factory=dict)  # ConfigMap/Secret files to write before the run
    spec: dict = field(default_factory=dict)  # the rendered container, for its probes and ports
    inits: list[ContainerRun] = field(default_factory=list)  # the pod's init containers, run to completion first
    # Container ports published on a free loopback port of the host: what clients outside the
    # cluster reach (the gateway, as through its Ingress); every other port stays on the network.
    publish: list[int] = field(default_factory=list)
    # Network aliases: the DNS names of the Services that select the pod (service_aliases).
    # Replicas of one workload share them, so each name answers with every replica.
    aliases: list[str] = field(default_factory=list)

    def write_files(self) -> None:
        """Writes the ConfigMap and Secret files its mounts bind, as the kubelet would."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    @property
    def needs_ip(self) -> bool:
        """Whether its environment names the pod's IP (status.podIP), so the address is chosen before the run."""
        return any(POD_IP in value for value in self.env.values())

    def command(self, network: str, prefix: str, image: str | None = None, ip: str | None = None, detach: bool = True) -> list[str]:
        """The `docker run` command line; names and volumes carry the prefix, so a test run owns
        them. ip: the container's address on the network (the pod IP its environment names);
        detach=False: runs to its end and is removed (an init container)."""
        assert ip or not self.needs_ip, f"{self.name}: its environment names the pod's IP; give the container one"
        run = ["docker", "run", *(["-d"] if detach else ["--rm"]), "--name", f"{prefix}{self.name}", "--network", network,
               "--label", f"gearshift-test={prefix}", *self.flags, *self.mounts]
        if ip:
            run += ["--ip", ip]
        for alias in self.aliases:
            run += ["--network-alias", alias]
        for volume, path in self.volumes.items():
            run += ["--mount", f"type=volume,source={prefix}{volume},target={path}"]
        for port in self.publish:
            run += ["--publish", f"127.0.0.1::{port}"]
        for key, value in self.env.items():
            run += ["-e", f"{key}={value.replace(POD_IP, ip) if ip else value}"]
        if self.entrypoint:
            run += ["--entrypoint", self.entrypoint[0]]
        run.append(image or self.image)
        return run + (self.entrypoint or [])[1:] + self.args


def cluster_domain(values_files: tuple[str, ...] = ()) -> str:
    """The chart's clusterDomain as these values files (last wins) over its defaults set it."""
    domain = yaml.safe_load((CHART / "values.yaml").read_text())["clusterDomain"]
    for name in values_files:
        domain = (yaml.safe_load((CHART / name).read_text()) or {}).get("clusterDomain", domain)
    return domain


def service_aliases(docs, pod_labels: dict, namespace: str, domain: str) -> list[str]:
    """The names a pod with these labels is reached by: for every rendered Service whose selector
    the labels match (the ClusterIP Service and the headless one beside it), each name a pod of
    the namespace resolves it by, <name>, <name>.<namespace>, <name>.<namespace>.svc and
    <name>.<namespace>.svc.<domain> (what the chart's gRPC addresses name: dns:///<headless
    Service>.<namespace>.svc.<domain>:<port>)."""
    aliases: list[str] = []
    for doc in docs:
        selector = doc.get("spec", {}).get("selector") if doc["kind"] == "Service" else None
        if not selector or any(pod_labels.get(key) != value for key, value in selector.items()):
            continue
        name = doc["metadata"]["name"]
        for alias in (name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.{domain}"):
            if alias not in aliases:
                aliases.append(alias)
    return aliases


def quantity(text: str | int) -> int:
    """A Kubernetes quantity ("512Mi", "1Gi", "2") in units (bytes for memory)."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert match, f"not a quantity: {text!r}"
    return int(float(match[1]) * _QUANTITY.get(match[2], 1))


def cpus(text: str | int) -> str:
    """A CPU quantity ("500m", "2") as --cpus takes it: at most this machine's CPUs (the engine
    refuses more, where a kubelet would not have scheduled the pod)."""
    text = str(text)
    wanted = int(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return f"{min(wanted, os.cpu_count() or 1):g}"


def secret_values(docs) -> dict[tuple[str, str], str]:
    """(Secret name, key) -> value, from every rendered Secret's data and stringData."""
    found = {}
    for doc in docs:
        if doc["kind"] != "Secret":
            continue
        name = doc["metadata"]["name"]
        for key, value in (doc.get("data") or {}).items():
            found[name, key] = base64.b64decode(value).decode()
        for key, value in (doc.get("stringData") or {}).items():
            found[name, key] = str(value)
    return found


# A pod's own IP (fieldRef status.podIP) is known only once the engine gives the container one:
# env values carry this mark until Stack.start chooses the address (ContainerRun.command's ip).
POD_IP = "$(status.podIP)"
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of an env value: $(VAR) becomes the value of a variable defined
    before it (left as written when there is none), $$ a literal $."""
    return _REFERENCE.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), value)


def _env(container: dict, secrets: dict, namespace: str, pod_name: str) -> dict[str, str]:
    env = {}
    for source in container.get("envFrom", []):  # env entries win over envFrom, as in a pod
        name = source["secretRef"]["name"]
        env |= {key: value for (secret, key), value in secrets.items() if secret == name}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = _expand(str(item.get("value", "")), env)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert (ref["name"], ref["key"]) in secrets, f"{item['name']}: the chart renders no Secret {ref['name']} with key {ref['key']}"
            env[item["name"]] = secrets[ref["name"], ref["key"]]
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            env[item["name"]] = {"metadata.namespace": namespace, "metadata.name": pod_name, "status.podIP": POD_IP}[path]
        else:
            raise AssertionError(f"{item['name']}: unsupported env source {source}")
    return env


def _security(pod: dict, container: dict, node_dir: Path | None) -> list[str]:
    """The pod's and the container's securityContext (the container's wins) as engine flags; a
    Localhost seccomp profile is the node's file (the engine reads it at `docker run`)."""
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    flags = []
    if "runAsUser" in context:
        flags += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', context['runAsUser'])}"]
    if "fsGroup" in context:
        flags += ["--group-add", str(context["fsGroup"])]
    if context.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    capabilities = context.get("capabilities", {})
    flags += [f"--cap-drop={cap}" for cap in capabilities.get("drop", [])]
    flags += [f"--cap-add={cap}" for cap in capabilities.get("add", [])]
    seccomp = context.get("seccompProfile", {"type": "RuntimeDefault"})
    if seccomp["type"] == "Localhost":
        assert node_dir, f"{container['name']}: a Localhost seccomp profile needs a node (node_dir)"
        flags += ["--security-opt", f"seccomp={node_dir / KUBELET_SECCOMP / seccomp['localhostProfile']}"]
    elif seccomp["type"] == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    # RuntimeDefault: the engine's default profile, as the kubelet gives containerd's.
    return flags


def _volumes(pod: dict, container: dict, docs, files_dir: Path, workload: str,
             secrets: dict[tuple[str, str], str], node_dir: Path | None) -> tuple[list[str], dict[str, str], dict[Path, str]]:
    """Mounts for the container's volumeMounts: emptyDir -> tmpfs (exec, like a node's disk),
    ConfigMap or Secret -> its files bound read-only (a whole volume: rewriting a file on the host
    is what the kubelet does when the object changes), claim (or claim template) -> a named volume,
    hostPath -> that folder of node_dir."""
    sources = {volume["name"]: volume for volume in pod.get("volumes", [])}
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    # A kubelet makes emptyDirs writable to the pod (0777, fsGroup). The engine gives a tmpfs over
    # a directory of the image that directory's mode, so owner and group are set instead.
    owner = f"uid={context.get('runAsUser', 0)},gid={context.get('fsGroup', context.get('runAsGroup', 0))}"
    mounts, named, files = [], {}, {}
    for mount in container.get("volumeMounts", []):
        path, volume = mount["mountPath"], sources.get(mount["name"])
        if volume is None or "persistentVolumeClaim" in volume:  # a StatefulSet's claim template, or a PVC
            # A claim template's claims are named <template>-<statefulset>-<ordinal>.
            claim = volume["persistentVolumeClaim"]["claimName"] if volume else f"{mount['name']}-{workload}-0"
            named[claim] = path
        elif "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit")
            options = f"rw,exec,mode=1777,{owner}" + (f",size={quantity(size)}" if size else "")
            mounts += ["--tmpfs", f"{path}:{options}"]
        elif "configMap" in volume:
            config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"])
            folder = files_dir / mount["name"]
            for key, text in config.get("data", {}).items():
                files[folder / key] = text
            mounts += ["--mount", f"type=bind,source={folder},target={path},readonly"]
        elif "hostPath" in volume:
            assert node_dir, f"volume {mount['name']}: a hostPath needs a node (node_dir)"
            folder = node_dir / volume["hostPath"]["path"].lstrip("/")
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o777)  # the node's is root's; the test's user may not be the engine's root
            mounts += ["--mount", f"type=bind,source={folder},target={path}" + (",readonly" if mount.get("readOnly") else "")]
        elif "secret" in volume:
            name = volume["secret"]["secretName"]
            keys = {key: value for (secret, key), value in secrets.items() if secret == name}
            assert keys, f"volume {mount['name']}: no Secret {name} rendered or given"
            folder = files_dir / mount["name"]
            files |= {folder / key: value for key, value in keys.items()}
            mounts += ["--mount", f"type=bind,source={folder},target={path},readonly"]
        else:
            raise AssertionError(f"volume {mount['name']}: unsupported source {sorted(volume)}")
    return mounts, named, files


def container_runs(docs, files_dir: Path, namespace: str = "gearshift", kinds=("Deployment", "StatefulSet"),
                   domain: str | None = None, given_secrets: dict[tuple[str, str], str] | None = None,
                   node_dir: Path | None = None) -> dict[str, ContainerRun]:
    """component -> ContainerRun for every workload of these kinds the chart renders; domain: the
    clusterDomain the chart was rendered with (default: the chart's own); given_secrets: (name,
    key) -> value of Secrets made outside the chart (cert-manager's); node_dir: the node's root
    (hostPath volumes, Localhost seccomp profiles)."""
    secrets = secret_values(docs) | (given_secrets or {})
    domain = domain or cluster_domain()
    runs = {}
    for doc in docs:
        if doc["kind"] not in kinds:
            continue
        pod = pod_spec(doc)
        assert len(pod["containers"]) == 1, f"{doc['metadata']['name']}: one container expected"
        name = doc["metadata"]["name"]
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]

        def run_of(container: dict, run_name: str, folder: Path) -> ContainerRun:
            mounts, named, files = _volumes(pod, container, docs, folder, name, secrets, node_dir)
            flags = _security(pod, container, node_dir)
            limits = container.get("resources", {}).get("limits", {})
            if "memory" in limits:
                flags += ["--memory", str(quantity(limits["memory"]))]
            if "cpu" in limits:
                flags += ["--cpus", cpus(limits["cpu"])]
            return ContainerRun(
                name=run_name, component=component, image=container["image"], entrypoint=container.get("command"),
                args=container.get("args", []), env=_env(container, secrets, namespace, f"{name}-0"),
                flags=flags, mounts=mounts, volumes=named, files=files, spec=container)

        run = run_of(pod["containers"][0], name, files_dir / component)
        run.inits = [run_of(init, f"{name}-{init['name']}", files_dir / f"{component}-{init['name']}") for init in pod.get("initContainers", [])]
        run.aliases = service_aliases(docs, doc["spec"].get("template", {}).get("metadata", {}).get("labels", {}), namespace, domain)
        runs[component] = run
    return runs
