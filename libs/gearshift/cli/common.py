"""What the commands share: failures as a one-line message, and one way to call the store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator

import click
import grpc
import pydantic

from gearshift.errors import GearshiftError


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """gRPC failures, domain errors and bad values become a one-line CLI message, not a traceback."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None
    except pydantic.ValidationError as exc:  # a config file's fields: one clause per field
        clauses = (f"{'.'.join(map(str, error['loc'])) or exc.title}: {error['msg']}" for error in exc.errors())
        raise click.ClickException("; ".join(clauses)) from None
    except (GearshiftError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def run_or_fail(work: Awaitable):
    """Runs a coroutine to its end under one_line_errors."""
    with one_line_errors():
        return asyncio.run(work)


def store_call(call):
    """Runs one rpc on the configured store: store_call(lambda stub: stub.Get(...))."""
    from gearshift.api.store.v1 import store_pb2_grpc
    from gearshift.clients import service_channel

    async def run():
        async with service_channel("store") as channel:
            return await call(store_pb2_grpc.TrajectoryStoreStub(channel))

    return run_or_fail(run())
