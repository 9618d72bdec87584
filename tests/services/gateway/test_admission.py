"""Admission control against the embedded platform over loopback (real gRPC services, the store
on Postgres, the real default policy, the gateway reading a keys file): a key flooding past its
rate is refused 429 with Retry-After in OpenAI's shape while another key's completions take what
they took without the flood, and a key at its bound of requests in flight is refused until one
ends."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import httpx
import pytest
from gearshift import weights
from gearshift.embedded import embedded
from gearshift.services.gateway.api_keys import new_key
from gearshift.settings import ClientKeyPolicy, GatewaySettings

from tests.services.gateway.conftest import stack_settings
from tests.services.gateway.test_client_keys import write_keys

pytestmark = pytest.mark.model

FLOODER, BOB, CAROL = new_key(), new_key(), new_key()
# A short answer: the completion's time is mostly the platform's, not the generation's.
INSTANT = {"model": "gearshift-instant", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8}
FLOOD = 64
ROUNDS = 4  # bob's completions with the flood (each beside a quarter of it) and as many without
SLOWER_AT_MOST = 3.0  # bob's median under the flood against without (a shared 2-core machine is noisy)
POLICIES = {
    "flooder": ClientKeyPolicy(rate_per_second=0.0001, burst=1),  # one request, then one every 10 000 s
    "carol": ClientKeyPolicy(max_concurrent=1),
}


@dataclass
class Admitting:
    base_url: str


@pytest.fixture(scope="module")
async def admitting(postgres_url, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("admission")
    keys_file = data_dir / "api-keys.json"
    write_keys(keys_file, flooder=FLOODER, bob=BOB, carol=CAROL)
    settings = stack_settings(postgres_url, data_dir, GatewaySettings(api_keys_file=keys_file, key_policies=POLICIES))
    async with embedded(settings, policy_model=weights.DEFAULT) as platform:
        yield Admitting(f"http://{platform.settings.gateway_addr}/v1")


def client_of(admitting: Admitting, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=admitting.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=600)


async def timed_completion(http: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    reply = await http.post("/chat/completions", json=INSTANT)
    assert reply.status_code == 200, reply.text
    return time.perf_counter() - started


async def test_a_flood_from_one_key_is_refused_and_another_key_is_served_as_without_it(admitting):
    async with client_of(admitting, FLOODER) as flooder, client_of(admitting, BOB) as bob:
        await timed_completion(bob)  # warm: the first episode loads what later ones reuse
        assert (await flooder.post("/chat/completions", json=INSTANT)).status_code == 200  # its burst

        # Rounds with and without the flood alternate: whatever else loads the machine meanwhile weighs on both.
        alone, flooded, refused = [], [], []
        for _ in range(ROUNDS):
            alone.append(await timed_completion(bob))
            seconds, *replies = await asyncio.gather(timed_completion(bob), *(flooder.post("/chat/completions", json=INSTANT)
                                                                              for _ in range(FLOOD // ROUNDS)))
            flooded.append(seconds)
            refused += replies

    assert len(refused) == FLOOD
    for reply in refused:
        assert reply.status_code == 429, reply.text
        assert int(reply.headers["retry-after"]) >= 1000  # its next token, at 0.0001 a second
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "rate_limit_exceeded", None)
        assert "0.0001 requests a second" in error["message"]
    assert statistics.median(flooded) <= SLOWER_AT_MOST * statistics.median(alone), (flooded, alone)


async def test_a_key_at_its_bound_of_requests_in_flight_is_refused_until_one_ends(admitting):
    release = asyncio.Event()

    async def slow_body():  # a request whose body is still on its way holds its place
        yield b'{"model": "gearshift-instant", '
        await release.wait()
        yield b'"messages": [{"role": "user", "content": "What is 2 + 2?"}]}'

    async with client_of(admitting, CAROL) as carol, client_of(admitting, BOB) as bob:
        held = asyncio.create_task(carol.post("/chat/completions", content=slow_body(), headers={"content-type": "application/json"}))
        for _ in range(100):  # until the gateway holds it
            await asyncio.sleep(0.05)
            if (refused := await carol.get("/models")).status_code == 429:
                break
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert (await bob.get("/models")).status_code == 200  # another key is not held up
        release.set()
        assert (await held).status_code == 200
        assert (await carol.get("/models")).status_code == 200
