"""Runs the policy server: load the model, then serve the app with uvicorn on one socket, inside
gearshift.tracing's middleware (it continues the trace of a caller's traceparent)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from gearshift import tls, tracing, weights
from gearshift.http_server import uvicorn_logging
from gearshift.services.policy_server.app import create_app
from gearshift.services.policy_server.core import PolicyEngine
from gearshift.settings import Settings, get_settings

log = logging.getLogger("gearshift.policy_server")
SERVICE_NAME = "policy-server"  # its spans' service.name


def traced_app(engine: PolicyEngine, settings: Settings):
    return tracing.TracedHttp(create_app(engine), tracing.setup(settings, SERVICE_NAME))


@dataclass
class RunningPolicyServer:
    """A started server: its engine and the address it answers on. The library uses it through
    gearshift.embedded.EmbeddedPolicy (base_url, served_name, weights_changed), never the engine."""

    engine: PolicyEngine
    host: str
    port: int
    scheme: str = "http"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/v1"

    @property
    def served_name(self) -> str:
        return self.engine.served_name

    def weights_changed(self) -> None:
        """A trainer changed the served module's weights in place (PolicyEngine.weights_changed)."""
        self.engine.weights_changed()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextlib.asynccontextmanager
async def running(settings: Settings, loaded: weights.LoadedModel | None = None) -> AsyncIterator[RunningPolicyServer]:
    """Serves in the current event loop until the block exits (port 0 picks a free port): the
    model settings name, or `loaded`, a model in memory served as it is (a trainer's, whose
    weights it keeps updating)."""
    policy = settings.policy_server
    engine = PolicyEngine(loaded, policy, settings.models_dir) if loaded else await PolicyEngine.start(policy, settings.models_dir)
    sock = _bind(policy.host, policy.port)
    config = uvicorn.Config(traced_app(engine, settings), log_level=settings.log_level.lower(), access_log=False, lifespan="off",
                            **uvicorn_logging(settings), **tls.uvicorn_options(settings.tls, ask_clients=True))
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # the caller owns SIGINT/SIGTERM, not uvicorn
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises why it could not start
            await asyncio.sleep(0.01)
        yield RunningPolicyServer(engine, policy.host, sock.getsockname()[1], tls.scheme(settings.tls))
    finally:
        server.should_exit = True
        await task
        sock.close()
        engine.close()


async def serve(settings: Settings) -> None:
    """Loads the model and serves until SIGTERM/SIGINT (uvicorn drains open requests)."""
    policy = settings.policy_server
    engine = await PolicyEngine.start(policy, settings.models_dir)
    log.info("serving %s as %r on %s://%s:%d/v1", engine.current.path, engine.served_name, tls.scheme(settings.tls), policy.host, policy.port)
    config = uvicorn.Config(
        traced_app(engine, settings), host=policy.host, port=policy.port, log_level=settings.log_level.lower(),
        access_log=False,  # a line per request drowns the stack's output; /metrics counts them
        timeout_graceful_shutdown=int(settings.drain_seconds("policy")), **uvicorn_logging(settings),
        **tls.uvicorn_options(settings.tls, ask_clients=True),
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        engine.close()


def main(model: str | None = None, port: int | None = None) -> None:
    """Entry point of `gearshift serve-policy` and `python -m gearshift.services.policy_server`."""
    from gearshift.server import configure_logging

    settings = get_settings()
    overrides = {key: value for key, value in (("model", model), ("port", port)) if value is not None}
    if overrides:
        settings = settings.model_copy(update={"policy_server": settings.policy_server.model_copy(update=overrides)})
    configure_logging(settings.log_level, settings.log_format)
    asyncio.run(serve(settings))
