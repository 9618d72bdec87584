"""The stack the image tests run against: the chart rendered with tests/images/values.yaml, each
Deployment and StatefulSet run as a container with the settings the chart gives its pod, one at
a time in dependency order, each ready by its own probe. Postgres and Redis run from
gearshift-test-deps (Debian's packages) since the official images need a registry.

Collected only under `make test-images` (GEARSHIFT_IMAGE_TESTS=1, see tests/conftest.py); there a
missing engine or image fails, it never skips."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from gearshift.testing.certs import StackCertificate, issue

from tests.charts.k8s import render
from tests.images.pods import cluster_domain, container_runs
from tests.images.stack import Stack, docker, docker_ready

VALUES = Path(__file__).with_name("values.yaml")
DEPS_IMAGE = "gearshift-test-deps"
# Start order: what others call first; first of all the installer of the sandbox's seccomp profile (a
# DaemonSet's pod on the one node). The policy server loads the model while nothing waits on it.
ORDER = ("sandbox-seccomp", "postgresql", "redis", "policy", "store", "sandbox", "reward", "planner", "router", "executor", "gateway", "worker", "beat")
PUBLISHED = {"gateway": "http"}  # component -> the port clients outside reach, published on loopback
# Figures for docs/images.md: `docker run` to ready, per component, written at the end of a run.
FIGURES = Path(tempfile.gettempdir()) / "gearshift-image-startup.json"
LOGS = Path(tempfile.gettempdir()) / "gearshift-image-logs"  # every container's log, kept after the run


@pytest.fixture(scope="session")
def docs():
    return render((str(VALUES),))


def env_value(docs, name: str) -> str:
    """The value the chart gives a variable (the first container that has it)."""
    for doc in docs:
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for item in container.get("env", []):
                if item["name"] == name:
                    return item["value"]
    raise AssertionError(f"the chart sets no {name}")


@pytest.fixture(scope="session")
def certificate(docs) -> StackCertificate:
    """The stack's certificate, for the name every client checks and for loopback (the gateway's
    published port)."""
    return issue(Path(tempfile.mkdtemp(prefix="gearshift-images-tls-")), names=(env_value(docs, "GEARSHIFT_TLS__SERVER_NAME"), "localhost"),
                 ips=("127.0.0.1",))


@pytest.fixture(scope="session")
def given_secrets(certificate) -> dict[tuple[str, str], str]:
    """The Secrets made outside the chart: the TLS one, as cert-manager writes it."""
    secret = yaml.safe_load(VALUES.read_text())["tls"]["secretName"]
    return {(secret, path.name): path.read_text() for path in (certificate.cert, certificate.key, certificate.ca)}


@pytest.fixture(scope="session")
def node() -> Path:
    """The one node's root: hostPath volumes are its folders (the kubelet's seccomp directory)."""
    return Path(tempfile.mkdtemp(prefix="gearshift-images-node-"))


@pytest.fixture(scope="session")
def stack(docs, certificate, given_secrets, node):
    why = docker_ready()
    if why:
        pytest.fail(why)
    runs = container_runs(docs, Path(tempfile.mkdtemp(prefix="gearshift-images-")), domain=cluster_domain((str(VALUES),)),
                          given_secrets=given_secrets, kinds=("Deployment", "StatefulSet", "DaemonSet"), node_dir=node)
    assert set(ORDER) == set(runs), f"the chart renders {sorted(runs)}; the tests start {sorted(ORDER)}"
    for component, port in PUBLISHED.items():
        runs[component].publish = [p["containerPort"] for p in runs[component].spec["ports"] if p["name"] == port]
    tag = runs["store"].image.rpartition(":")[2]
    deps = f"{DEPS_IMAGE}:{tag}"
    missing = [image for image in {run.image for name, run in runs.items() if name not in ("postgresql", "redis")} | {deps}
               if docker("image", "inspect", image, check=False).returncode]
    if missing:
        pytest.fail(f"images missing: {sorted(missing)} (make images; make test-images builds them all)")
    stack = Stack(runs, files_dir=Path(tempfile.mkdtemp(prefix="gearshift-images-files-")), certificate=certificate)
    try:
        stack.create_network()
        for component in ORDER:
            stack.start(component, image=deps if component in ("postgresql", "redis") else None)
        yield stack
        FIGURES.write_text(json.dumps({c: round(s, 1) for c, s in stack.ready_seconds.items()}, indent=1))
    finally:
        stack.close(logs_dir=LOGS)
