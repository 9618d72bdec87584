"""The command line against a real stack: the executor, on the scripted policy, stores episodes in
a Postgres store of this module's own, and the commands read them back as a user's shell would
(CliRunner, the terminal's width and tty-ness from the environment, as rich reads them)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from click.testing import CliRunner
from gearshift.cli import main
from gearshift.embedded import embedded
from gearshift.settings import Settings, get_settings
from gearshift.testing.postgres import scratch_database
from gearshift.testing.scripted_policy import serve_scripted
from rich.text import Text

from tests.services.executor.test_episode import scripted_model

EPISODE_PATH = ("store", "sandbox", "reward", "planner", "router", "executor")  # what Solve needs


@contextlib.asynccontextmanager
async def episode_stack(settings: Settings, model: Callable[[dict], str] = scripted_model) -> AsyncIterator[Settings]:
    """The services an episode needs, on the scripted policy model and a Postgres database of
    their own; yields the settings that reach them."""
    with scratch_database("gearshift_cli") as url:
        async with serve_scripted(model) as policy_url:
            base = settings.with_policy(policy_url).model_copy(update={"database_url": url})
            async with embedded(base, EPISODE_PATH) as platform:
                yield platform.settings


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    async with episode_stack(Settings(data_dir=tmp_path_factory.mktemp("cli"), metrics_port=0)) as running:
        yield running


@pytest.fixture
def gearshift(stack, monkeypatch):
    """Runs a gearshift command on the stack: await gearshift(*args, columns=80, terminal=True)
    gives (exit code, output without colours)."""
    monkeypatch.setenv("GEARSHIFT_STORE_ADDR", stack.store_addr)
    if stack.auth_token:
        monkeypatch.setenv("GEARSHIFT_AUTH_TOKEN", stack.token())
    monkeypatch.setenv("NO_COLOR", "1")
    get_settings.cache_clear()

    async def run(*args: str, columns: int = 80, terminal: bool = True) -> tuple[int, str]:
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.setenv("TTY_COMPATIBLE", "1" if terminal else "0")
        # In a thread: the command runs its own event loop, and the stack serves from this one.
        result = await asyncio.to_thread(CliRunner().invoke, main, list(args))
        return result.exit_code, Text.from_ansi(result.output).plain

    yield run
    get_settings.cache_clear()
