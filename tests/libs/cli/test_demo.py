"""`gearshift demo`'s step through the OpenAI-compatible gateway (cli/platform.py's
ask_the_gateway): the official openai client against a running gateway, printing the answer, the
mode and the cost from the reply's `gearshift` extension; the policy is a scripted stand-in."""

from __future__ import annotations

import asyncio
import re
import sys

import click
import pytest
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.cli.platform import DEMO_QUESTIONS, ask_the_gateway
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.testing.scripted_policy import serve_scripted
from pydantic import SecretStr
from rich.console import Console

TOKEN = "demo-test-token"


def paris(body: dict) -> str:
    """Routes every query to instant mode and answers Paris."""
    if "</classification>" in (body.get("stop") or []):
        return "A fact.\n<classification>\ndefault_agent\n</classification>"
    return "Paris</answer>"


@pytest.fixture(scope="module")
async def gateway_stack(tmp_path_factory, postgres_url):
    from gearshift.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("demo"), metrics_port=0, log_level="WARNING", database_url=postgres_url,
                        auth_token=SecretStr(TOKEN))
    async with serve_scripted(paris) as policy_url, embedded(settings.with_policy(policy_url)) as platform:
        yield platform.settings


def printed(settings, **console) -> str:
    out = Console(record=True, width=200, **console)
    ask_the_gateway(settings, out)
    return out.export_text()


async def test_the_demo_asks_the_gateway_with_the_openai_client_and_prints_answer_mode_and_cost(gateway_stack):
    text = await asyncio.to_thread(printed, gateway_stack)
    assert DEMO_QUESTIONS[0][0] in text and f"http://{gateway_stack.gateway_addr}/v1" in text
    found = re.search(r"answer (.+?)  mode (\w+)  cost \$([0-9.]+)  trajectory (\S+)", text)
    assert found, text
    answer, mode, cost, trajectory_id = found.groups()
    assert (answer, mode) == ("Paris", "instant") and float(cost) > 0
    async with channel(gateway_stack.store_addr, gateway_stack) as ch:
        stored = await store_pb2_grpc.TrajectoryStoreStub(ch).Get(store_pb2.GetRequest(id=trajectory_id), timeout=10)
    assert stored.trajectory.mode == Mode.MODE_INSTANT and stored.trajectory.answer == "Paris"
    assert f"{stored.trajectory.cost.total_usd:.6f}" == cost


async def test_a_gateway_that_refuses_is_one_error_line(gateway_stack):
    wrong = gateway_stack.model_copy(update={"auth_token": SecretStr("not-the-token")})
    with pytest.raises(click.ClickException, match="the gateway: .*401"):
        await asyncio.to_thread(printed, wrong)


def test_without_the_openai_package_the_step_says_how_to_get_it(monkeypatch, settings):
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai now raises ImportError
    assert "pip install openai" in printed(settings)
