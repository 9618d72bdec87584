"""What the chart ships for on-call (charts/gearshift/dashboards, charts/gearshift/alerts), read
the way the chart reads it, for the chart tests and the live Prometheus test alike."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.charts.k8s import CHART

DASHBOARDS = CHART / "dashboards"
RULES = CHART / "alerts" / "rules.yaml"
RULE_TESTS = CHART / "alerts" / "rules_test.yaml"
BOARDS = ("overview", "serving", "training", "sandbox")
# What Grafana puts in for its interval variable; a range that holds several scrapes in a test.
RATE_INTERVAL = "1m"


def dashboard(name: str) -> dict:
    return json.loads((DASHBOARDS / f"{name}.json").read_text())


def panel_queries() -> Iterator[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL with Grafana's variables filled in) of every target."""
    for name in BOARDS:
        for panel in dashboard(name)["panels"]:
            for target in panel["targets"]:
                yield name, panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL)


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def tool(name: str) -> str:
    """A Prometheus binary; missing is a failure, not a skip (scripts/install-prometheus.sh, `make tools`)."""
    path = shutil.which(name)
    assert path, f"{name} is not installed: run scripts/install-prometheus.sh (make tools)"
    return path


def chart_file(path: Path) -> str:
    return str(path.relative_to(CHART))
