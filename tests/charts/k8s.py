"""Rendering the gearshift chart with the real helm binary, walking what it renders, and
validating every rendered object strictly (`python -m tests.charts.k8s < rendered.yaml` is
scripts/check-chart.sh's validation step): built-in kinds with kubernetes-validate, KEDA's
ScaledObjects and TriggerAuthentications against KEDA's own CRD schemas (tests/charts/schemas),
ServiceMonitors, cert-manager Certificates and TrainJobs against theirs, PrometheusRules with
`promtool check rules` (what Prometheus itself loads)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from gearshift.topology import GRPC_SERVICE_NAMES, SERVICE_NAMES
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
from kubernetes_validate.utils import SchemaNotFoundError

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gearshift"
KUBE_VERSION = "1.35.0"
RELEASE = "gearshift"  # release name == chart name, so objects are named gearshift-<component>
# The chart lists them too (gearshift.grpcServices, gearshift.httpServices); the tests check both agree.
GRPC_SERVICES = GRPC_SERVICE_NAMES
HTTP_SERVICES = tuple(name for name in SERVICE_NAMES if name not in GRPC_SERVICE_NAMES)
COMPONENTS = (*SERVICE_NAMES, "worker", "beat", "policy")
POD_KINDS = ("Deployment", "StatefulSet", "Job", "CronJob", "Pod")
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
SERVICE_MONITOR_SCHEMA = json.loads((ROOT / "tests" / "charts" / "servicemonitor.schema.json").read_text())
CERTIFICATE_SCHEMA = json.loads((ROOT / "tests" / "charts" / "certificate.schema.json").read_text())
SCHEMAS = ROOT / "tests" / "charts" / "schemas"  # upstream schemas, their origin in its README.md
KEDA_API = "keda.sh/v1alpha1"
API_VERSIONS_LINE = "# api-versions:"  # a values file's first line may name the CRD API versions its cluster serves

# kubernetes-validate reads and parses its schema files, a 1.5 MB _definitions.json among them, on
# every call: half of what validating a rendered chart took. Each file is parsed once per process.
kubernetes_validate.utils.schema_contents = lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)


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


def api_versions(values_files: tuple[str, ...]) -> tuple[str, ...]:
    """The API versions the values files' scenario cluster serves beyond the built-in ones, from
    a first line `# api-versions: group/version[, ...]` (helm template --api-versions; helm lint
    cannot take them)."""
    found: list[str] = []
    for name in values_files:
        first = (CHART / name).read_text().partition("\n")[0]
        if first.startswith(API_VERSIONS_LINE):
            found += [v.strip() for v in first[len(API_VERSIONS_LINE):].split(",") if v.strip()]
    return tuple(found)


class HelmError(Exception):
    """helm refused to render (schema violation, a template's fail, ...); the message is helm's."""


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([find_helm(), *args], capture_output=True, text=True, timeout=120)


def render(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = (), apis: tuple[str, ...] | None = None) -> tuple[dict, ...]:
    """`helm template` of the chart with these values files (relative to the chart), --set pairs
    and API versions (None: those the values files name); the same files with the same contents
    render once (a test's values file may lie at a path an earlier test's used: tmp_path is
    reused once a passed test's is removed)."""
    return _render(tuple((name, (CHART / name).read_text()) for name in values_files), sets, apis)


@lru_cache(maxsize=None)
def _render(values: tuple[tuple[str, str], ...], sets: tuple[str, ...], apis: tuple[str, ...] | None) -> tuple[dict, ...]:
    values_files = tuple(name for name, _ in values)
    args = ["template", RELEASE, str(CHART), "--namespace", RELEASE, "--kube-version", KUBE_VERSION]
    for version in api_versions(values_files) if apis is None else apis:
        args += ["--api-versions", version]
    for name in values_files:
        args += ["-f", str(CHART / name)]
    for pair in sets:
        args += ["--set", pair]
    result = helm(*args)
    if result.returncode:
        raise HelmError(result.stderr)
    return tuple(doc for doc in yaml.load_all(result.stdout, Loader=yaml.CSafeLoader) if doc)  # libyaml: 10x the pure-Python loader


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


def first_difference(expected, got, path: str = "") -> str | None:
    """Where two YAML trees first differ (a JSON-pointer-like path and both sides), or None."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            if key not in got:
                return f"{path}/{key}: not in the model (an unknown or misspelt field)"
            if key not in expected:
                return f"{path}/{key}: added by the model"
            found = first_difference(expected[key], got[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for index, (a, b) in enumerate(zip(expected, got)):
            found = first_difference(a, b, f"{path}/{index}")
            if found:
                return found
        return None
    return None if expected == got else f"{path}: {expected!r} became {got!r}"


def validate_trainjob(doc: dict) -> None:
    """A TrainJob against kubeflow-trainer-api's models. They drop keys they do not know (and
    from_dict does not pass them on) instead of refusing them, so the object must survive a round
    trip unchanged: a misspelt or unknown field, or a value of the wrong type, fails."""
    name = doc.get("metadata", {}).get("name") or doc.get("metadata", {}).get("generateName")
    if doc.get("apiVersion") != TRAINER_API:
        raise ValueError(f"TrainJob {name}: apiVersion {doc.get('apiVersion')!r}, not {TRAINER_API}")
    try:
        again = TrainerV1alpha1TrainJob.from_dict(doc).to_dict()
    except ValueError as error:  # pydantic's: a value of the wrong type, a required field missing
        raise ValueError(f"TrainJob {name}: {error}") from None
    difference = first_difference(doc, again)
    if difference:
        raise ValueError(f"TrainJob {name}: {difference}")


def closed(schema):
    """A CRD's structural schema made strict: every object that lists its properties refuses
    others (the API server would prune them silently), unless it says it keeps unknown fields."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=None)
def crd_validator(kind: str, file: str) -> jsonschema.protocols.Validator:
    """A validator for one CRD kind: its own openAPIV3Schema, closed, and the kind's apiVersion,
    kind and a metadata name pinned (the CRD schema leaves those to the API server)."""
    schema = closed(json.loads((SCHEMAS / file).read_text()))
    schema["properties"] |= {
        "apiVersion": {"const": KEDA_API},
        "kind": {"const": kind},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}},
    }
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


def validate_crd(kind: str, file: str):
    def validate(doc: dict) -> None:
        error = jsonschema.exceptions.best_match(crd_validator(kind, file).iter_errors(doc))
        if error is not None:
            raise error
    return validate


def validate_prometheus_rule(doc: dict) -> None:
    """A monitoring.coreos.com/v1 PrometheusRule: a named object whose spec is a rule file that
    promtool (Debian's prometheus package, scripts/install-prometheus.sh) accepts."""
    if doc.get("apiVersion") != "monitoring.coreos.com/v1" or set(doc) != {"apiVersion", "kind", "metadata", "spec"}:
        raise ValueError(f"PrometheusRule: unexpected apiVersion or fields {sorted(doc)}")
    if set(doc["spec"]) != {"groups"}:
        raise ValueError(f"PrometheusRule {doc['metadata'].get('name')}: spec has {sorted(doc['spec'])}, not only groups")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as rules:
        yaml.safe_dump(doc["spec"], rules)
        rules.flush()
        checked = subprocess.run(["promtool", "check", "rules", rules.name], capture_output=True, text=True)
    if checked.returncode:
        raise ValueError(f"PrometheusRule {doc['metadata'].get('name')}: {checked.stdout}{checked.stderr}")


CUSTOM_KINDS = {
    "PrometheusRule": validate_prometheus_rule,
    "ServiceMonitor": lambda doc: jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA),
    "Certificate": lambda doc: jsonschema.validate(doc, CERTIFICATE_SCHEMA),
    "ScaledObject": validate_crd("ScaledObject", "keda-scaledobject.json"),
    "TriggerAuthentication": validate_crd("TriggerAuthentication", "keda-triggerauthentication.json"),
    "TrainJob": validate_trainjob,
}


def validate_strictly(doc: dict) -> None:
    """One rendered object, strictly: built-in kinds with kubernetes-validate (Kubernetes
    KUBE_VERSION's schema, unknown fields refused), the chart's CRD kinds against their own
    schema or models; a kind that neither knows fails rather than passing unchecked."""
    if doc.get("kind") in CUSTOM_KINDS:
        CUSTOM_KINDS[doc["kind"]](doc)
        return
    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except SchemaNotFoundError:
        raise ValueError(f"no schema for {doc.get('apiVersion')} {doc.get('kind')}: add its validation to CUSTOM_KINDS") from None


def main() -> int:
    """Validates every object of a rendered chart on stdin; prints what fails."""
    failed = 0
    for doc in yaml.safe_load_all(sys.stdin):
        if not doc:
            continue
        try:
            validate_strictly(doc)
        except (ValueError, jsonschema.ValidationError, kubernetes_validate.ValidationError) as error:
            failed += 1
            print(f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
