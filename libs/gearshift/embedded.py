"""The embedded platform in this process: services of the table, each on its own loopback port
over real gRPC, and the built-in policy server when asked for. `gearshift eval --inprocess`,
the loop, the promotion gate, APO rollouts, benchmarks and tests all start it here.

Components are started by module name from the services table, the way `gearshift serve NAME`
runs one, so this library module imports no application.

    async with embedded(settings, policy_model="smollm2") as platform:
        await evaluate(platform.settings, "facts", ["instant"], 10)
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gearshift.settings import Settings
from gearshift.topology import SERVICE_NAMES, SERVICES

if TYPE_CHECKING:
    from gearshift.weights import LoadedModel

POLICY_SERVER_MODULE = "gearshift.services.policy_server.server"


class EmbeddedPolicy(Protocol):
    """What callers may use of the built-in policy server embedded() started; anything else
    they ask it over its HTTP API (settings.policy_client.url), as any client does."""

    @property
    def base_url(self) -> str: ...

    @property
    def served_name(self) -> str: ...

    def weights_changed(self) -> None:
        """A trainer changed the served module's weights in place: prefixes cached before are stale."""


@dataclass
class Platform:
    """What embedded() started: settings pointing at it, and the policy server if it started one
    (its base_url is in settings.policy_client.url)."""

    settings: Settings
    policy: EmbeddedPolicy | None = None


@contextlib.asynccontextmanager
async def embedded(
    settings: Settings,
    services: Iterable[str] = SERVICE_NAMES,
    *,
    policy_model: str | None = None,
    policy_weights: LoadedModel | None = None,
) -> AsyncIterator[Platform]:
    """Starts, on free ports, the built-in policy server serving policy_model (or policy_weights,
    a model in memory the caller owns, e.g. the one a trainer is updating) when one is given, then
    the named services in start order. Services not named keep their configured addresses, so a
    second platform can share the first one's store, sandbox and reward service."""
    wanted = set(services)
    unknown = wanted - set(SERVICE_NAMES)
    if unknown:
        raise ValueError(f"unknown service(s) {sorted(unknown)}; one of {', '.join(SERVICE_NAMES)}")
    async with contextlib.AsyncExitStack() as stack:
        policy = None
        if policy_model is not None or policy_weights is not None:
            server = settings.policy_server.model_copy(update={"port": 0} | ({"model": policy_model} if policy_model else {}))
            settings = settings.model_copy(update={"policy_server": server})
            module = importlib.import_module(POLICY_SERVER_MODULE)
            policy = await stack.enter_async_context(module.running(settings, loaded=policy_weights))
            client = settings.policy_client.model_copy(update={"url": policy.base_url, "model": policy.served_name})
            settings = settings.model_copy(update={"policy_client": client})
        for spec in SERVICES:
            if spec.name in wanted:
                build = importlib.import_module(spec.module).build
                bootstrap = importlib.import_module(spec.bootstrap)  # gRPC or HTTP: the same running()
                server = await stack.enter_async_context(bootstrap.running(await build(settings), settings))
                settings = settings.model_copy(update={spec.address_setting: f"127.0.0.1:{server.port}"})
        yield Platform(settings, policy)
