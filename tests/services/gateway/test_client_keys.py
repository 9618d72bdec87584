"""Client API keys against the embedded platform over loopback (real gRPC services, the store on
Postgres, the real default policy, the gateway reading a keys file): a client key opens the
gateway and nothing behind it, a key removed from the file is refused within seconds, feedback
comes only from the key that was served the trajectory, and the key's name is on what it caused."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest
from gearshift import tls, weights
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.services.gateway.api_keys import key_hash, new_key
from gearshift.settings import GatewaySettings, Settings, TlsSettings
from gearshift.topology import GRPC_SERVICE_NAMES

from tests.services.gateway.conftest import TOKEN, stack_settings

pytestmark = pytest.mark.model

ALICE, BOB, CAROL = new_key(), new_key(), new_key()
ASK = [{"role": "user", "content": "What is the capital of France?"}]
REVOKED_WITHIN_SECONDS = 2.0


@dataclass
class Keyed:
    settings: Settings
    base_url: str
    keys_file: Path
    store: store_pb2_grpc.TrajectoryStoreStub  # with the platform token


def write_keys(path: Path, **keys: str) -> None:
    partial = path.with_name("partial")
    partial.write_text(json.dumps({name: key_hash(key) for name, key in keys.items()}))
    os.replace(partial, path)  # as a Secret volume swaps its files


@pytest.fixture(scope="module")
async def keyed(postgres_url, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("keys")
    keys_file = data_dir / "api-keys.json"
    write_keys(keys_file, alice=ALICE, bob=BOB, carol=CAROL)
    settings = stack_settings(postgres_url, data_dir, GatewaySettings(api_keys_file=keys_file))
    async with embedded(settings, policy_model=weights.DEFAULT) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
        yield Keyed(platform.settings, f"http://{platform.settings.gateway_addr}/v1", keys_file, store_pb2_grpc.TrajectoryStoreStub(ch))


def client_of(keyed: Keyed, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=keyed.base_url, api_key=key, max_retries=0, timeout=600)


def every_method() -> list[tuple[str, str, bool]]:
    """(service, /package.Service/Method, server-streaming) of every rpc of every internal gRPC service."""
    methods = []
    for name in GRPC_SERVICE_NAMES:
        module = importlib.import_module(f"gearshift.api.{name}.v1.{name}_pb2")
        for service in module.DESCRIPTOR.services_by_name.values():
            methods += [(name, f"/{service.full_name}/{m.name}", m.server_streaming) for m in service.methods]
    return methods


async def status_of(address: str, method: str, streaming: bool, bearer: str, tls_settings: TlsSettings | None = None) -> grpc.StatusCode:
    """The status of one call with an empty request (the interceptor judges the caller before the
    request), over TLS when tls_settings are given."""
    metadata = (("authorization", f"Bearer {bearer}"),)
    if tls_settings:
        opened = grpc.aio.secure_channel(address, tls.channel_credentials(tls_settings), options=tls.channel_options(tls_settings))
    else:
        opened = grpc.aio.insecure_channel(address)
    async with opened as ch:
        try:
            if streaming:
                async for _ in ch.unary_stream(method)(b"", metadata=metadata, timeout=30):
                    pass
            else:
                await ch.unary_unary(method)(b"", metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_a_client_key_opens_the_gateway_and_nothing_behind_it(keyed):
    async with client_of(keyed, ALICE) as alice:
        assert [model.id for model in (await alice.models.list()).data]
    methods = every_method()
    assert {service for service, _, _ in methods} == set(GRPC_SERVICE_NAMES)
    for service, method, streaming in methods:
        address = getattr(keyed.settings, f"{service}_addr")
        assert await status_of(address, method, streaming, ALICE) == grpc.StatusCode.UNAUTHENTICATED, method
    # The same call with the platform token gets past the interceptor: the refusal was the key's.
    assert await status_of(keyed.settings.store_addr, "/gearshift.store.v1.TrajectoryStore/Export", True, TOKEN) == grpc.StatusCode.OK


async def test_the_platform_token_is_no_client_key_once_keys_exist(keyed):
    async with client_of(keyed, TOKEN) as platform:
        with pytest.raises(openai.AuthenticationError):
            await platform.models.list()


async def test_a_revoked_key_is_refused_within_seconds_without_a_restart(keyed):
    async with client_of(keyed, CAROL) as carol, client_of(keyed, ALICE) as alice:
        await carol.models.list()
        write_keys(keyed.keys_file, alice=ALICE, bob=BOB)
        revoked_at = time.monotonic()
        while True:
            try:
                await carol.models.list()
            except openai.AuthenticationError as refused:
                assert "revoked" in refused.message
                break
            assert time.monotonic() - revoked_at < REVOKED_WITHIN_SECONDS, "the revoked key is still accepted"
            await asyncio.sleep(0.05)
        await alice.models.list()  # the keys left in the file still work


async def test_the_key_name_is_on_the_trajectory_and_only_its_key_gives_feedback(keyed):
    async with client_of(keyed, ALICE) as alice, client_of(keyed, BOB) as bob:
        # metadata cannot pass for another key: the gateway writes the label
        raw = await alice.chat.completions.with_raw_response.create(model="gearshift-instant", messages=ASK, metadata={"api_key": "bob"})
        trajectory_id = raw.headers["x-gearshift-trajectory-id"]
        stored = (await keyed.store.Get(store_pb2.GetRequest(id=trajectory_id))).trajectory
        assert stored.labels["api_key"] == "alice"

        with pytest.raises(openai.PermissionDeniedError) as refused:
            await bob.post("/feedback", body={"trajectory_id": trajectory_id, "correct": True}, cast_to=object)
        assert refused.value.param == "trajectory_id" and "not served to this API key" in refused.value.message
        assert not (await keyed.store.Get(store_pb2.GetRequest(id=trajectory_id))).trajectory.HasField("reward")

        given = await alice.post("/feedback", body={"trajectory_id": trajectory_id, "correct": True}, cast_to=object)
        assert given["reward"]["verifier"] == "feedback"
