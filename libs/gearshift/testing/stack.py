"""All six services in this process, each on its own loopback port, talking real gRPC."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator

from gearshift.server import running
from gearshift.settings import Settings
from gearshift.stack import START_ORDER


@contextlib.asynccontextmanager
async def inprocess_stack(settings: Settings, services: tuple[str, ...] = START_ORDER) -> AsyncIterator[Settings]:
    """Starts the services in dependency order; yields settings that point at them."""
    async with contextlib.AsyncExitStack() as stack:
        for name in services:
            build = importlib.import_module(f"gearshift.services.{name}.service").build
            server = await stack.enter_async_context(running(await build(settings), settings))
            settings = settings.model_copy(update={f"{name}_addr": f"127.0.0.1:{server.port}"})
        yield settings
