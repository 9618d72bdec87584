"""What the commands share: the running stack's addresses, failures as a one-line message, and
one way to call the store."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Iterator

import click
import grpc
import pydantic

from gearshift.errors import GearshiftError
from gearshift.settings import Settings, get_settings
from gearshift.topology import SERVICES

# What a channel says when it reaches no server (refused, unresolved), as against an error a
# server returned.
UNREACHED = re.compile(r"failed to connect|connections to all backends failing|errors resolving|dns resolution failed|"
                       r"connection refused", re.IGNORECASE)
START_HINT = "start the platform with `gearshift up`"


def use_running_stack(settings: Settings) -> dict | None:
    """Points the addresses that no variable (GEARSHIFT_*_ADDR, GEARSHIFT_POLICY_CLIENT__URL) sets
    at the `gearshift up` serving from settings.data_dir, as its stack file says; returns that
    record, or None when no live `gearshift up` serves from there."""
    from gearshift.stack import read_stack_file

    running = read_stack_file(settings.data_dir)
    if running is None:
        return None
    for spec in SERVICES:
        if spec.address_setting not in settings.model_fields_set and spec.name in running["addresses"]:
            setattr(settings, spec.address_setting, running["addresses"][spec.name])
    if "url" not in settings.policy_client.model_fields_set and running.get("policy_url"):
        settings.policy_client = settings.policy_client.model_copy(update={"url": running["policy_url"]})
    return running


def unreached(details: str, settings: Settings) -> str | None:
    """For a call that reached no server: which service (by the address or port the channel
    names) and how to start it, in one line; None for an error a server returned."""
    if not UNREACHED.search(details or ""):
        return None
    cause = "connection refused" if "refused" in details.lower() else "no server answers there"
    for spec in SERVICES:
        address = settings.address_of(spec.name)
        port = address.rsplit(":", 1)[-1]
        if address in details or re.search(rf":{re.escape(port)}\b", details):
            return (f"cannot reach the {spec.name} at {address} ({cause}): {START_HINT}, "
                    f"or set GEARSHIFT_{spec.address_setting.upper()} to where it serves")
    return f"cannot reach a platform service ({details}): {START_HINT}, or set its GEARSHIFT_*_ADDR"


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """gRPC failures, domain errors and bad values become a one-line CLI message, not a traceback."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE and (message := unreached(exc.details(), get_settings())):
            raise click.ClickException(message) from None
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
