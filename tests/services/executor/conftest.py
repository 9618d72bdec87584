"""The stack on the ScriptedPolicy stand-in that keeps every request body it was sent."""

import contextlib

import pytest
from gearshift.embedded import embedded
from gearshift.testing.scripted_policy import serve_scripted

from tests.services.executor.test_episode import scripted_model


@contextlib.asynccontextmanager
async def recording(settings, postgres_url):
    """(running settings, the bodies of the policy requests in order)."""
    bodies: list[dict] = []

    def model(body: dict) -> str:
        bodies.append(body)
        return scripted_model(body)

    async with serve_scripted(model) as policy_url:
        base = settings.with_policy(policy_url).model_copy(update={"database_url": postgres_url})
        async with embedded(base) as platform:
            yield platform.settings, bodies


@pytest.fixture
async def recorded(settings, postgres_url):
    async with recording(settings, postgres_url) as running:
        yield running
