"""Rendering the gearshift chart with the real helm binary, and walking what it renders."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import yaml
from gearshift.topology import SERVICE_NAMES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gearshift"
KUBE_VERSION = "1.35.0"
RELEASE = "gearshift"  # release name == chart name, so objects are named gearshift-<component>
GRPC_SERVICES = SERVICE_NAMES  # the chart lists them too (gearshift.grpcServices); the tests check both agree
COMPONENTS = (*GRPC_SERVICES, "worker", "policy")
POD_KINDS = ("Deployment", "StatefulSet", "Job", "CronJob", "Pod")


def find_helm() -> str:
    """scripts/install-k8s-tools.sh's helm, else one on PATH; CI installs it, so none fails."""
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    assert found, "helm is not installed: run scripts/install-k8s-tools.sh (make tools)"
    return found


def scenarios() -> dict[str, tuple[str, ...]]:
    """The values matrix, as scripts/check-chart.sh renders it: every ci/*.yaml, every example
    values-*.yaml alone, and values-gpu.yaml under each other example."""
    found = {f"ci/{p.name}": (f"ci/{p.name}",) for p in sorted((CHART / "ci").glob("*.yaml"))}
    examples = sorted(p.name for p in CHART.glob("values-*.yaml"))
    found |= {name: (name,) for name in examples}
    found |= {f"values-gpu.yaml+{name}": ("values-gpu.yaml", name) for name in examples if name != "values-gpu.yaml"}
    return found


class HelmError(Exception):
    """helm refused to render (schema violation, a template's fail, ...); the message is helm's."""


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([find_helm(), *args], capture_output=True, text=True, timeout=120)


@lru_cache(maxsize=None)
def render(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> tuple[dict, ...]:
    """`helm template` of the chart with these values files (relative to the chart) and --set pairs."""
    args = ["template", RELEASE, str(CHART), "--namespace", RELEASE, "--kube-version", KUBE_VERSION]
    for name in values_files:
        args += ["-f", str(CHART / name)]
    for pair in sets:
        args += ["--set", pair]
    result = helm(*args)
    if result.returncode:
        raise HelmError(result.stderr)
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(docs, kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs, kind: str, name: str) -> dict | None:
    return next((doc for doc in of_kind(docs, kind) if doc["metadata"]["name"] == name), None)


def component_of(doc: dict) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def pod_spec(doc: dict) -> dict:
    """The pod spec inside any workload kind."""
    if doc["kind"] == "Pod":
        return doc["spec"]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def workloads(docs) -> Iterator[tuple[dict, dict]]:
    """(object, pod spec) for every object that runs pods."""
    for doc in docs:
        if doc["kind"] in POD_KINDS:
            yield doc, pod_spec(doc)


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def image_references(docs) -> set[str]:
    return {c["image"] for _, spec in workloads(docs) for c in containers(spec)}


def split_image(reference: str) -> tuple[str, str]:
    """(repository, tag or digest) of an image reference; "" when it has neither."""
    name, _, digest = reference.partition("@")
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    else:
        tag = ""
    return name, digest or tag


def apply_patches(document, patches: list[dict]):
    """The JSON Patch operations skaffold profiles use (add, replace, remove) on a YAML tree."""
    for patch in patches:
        *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in patch["path"].split("/")[1:]]
        target = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if patch["op"] == "add":
                target.insert(index, patch["value"])
            elif patch["op"] == "replace":
                target[index] = patch["value"]
            else:
                del target[index]
        elif patch["op"] == "remove":
            del target[last]
        else:
            if patch["op"] == "replace" and last not in target:
                raise KeyError(f"replace of missing {patch['path']}")
            target[last] = patch["value"]
    return document
