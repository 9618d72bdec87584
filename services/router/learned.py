"""The learned router as the router service serves it: the newest PUBLISHED router checkpoint,
loaded at start-up and hot-swapped when a newer one is published.

Requests never wait for a load: a background task polls the store's registry, loads a new
artefact on a worker thread, then replaces one reference. A request reads that reference once,
so it runs entirely on the old or entirely on the new version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from gearshift.api.common.v1.common_pb2 import Checkpoint, RoutingStrategy
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.errors import FailedPrecondition
from gearshift.protocol import a2fm
from gearshift.routing.features import FeatureExtractor, extractor_for
from gearshift.routing.model import RouterModel
from gearshift.routing.registry import newest_published
from gearshift.services.router.core import ModeDecision
from gearshift.settings import LearnedRouterSettings, Settings

log = logging.getLogger("gearshift.router.learned")


@dataclass(frozen=True)
class LoadedRouter:
    """One router version, ready to decide."""

    checkpoint_id: str
    model: RouterModel
    extractor: FeatureExtractor


def load_router(checkpoint: Checkpoint, embedding_threads: int) -> LoadedRouter:
    """Reads the artefact a checkpoint points at (blocking: call it off the event loop)."""
    model = RouterModel.load(Path(checkpoint.uri))
    return LoadedRouter(checkpoint.id, model, extractor_for(model.spec, embedding_threads))


class PublishedRouter:
    """The LearnedRouter the router core calls (services/router/core.py)."""

    def __init__(self, config: LearnedRouterSettings):
        self.config = config
        self._current: LoadedRouter | None = None

    @property
    def version(self) -> str:
        current = self._current
        return current.model.version if current else ""

    @property
    def checkpoint_id(self) -> str:
        current = self._current
        return current.checkpoint_id if current else ""

    def swap(self, loaded: LoadedRouter) -> None:
        self._current = loaded  # one reference assignment: atomic for every reader

    def decide(self, query: str) -> ModeDecision:
        current = self._current
        if current is None:
            raise FailedPrecondition("no learned router is published; train one with `gearshift router train` and publish it")
        model = current.model
        row = current.extractor.transform(query)
        choice = model.choose(row, self.config.accuracy_floor)
        # The forced-mode justification, not a description of the router: the policy then sees
        # exactly the prefix of the forced runs whose outcomes the router learned from.
        rationale = a2fm.FORCED_JUSTIFICATION[choice.mode]
        return ModeDecision(
            choice.mode,
            RoutingStrategy.ROUTING_STRATEGY_LEARNED,
            rationale,
            a2fm.episode_prefix(choice.mode, rationale),
            scores={e.mode: (e.probability, e.cost_of_pass_usd) for e in choice.estimates},
            router_version=model.version,
        )


class RouterReloader:
    """Keeps a PublishedRouter on the newest PUBLISHED router checkpoint."""

    def __init__(self, router: PublishedRouter, settings: Settings):
        self.router = router
        self.settings = settings
        self._channel = channel(settings.store_addr, settings)
        self._stub = store_pb2_grpc.TrajectoryStoreStub(self._channel)
        self._failed: str = ""  # a checkpoint that did not load is not retried until another is published
        self._task: asyncio.Task | None = None
        self._store_down = False

    async def refresh(self) -> bool:
        """Loads the newest published router if it is not the one served; True when swapped."""
        checkpoint = await newest_published(self._stub)
        if checkpoint is None or checkpoint.id in (self.router.checkpoint_id, self._failed):
            return False
        try:
            loaded = await asyncio.to_thread(load_router, checkpoint, self.router.config.embedding_threads)
        except (OSError, ValueError, KeyError) as exc:
            self._failed = checkpoint.id
            log.error("router checkpoint %s at %s did not load: %s", checkpoint.id, checkpoint.uri, exc)
            return False
        self.router.swap(loaded)
        log.info("serving learned router %s", loaded.model.version)
        return True

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
            self._store_down = False
        except grpc.aio.AioRpcError as exc:
            # The store may start after the router (gearshift up starts all at once): one line
            # when it goes away, none while it stays away.
            if not self._store_down:
                log.info("learned routers: the store is not reachable (%s); retrying every %.0f s",
                         exc.code().name, self.router.config.poll_seconds)
            self._store_down = True
        except Exception as exc:  # noqa: BLE001 - a bad registry entry must not stop the polling
            log.warning("learned router refresh failed: %s", exc)

    async def start(self) -> None:
        """First load before serving (a store that is down only delays it), then poll."""
        await self._refresh_logged()
        self._task = asyncio.create_task(self._poll(), name="learned-router-poll")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.router.config.poll_seconds)
            await self._refresh_logged()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._channel.close()
