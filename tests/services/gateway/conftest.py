"""One embedded platform for the module: every service on its own loopback port, the store on
Postgres, the real default policy on the built-in server, and the gateway in front, all of it
requiring the platform token (GEARSHIFT_AUTH_TOKEN), which the gateway's clients send as their
API key. Small budgets keep episodes short."""

from __future__ import annotations

from dataclasses import dataclass

import openai
import pytest
from gearshift import weights
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.settings import ExecutorSettings, GatewaySettings, LearnedRouterSettings, PlannerSettings, RouterSettings, Settings
from gearshift.testing.postgres import scratch_database
from pydantic import SecretStr

TOKEN = "gateway-test-token"
MAX_BODY_BYTES = 64 * 1024


@dataclass
class Served:
    settings: Settings  # pointing at the running platform
    base_url: str  # the gateway's /v1
    store: store_pb2_grpc.TrajectoryStoreStub


def stack_settings(postgres_url: str, data_dir, gateway: GatewaySettings | None = None) -> Settings:
    """The module's platform: small budgets, the test token, and these gateway settings."""
    return Settings(
        data_dir=data_dir, metrics_port=0, log_level="WARNING", database_url=postgres_url,
        auth_token=SecretStr(TOKEN),
        # One agentic turn (a plan and a tool call, or the answer): an agentic episode then takes
        # seconds, not a minute, on a shared 2-core machine.
        executor=ExecutorSettings(max_tokens_per_turn=40, max_steps_agentic=1, max_steps_other=1),
        planner=PlannerSettings(max_tokens=32, max_horizon=1),
        router=RouterSettings(max_attempts=2, max_tokens=48),
        learned_router=LearnedRouterSettings(poll_seconds=0.2),
        gateway=gateway or GatewaySettings(max_body_bytes=MAX_BODY_BYTES),
    )


@pytest.fixture(scope="module")
async def served(tmp_path_factory):
    """The platform on a database of its own: test_gateway publishes a learned router to its store,
    which a stack on the session's database would then find (tests/services/executor expects none)."""
    with scratch_database("gearshift_gateway") as database_url:
        settings = stack_settings(database_url, tmp_path_factory.mktemp("gateway"))
        async with embedded(settings, policy_model=weights.DEFAULT) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
            yield Served(platform.settings, f"http://{platform.settings.gateway_addr}/v1", store_pb2_grpc.TrajectoryStoreStub(ch))


@pytest.fixture
async def client(served):
    async with openai.AsyncOpenAI(base_url=served.base_url, api_key=TOKEN, max_retries=0, timeout=600) as client:
        yield client
