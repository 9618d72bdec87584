"""policy.protocol reaches every platform pod as GEARSHIFT_POLICY_CLIENT__PROTOCOL, the setting
that picks the executor's policy protocol (text or native)."""

from __future__ import annotations

import pytest
from gearshift.settings import Settings

from tests.charts.k8s import RELEASE, HelmError, named, render


def executor_env(docs) -> dict[str, str]:
    pod = named(docs, "Deployment", f"{RELEASE}-executor")["spec"]["template"]["spec"]
    return {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}


def test_the_default_is_the_text_protocol_as_the_settings_default():
    assert executor_env(render())["GEARSHIFT_POLICY_CLIENT__PROTOCOL"] == Settings().policy_client.protocol == "text"


def test_agents_a1_on_vllm_is_served_natively():
    assert executor_env(render(("values-gpu.yaml", "values-agents-a1.yaml")))["GEARSHIFT_POLICY_CLIENT__PROTOCOL"] == "native"


def test_an_unknown_protocol_is_refused_by_the_schema():
    with pytest.raises(HelmError, match="protocol"):
        render(sets=("policy.protocol=tags",))
