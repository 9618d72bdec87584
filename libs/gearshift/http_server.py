"""The HTTP counterpart of gearshift.server, for the services of the table that speak HTTP (the
OpenAI-compatible gateway): uvicorn on one socket in the running event loop, uvloop under
`main`, and a graceful drain on SIGTERM/SIGINT: stop accepting, close idle keep-alive
connections, let requests and streams in flight finish within the grace, then cancel them.

The service's ASGI app serves its own /health and /ready; its metrics registry is served on a port
of its own (as a gRPC service's), so /metrics is never open to the API's clients. This module runs
the app inside gearshift.tracing's middleware (a span per request, the log ids)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import uvicorn
import uvloop
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from gearshift import tls, tracing
from gearshift.server import configure_logging
from gearshift.settings import Settings, get_settings

T = TypeVar("T")
DISCONNECT_POLL_SECONDS = 0.2


class ClientGone(Exception):
    """The client hung up before its reply was ready."""


async def unless_disconnected(request, work: Awaitable[T]) -> T:
    """Awaits work, cancelling it when the client of request (a Starlette request) hangs up:
    ClientGone then. A caller that gave up must not keep a generation or an episode running."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        task.cancel()

log = logging.getLogger("gearshift.http_server")


@dataclass
class HttpService:
    """What an HTTP service hands to the bootstrap: its ASGI app and what to close on shutdown."""

    name: str
    app: Any  # an ASGI application
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    host: str | None = None  # None: settings.host, as every service
    port: int | None = None  # None: settings.service_port(name)
    metrics_registry: CollectorRegistry = REGISTRY  # what its /metrics port serves
    metrics_port: int | None = None  # None: settings.service_metrics_port(name); 0: off
    limit_concurrency: int | None = None  # uvicorn's: connections and requests at once, beyond them a 503 (None: no bound)
    trusts_trace: Callable[[Mapping[str, str]], bool] | None = None  # whose traceparent forces sampling (None: every caller's)
    auth: str | None = None  # what the start log line says of auth (None: whether GEARSHIFT_AUTH_TOKEN is set)


class RunningHttpServer:
    """A started server: its bound port and a way to drain it."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task, sock: socket.socket, service: HttpService):
        self.server = server
        self.task = task
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.service = service

    async def stop(self, grace: float) -> None:
        self.server.config.timeout_graceful_shutdown = max(grace, 0.1)
        self.server.should_exit = True
        try:
            await self.task
        finally:
            self.sock.close()
            for close in self.service.on_close:
                await close()


def _bind(host: str, port: int, name: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes a reply's head and body apart, and with Nagle
    # on (asyncio's default loop leaves it on; uvloop turns it off) the body waited for the client's
    # delayed ACK, 40 ms a request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"{name}: cannot listen on {host}:{port} ({exc.strerror}; is the port in use?)") from None
    return sock


def uvicorn_logging(settings: Settings) -> dict:
    """uvicorn's own logging set-up, except with JSON lines: then its loggers (the access log
    among them) pass their records to the root logger's handler, which adds the ids."""
    return {"log_config": None} if settings.log_format == "json" else {}


async def start(service: HttpService, settings: Settings, port: int | None = None) -> RunningHttpServer:
    """Starts the service; port 0 picks a free one (tests). Returns once it accepts connections."""
    host = service.host or settings.host
    if port is None:
        port = service.port if service.port is not None else settings.service_port(service.name)
    sock = _bind(host, port, service.name)
    config = uvicorn.Config(
        tracing.TracedHttp(service.app, tracing.setup(settings, service.name), service.trusts_trace), log_level=settings.log_level.lower(),
        lifespan="off", limit_concurrency=service.limit_concurrency,
        access_log=False,  # uvicorn's is process-wide; the gateway writes its own (GatewaySettings.access_log)
        timeout_graceful_shutdown=max(settings.drain_seconds(service.name), 0.1),
        **uvicorn_logging(settings), **tls.uvicorn_options(settings.tls, ask_clients=False),  # the gateway's clients send API keys
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # the caller owns SIGINT/SIGTERM, not uvicorn
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            sock.close()
            task.result()  # raises why it could not start
            raise OSError(f"{service.name}: the HTTP server exited during start-up")
        await asyncio.sleep(0.01)
    return RunningHttpServer(server, task, sock, service)


@contextlib.asynccontextmanager
async def running(service: HttpService, settings: Settings) -> AsyncIterator[RunningHttpServer]:
    """Runs a service on a free port for the duration of a block (tests, benchmarks, embedded)."""
    server = await start(service, settings, port=0)
    try:
        yield server
    finally:
        await server.stop(grace=0.5)


def serve_metrics(service: HttpService, settings: Settings) -> int:
    """Serves the service's metrics registry on its metrics port; returns the port (0: off)."""
    port = service.metrics_port if service.metrics_port is not None else settings.service_metrics_port(service.name)
    if port:
        start_http_server(port, addr=service.host or settings.host, registry=service.metrics_registry)
    return port


async def serve(build: Callable[[Settings], Awaitable[HttpService]], settings: Settings) -> None:
    """Builds and runs a service until SIGTERM or SIGINT, then drains it."""
    service = await build(settings)
    server = await start(service, settings)
    metrics_port = serve_metrics(service, settings)
    auth = service.auth or f"auth {'on' if settings.auth_token else 'off'}"
    log.info("%s listening on %s://%s:%d (metrics on :%s, %s)", service.name, tls.scheme(settings.tls), service.host or settings.host, server.port,
             metrics_port or "off", auth)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopped, server.task}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    grace = settings.drain_seconds(service.name)
    log.info("%s draining for up to %.1fs", service.name, grace)
    await server.stop(grace)
    log.info("%s stopped", service.name)


def main(build: Callable[[Settings], Awaitable[HttpService]], settings: Settings | None = None) -> None:
    """An HTTP service's entry point (`python -m gearshift.services.NAME`, `gearshift serve NAME`)."""
    settings = settings or get_settings()
    configure_logging(settings.log_level, settings.log_format)
    try:
        uvloop.run(serve(build, settings))
    except OSError as exc:  # a port in use: one line, not a traceback
        log.error("%s", exc)
        raise SystemExit(1) from None
