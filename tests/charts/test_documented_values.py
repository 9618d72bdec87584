"""The chart values that the docs and the README show, rendered as a reader would install them:
each `yaml` block whose keys are the chart's values goes through `helm template` beside
values-gpu.yaml, and every training run it creates must carry a --config its job accepts (the
configs are strict: an unknown key stops the job at start, on the cluster, after the GPUs were
scheduled)."""

from __future__ import annotations

import re
import textwrap

import pytest
import yaml
from gearshift.job_table import BY_NAME

from tests.charts.k8s import CHART, named, render
from tests.charts.test_chart import training_runs

ROOT = CHART.parents[1]
DOCUMENTS = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])
FENCE = re.compile(r"^( *)```yaml\n(.*?)^\1```", re.M | re.S)
VALUE_KEYS = set(yaml.safe_load((CHART / "values.yaml").read_text()))
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"


def documented_values() -> list[tuple[str, dict]]:
    """(where, values) of every yaml block of the docs made of chart values with training runs."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            values = yaml.safe_load(textwrap.dedent(match[2]))
            if isinstance(values, dict) and values and set(values) <= VALUE_KEYS and values.get("training", {}).get("jobs"):
                found.append((f"{path.relative_to(ROOT)}:{text[:match.start()].count(chr(10)) + 1}", values))
    return found


def test_the_docs_show_chart_values_with_training_runs():
    assert any(where.startswith("docs/operations.md") for where, _ in documented_values())


@pytest.mark.parametrize(("where", "values"), documented_values(), ids=lambda item: item if isinstance(item, str) else "")
def test_every_training_run_the_docs_show_validates_as_its_jobs_config(where, values, tmp_path):
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    docs = render(("values-gpu.yaml", str(file)), apis=(TRAINJOB_API,))
    runs = training_runs(docs)
    assert len(runs) == len(values["training"]["jobs"]), where
    for args, volumes in runs:
        config_map = next(v["configMap"]["name"] for v in volumes if v["name"] == "config")
        text = named(docs, "ConfigMap", config_map)["data"]["config.yaml"]
        BY_NAME[args[0]].config_class().model_validate(yaml.safe_load(text))  # raises on any key the job refuses
