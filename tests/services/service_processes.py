"""A platform service as a process of its own (`python -m gearshift.cli serve NAME`, as
`gearshift up` and a pod run it) on a free loopback port, its settings from the environment, its
log in a file; and stand-ins for a policy server that is down or stalls (named as such), which
count what reaches them. The retry-budget and drain tests use them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from gearshift.settings import Settings
from gearshift.testing.ports import free_port
from gearshift.testing.replicas import wait_serving
from gearshift.topology import SERVICES

START_SECONDS = 60.0


def environment(settings: Settings, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a service process whose settings are these (addresses, policy URL)."""
    env = dict(os.environ, GEARSHIFT_DATA_DIR=str(data_dir), GEARSHIFT_POLICY_CLIENT__URL=settings.policy_client.url,
               GEARSHIFT_LOG_LEVEL="INFO")
    for spec in SERVICES:
        env[f"GEARSHIFT_{spec.address_setting.upper()}"] = getattr(settings, spec.address_setting)
    return env | extra


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    port: int
    metrics_port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the process's Prometheus metrics (0 when absent)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                sample, value = line.rsplit(" ", 1)
                found = ",".join(sorted(sample[len(name):].strip("{}").split(","))) if "{" in sample else ""
                if found == wanted:
                    return float(value)
        return 0.0

    def terminate(self) -> float:
        """SIGTERM (a drain); returns the seconds until the process exited."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        return time.monotonic() - started


def _wait_serving(service: ServiceProcess) -> None:
    try:
        wait_serving(service.address, service.process, service.name, START_SECONDS)
    except RuntimeError as error:
        raise RuntimeError(f"{error}:\n{service.log.read_text()[-3000:]}") from None


@contextlib.contextmanager
def service_process(name: str, env: dict[str, str], log: Path) -> Iterator[ServiceProcess]:
    """Starts `gearshift serve name`, waits until it says SERVING; kills it afterwards if it still runs."""
    port, metrics_port = free_port(), free_port()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gearshift.cli", "serve", name],
            env=env | {"GEARSHIFT_PORT": str(port), "GEARSHIFT_METRICS_PORT": str(metrics_port)},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    service = ServiceProcess(name, process, port, metrics_port, log)
    try:
        _wait_serving(service)
        yield service
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class DeadPolicy:
    """A stand-in for a policy server that is down, counting the requests that reach it.
    "close": each connection is accepted and closed unanswered (a crashed server behind its
    address); "503": each request is read and answered 503 (a server that is up and failing)."""

    def __init__(self, mode: str):
        assert mode in ("close", "503")
        self.mode = mode
        self.requests = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aenter__(self) -> DeadPolicy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.mode == "close":
                self.requests += 1
                return
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
                await reader.readexactly(int(length.group(1)) if length else 0)
                self.requests += 1
                body = b'{"error": {"message": "stand-in policy server: down", "code": 503}}'
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

