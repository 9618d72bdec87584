"""Sandbox services with small limits on loopback ports, shared by a test module: in this (root)
process, or as a separate process run by an unprivileged user (as the chart's pod runs it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import ToolCall, ToolResult
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.sandbox.service import build
from gearshift.settings import SandboxSettings, Settings
from gearshift.testing.ports import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Placed in the service's environment before it starts; python code must never see it.
SERVICE_SECRET = "gs-test-secret-7f3a9c"
AS_NOBODY = Path(__file__).with_name("as_nobody.py")
NOBODY = 65534
MODES = ("root", "unprivileged")

SMALL_LIMITS = dict(
    timeout_seconds=3.0, max_timeout_seconds=20.0, cpu_seconds=2, memory_mb=256, file_mb=4,
    max_processes=16, max_open_files=64, tmp_mb=16, tmp_inodes=1_000, max_output_chars=20_000,
    max_code_chars=50_000, warm_workers=4, max_sessions=3, session_idle_seconds=60.0, page_token_budget=30,
)


def sandbox_settings(data_dir, **overrides) -> Settings:
    return Settings(data_dir=data_dir, metrics_port=0, sandbox=SandboxSettings(**{**SMALL_LIMITS, **overrides}))


@dataclass
class RunningSandbox:
    """A sandbox service the tests talk to: how it runs, its stub, and its process id."""

    mode: str  # "root" (in this process) or "unprivileged" (its own process, uid 65534)
    settings: Settings
    stub: sandbox_pb2_grpc.SandboxStub
    pid: int
    log: Path | None = None  # the service's log, when it runs as its own process


@pytest.fixture(scope="module")
async def sandbox(tmp_path_factory):
    """(settings, stub) of a sandbox service running in this (root) process."""
    os.environ["GEARSHIFT_TEST_SERVICE_SECRET"] = SERVICE_SECRET
    settings = sandbox_settings(tmp_path_factory.mktemp("sandbox"))
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            yield settings, sandbox_pb2_grpc.SandboxStub(ch)
    os.environ.pop("GEARSHIFT_TEST_SERVICE_SECRET", None)


@pytest.fixture(scope="module", params=MODES)
async def service(request, tmp_path_factory):
    """A RunningSandbox in each mode: as root in this process, then as uid 65534 in its own
    process (which must really run unprivileged: the test fails otherwise, it never skips)."""
    if request.param == "root":
        assert os.geteuid() == 0, "the root mode needs the tests to run as root (as CI does)"
        os.environ["GEARSHIFT_TEST_SERVICE_SECRET"] = SERVICE_SECRET
        settings = sandbox_settings(tmp_path_factory.mktemp("sandbox"))
        async with running(await build(settings), settings) as server:
            async with channel(f"127.0.0.1:{server.port}", settings) as ch:
                yield RunningSandbox("root", settings, sandbox_pb2_grpc.SandboxStub(ch), os.getpid())
        os.environ.pop("GEARSHIFT_TEST_SERVICE_SECRET", None)
        return
    async with service_process(unprivileged=True) as running_sandbox:
        # as root the tests drop it to 65534; run as a non-root user (in a container) it is that user
        expected = NOBODY if os.geteuid() == 0 else os.geteuid()
        assert _uid_of(running_sandbox.pid) == expected != 0, "the unprivileged service must not run as root"
        yield running_sandbox


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("\nUid:")[1].split()[0])



@contextlib.asynccontextmanager
async def service_process(unprivileged: bool, deny_namespaces: bool = False, mask_proc: bool = False, **overrides):
    """The sandbox service as its own process (through as_nobody.py for the unprivileged user,
    a runtime-like seccomp profile or masked /proc), with SMALL_LIMITS and overrides; a RunningSandbox."""
    data_dir = Path(tempfile.mkdtemp(prefix="gs-sandbox-test-"))
    if unprivileged and os.geteuid() == 0:
        os.chown(data_dir, NOBODY, NOBODY)
    port = free_port()
    limits = {**SMALL_LIMITS, **overrides}
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(data_dir),
        "GEARSHIFT_PORT": str(port), "GEARSHIFT_METRICS_PORT": "0", "GEARSHIFT_DATA_DIR": str(data_dir),
        "GEARSHIFT_TEST_SERVICE_SECRET": SERVICE_SECRET,
        **{f"GEARSHIFT_SANDBOX__{key.upper()}": json.dumps(value) if isinstance(value, bool) else str(value)
           for key, value in limits.items()},
    }
    options = [*(["--deny-namespaces"] if deny_namespaces else []), *(["--mask-proc"] if mask_proc else [])]
    launcher = [sys.executable, str(AS_NOBODY), *options, "--"] if unprivileged else []
    log_path = Path(tempfile.mkstemp(prefix="gs-sandbox-log-")[1])
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen([*launcher, sys.executable, "-m", "gearshift.services.sandbox"], env=env,
                                   stdout=log_file, stderr=subprocess.STDOUT, cwd=data_dir)
    address = f"127.0.0.1:{port}"
    settings = sandbox_settings(data_dir, **overrides)
    try:
        await _wait_serving(address, process, log_path)
        async with grpc.aio.insecure_channel(address) as ch:
            mode = "unprivileged" if unprivileged else "root"
            yield RunningSandbox(mode, settings, sandbox_pb2_grpc.SandboxStub(ch), process.pid, log_path)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)


async def _wait_serving(address: str, process: subprocess.Popen, log_path: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            assert process.poll() is None, f"the sandbox service exited:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the sandbox service did not start:\n{log_path.read_text()[-3000:]}")


async def call(stub, tool: str, arguments: dict | str, timeout: float = 0.0, session_id: str = "",
               trajectory_id: str = "t-1", open_session: bool = False) -> ToolResult:
    """One Execute over gRPC; returns its ToolResult."""
    arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments)
    reply = await stub.Execute(
        sandbox_pb2.ExecuteRequest(
            call=ToolCall(id="c1", name=tool, arguments_json=arguments_json),
            trajectory_id=trajectory_id, timeout_seconds=timeout, session_id=session_id, open_session=open_session,
        )
    )
    return reply.result


async def run_python(stub, code: str, **kwargs) -> ToolResult:
    return await call(stub, "python", {"code": code}, **kwargs)
