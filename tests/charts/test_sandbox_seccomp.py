"""The sandbox's seccomp profile reaches the nodes through the chart (issue 61): with the default
values (a kind or any other cluster) a DaemonSet writes the chart's profile where the kubelet
looks for the sandbox's Localhost profile, and the sandbox pod waits for it. Its scripts run here
with the container's own command and environment, the shell standing in for the container and a
temporary directory for the node's (its hostPath) and for the ConfigMap's volume."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.charts.k8s import CHART, RELEASE, helm, named, of_kind, pod_spec, render

PROFILE = (CHART / "files" / "sandbox-seccomp.json").read_text()
INSTALLER = f"{RELEASE}-sandbox-seccomp"
SANDBOX = f"{RELEASE}-sandbox"
KUBELET_SECCOMP = "/var/lib/kubelet/seccomp"  # a kind node's (and minikube's, k3s's) kubelet root


def sandbox_pod(docs) -> dict:
    return pod_spec(named(docs, "Deployment", SANDBOX))


def start_here(container: dict, pod: dict, docs, node: Path, volumes: Path, env: dict | None = None) -> subprocess.Popen:
    """Runs a rendered container's command in this machine's shell: each mounted volume is a
    directory (a ConfigMap's files written into one, a hostPath under `node`, standing for the
    node's root), and each environment value naming a mount path names that directory instead."""
    sources = {volume["name"]: volume for volume in pod["volumes"]}
    local = {}
    for mount in container["volumeMounts"]:
        volume = sources[mount["name"]]
        if "configMap" in volume:
            folder = volumes / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for key, text in named(docs, "ConfigMap", volume["configMap"]["name"])["data"].items():
                (folder / key).write_text(text)
        else:
            assert volume["hostPath"]["type"] == "DirectoryOrCreate", volume
            folder = node / volume["hostPath"]["path"].lstrip("/")
            folder.mkdir(parents=True, exist_ok=True)
            if mount.get("readOnly"):
                assert container["name"] == "seccomp-wait", f"{container['name']} writes the node's {folder}"
        local[mount["mountPath"]] = str(folder)
    variables = {}
    for item in container["env"]:
        value = item["value"]
        for path, folder in local.items():
            if value.startswith(path + "/"):
                value = folder + value[len(path):]
        variables[item["name"]] = value
    return subprocess.Popen(container["command"], env={"PATH": os.environ["PATH"], **variables, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(condition, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


@pytest.fixture
def stopped():
    """Processes a test started, stopped when it ends (also when it fails)."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_default_install_writes_the_profile_the_sandbox_names_on_every_node_and_the_sandbox_waits_for_it(tmp_path, stopped):
    docs = render()
    sandbox = sandbox_pod(docs)
    (container,) = sandbox["containers"]
    profile = container["securityContext"]["seccompProfile"]
    assert profile == {"type": "Localhost", "localhostProfile": "gearshift/sandbox-seccomp.json"}
    assert named(docs, "ConfigMap", INSTALLER)["data"] == {"sandbox-seccomp.json": PROFILE}
    installer = pod_spec(named(docs, "DaemonSet", INSTALLER))
    assert [volume["hostPath"]["path"] for volume in installer["volumes"] if "hostPath" in volume] == [KUBELET_SECCOMP]
    (install,) = installer["containers"]
    assert install["securityContext"]["capabilities"]["drop"] == ["ALL"] and install["securityContext"]["readOnlyRootFilesystem"]

    node, volumes = tmp_path / "node", tmp_path / "volumes"
    on_node = node / KUBELET_SECCOMP.lstrip("/") / profile["localhostProfile"]  # where the kubelet reads it
    (wait,) = sandbox["initContainers"]
    waiting = start_here(wait, sandbox, docs, node, volumes / "sandbox")
    stopped.append(waiting)
    time.sleep(0.5)
    assert waiting.poll() is None, "the sandbox pod started before its profile was on the node"

    installing = start_here(install, installer, docs, node, volumes / "installer", env={"SECCOMP_CHECK_SECONDS": "0.2"})
    stopped.append(installing)
    wait_for(lambda: on_node.is_file() and on_node.read_text() == PROFILE, f"profile at {on_node}")
    assert waiting.wait(timeout=10) == 0, waiting.stdout.read()
    assert "waiting for the seccomp installer" in waiting.stdout.read()
    assert sorted(p.name for p in on_node.parent.iterdir()) == ["sandbox-seccomp.json"]  # no temporary file left

    # The installer stays (a DaemonSet's pod) and puts a lost or altered profile back.
    on_node.unlink()
    wait_for(on_node.is_file, "profile back after it was removed")
    on_node.write_text("{}")
    wait_for(lambda: on_node.read_text() == PROFILE, "profile restored after it was altered")
    assert installing.poll() is None
    installing.send_signal(signal.SIGTERM)
    assert installing.wait(timeout=5) == 0
    assert f"seccomp profile installed at {KUBELET_SECCOMP}/gearshift/sandbox-seccomp.json" in installing.stdout.read()


def test_the_installer_stopped_between_its_sleeps_exits_zero(tmp_path, stopped):
    """With no pause between checks, a SIGTERM finds the installer checking, its last sleeper
    gone: the trap's kill fails, and under `set -e` that once made the pod exit 1."""
    docs = render()
    installer = pod_spec(named(docs, "DaemonSet", INSTALLER))
    (install,) = installer["containers"]
    for attempt in range(5):  # a signal lands between sleeps more often than not
        node = tmp_path / f"node-{attempt}"
        installing = start_here(install, installer, docs, node, tmp_path / f"volumes-{attempt}", env={"SECCOMP_CHECK_SECONDS": "0"})
        stopped.append(installing)
        wait_for((node / KUBELET_SECCOMP.lstrip("/") / "gearshift" / "sandbox-seccomp.json").is_file, "profile on the node")
        time.sleep(0.1)
        installing.send_signal(signal.SIGTERM)
        assert installing.wait(timeout=5) == 0, installing.stdout.read()


def test_the_installers_readiness_is_the_node_copy_matching_the_charts_profile(tmp_path):
    docs = render()
    installer = pod_spec(named(docs, "DaemonSet", INSTALLER))
    (install,) = installer["containers"]
    env = {item["name"]: item["value"] for item in install["env"]}
    probe = install["readinessProbe"]["exec"]["command"]
    node_copy = tmp_path / "copy.json"
    profile = tmp_path / "profile.json"
    profile.write_text(PROFILE)

    def ready() -> bool:
        run = subprocess.run(probe, env={"PATH": os.environ["PATH"], **env, "SECCOMP_PROFILE": str(profile), "SECCOMP_TARGET": str(node_copy)})
        return run.returncode == 0

    assert not ready()
    node_copy.write_text("{}")
    assert not ready()
    node_copy.write_text(PROFILE)
    assert ready()


def test_the_installer_runs_where_the_sandbox_may_run():
    docs = render((), ("sandbox.nodeSelector.pool=sandbox", "sandbox.tolerations[0].key=sandbox", "sandbox.tolerations[0].operator=Exists",
                       "sandbox.seccomp.installer.kubeletDir=/data/kubelet"))
    installer = pod_spec(named(docs, "DaemonSet", INSTALLER))
    assert installer["nodeSelector"] == sandbox_pod(docs)["nodeSelector"] == {"pool": "sandbox"}
    assert installer["tolerations"] == [{"key": "sandbox", "operator": "Exists"}]
    assert [v["hostPath"]["path"] for v in installer["volumes"] if "hostPath" in v] == ["/data/kubelet/seccomp"]


@pytest.mark.parametrize(("sets", "profile"), [
    (("sandbox.seccomp.profile=RuntimeDefault",), {"type": "RuntimeDefault"}),
    (("sandbox.seccomp.installer.enabled=false",), {"type": "Localhost", "localhostProfile": "gearshift/sandbox-seccomp.json"}),
    (("sandbox.seccomp.installer.enabled=false", "sandbox.seccomp.localhostProfile=operator/gearshift/sandbox.json"),
     {"type": "Localhost", "localhostProfile": "operator/gearshift/sandbox.json"}),
])
def test_without_the_installer_nothing_touches_the_nodes_and_the_sandbox_pod_waits_for_nothing(sets, profile):
    docs = render((), sets)
    assert not of_kind(docs, "DaemonSet") and not named(docs, "ConfigMap", INSTALLER)
    sandbox = sandbox_pod(docs)
    assert "initContainers" not in sandbox and not any("hostPath" in volume for volume in sandbox["volumes"])
    assert sandbox["containers"][0]["securityContext"]["seccompProfile"] == profile


@pytest.mark.parametrize(("sets", "says"), [
    ((), f"DaemonSet\n            {INSTALLER} writes to {KUBELET_SECCOMP}/gearshift/sandbox-seccomp.json on every node"),
    (("sandbox.seccomp.installer.enabled=false",), "the chart's installer is off, and a node without the file cannot start the sandbox pod"),
    (("sandbox.seccomp.profile=RuntimeDefault",), "python calls are refused"),
    (("sandbox.seccomp.profile=RuntimeDefault", "sandbox.env.GEARSHIFT_SANDBOX__ALLOW_INSECURE=true"), "runs python\n            WITHOUT isolation"),
])
def test_the_notes_say_which_seccomp_profile_is_in_force(sets, says):
    args = [arg for pair in sets for arg in ("--set", pair)]
    result = helm("install", RELEASE, str(CHART), "-n", RELEASE, "--dry-run=client", *args)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.partition("NOTES:")[2]
    assert says in notes, notes[:1500]
