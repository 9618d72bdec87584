"""skaffold.yaml against skaffold's own JSON schema for its apiVersion (tests/charts/schemas, the
origin in its README.md), with and without each profile's patches, and against the chart: every
gearshift image a values file of the chart names has an artifact to build it.

`python -m tests.charts.skaffold` is scripts/check-chart.sh's skaffold step.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import yaml

from tests.charts.k8s import CHART, ROOT, SCHEMAS, apply_patches

SKAFFOLD_FILE = ROOT / "skaffold.yaml"
API_PREFIX = "skaffold/"


def load(path: Path = SKAFFOLD_FILE) -> dict:
    return yaml.safe_load(path.read_text())


def profiles(config: dict) -> list[str | None]:
    """None (no profile) and every profile's name."""
    return [None, *(profile["name"] for profile in config.get("profiles", []))]


def effective(config: dict, profile: str | None) -> dict:
    """The configuration skaffold runs with that profile: its JSON patches applied."""
    config = copy.deepcopy(config)
    if profile:
        (chosen,) = [p for p in config["profiles"] if p["name"] == profile]
        apply_patches(config, copy.deepcopy(chosen.get("patches", [])))
    return config


def effective_configs(config: dict) -> Iterator[tuple[str | None, dict | str]]:
    """(profile, its configuration) for no profile and each profile; instead of the configuration,
    why its patches do not apply."""
    for profile in profiles(config):
        try:
            yield profile, effective(config, profile)
        except (KeyError, IndexError, ValueError, TypeError) as error:
            yield profile, f"its patches do not apply ({type(error).__name__}: {error})"


def deepest(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """The most specific error under one that anyOf/oneOf branches produced (skaffold's schema
    wraps most objects in anyOf): the one deepest in the document."""
    leaves = [deepest(sub) for sub in error.context] if error.context else [error]
    return max(leaves, key=lambda leaf: (len(leaf.absolute_path), -len(leaf.context or ())), default=error)


def schema_problems(config: dict) -> list[str]:
    """What skaffold's schema for the file's apiVersion refuses, as the file stands and under each
    profile; a version without a stored schema is a problem too."""
    version = str(config.get("apiVersion", "")).removeprefix(API_PREFIX)
    path = SCHEMAS / f"skaffold-{version}.json"
    if not version or not path.is_file():
        return [f"apiVersion {config.get('apiVersion')!r}: no skaffold schema at {path.relative_to(ROOT)} (tests/charts/schemas/README.md)"]
    schema = json.loads(path.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = []
    for profile, effective_config in effective_configs(config):
        if isinstance(effective_config, str):
            problems.append(f"profile {profile}: {effective_config}")
            continue
        error = jsonschema.exceptions.best_match(validator.iter_errors(effective_config))
        if error is not None:
            error = deepest(error)
            where = "/".join(str(part) for part in error.absolute_path) or "(top)"
            problems.append(f"profile {profile or '(none)'}: {where}: {error.message}")
    return problems


def values_files() -> list[Path]:
    """values.yaml and every values file beside it or under ci/."""
    return [CHART / "values.yaml", *sorted(CHART.glob("values-*.yaml")), *sorted((CHART / "ci").glob("*.yaml"))]


def named_images(tree, path: str = "") -> Iterator[tuple[str, str]]:
    """(values path, repository) of every `image: {repository: ...}` in a values tree."""
    if isinstance(tree, dict):
        image = tree.get("image")
        if isinstance(image, dict) and isinstance(image.get("repository"), str):
            yield f"{path}image.repository", image["repository"]
        for key, value in tree.items():
            yield from named_images(value, f"{path}{key}.")
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from named_images(value, f"{path}{index}.")


def built_images(config: dict) -> set[str]:
    """Every image an artifact builds, with or without a profile (one whose patches do not apply:
    schema_problems says so)."""
    return {artifact["image"] for _, effective_config in effective_configs(config) if isinstance(effective_config, dict)
            for artifact in effective_config["build"]["artifacts"]}


def image_problems(config: dict, files: list[Path] | None = None) -> list[str]:
    """Every gearshift-* repository a values file names that no skaffold artifact builds."""
    built = built_images(config)
    problems = []
    for file in files or values_files():
        for where, repository in named_images(yaml.safe_load(file.read_text()) or {}):
            if repository.startswith("gearshift-") and repository not in built:
                problems.append(f"{file.relative_to(ROOT)}: {where} {repository} has no skaffold artifact")
    return problems


def main() -> int:
    config = load()
    problems = schema_problems(config) + image_problems(config)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"skaffold.yaml valid against skaffold's {config['apiVersion']} schema ({len(profiles(config)) - 1} profiles), "
              f"every gearshift image of {len(values_files())} values files built")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
