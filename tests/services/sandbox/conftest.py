"""A sandbox service with small limits on a loopback port, shared by a test module."""

from __future__ import annotations

import json
import os

import pytest
from gearshift.api.common.v1.common_pb2 import ToolCall, ToolResult
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.sandbox.service import build
from gearshift.settings import SandboxSettings, Settings

# Placed in the service's environment before it starts; python code must never see it.
SERVICE_SECRET = "gs-test-secret-7f3a9c"

SMALL_LIMITS = dict(
    timeout_seconds=3.0, max_timeout_seconds=8.0, cpu_seconds=2, memory_mb=256, file_mb=4,
    max_processes=16, max_open_files=64, tmp_mb=16, tmp_inodes=1_000, max_output_chars=2_000,
    max_code_chars=50_000, warm_workers=4, max_sessions=3, session_idle_seconds=60.0, page_token_budget=30,
)


def sandbox_settings(data_dir, **overrides) -> Settings:
    return Settings(data_dir=data_dir, metrics_port=0, sandbox=SandboxSettings(**{**SMALL_LIMITS, **overrides}))


@pytest.fixture(scope="module")
async def sandbox(tmp_path_factory):
    """(settings, stub) of a running sandbox service."""
    os.environ["GEARSHIFT_TEST_SERVICE_SECRET"] = SERVICE_SECRET
    settings = sandbox_settings(tmp_path_factory.mktemp("sandbox"))
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            yield settings, sandbox_pb2_grpc.SandboxStub(ch)
    os.environ.pop("GEARSHIFT_TEST_SERVICE_SECRET", None)


async def call(stub, tool: str, arguments: dict | str, timeout: float = 0.0, session_id: str = "",
               trajectory_id: str = "t-1") -> ToolResult:
    """One Execute over gRPC; returns its ToolResult."""
    arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments)
    reply = await stub.Execute(
        sandbox_pb2.ExecuteRequest(
            call=ToolCall(id="c1", name=tool, arguments_json=arguments_json),
            trajectory_id=trajectory_id, timeout_seconds=timeout, session_id=session_id,
        )
    )
    return reply.result


async def run_python(stub, code: str, **kwargs) -> ToolResult:
    return await call(stub, "python", {"code": code}, **kwargs)
