"""POST /v1/load: a new checkpoint becomes current while a generation in flight finishes on the
old one; and the admin and API tokens guard what they should."""

from __future__ import annotations

import httpx
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.server import running
from pydantic import SecretStr

from tests.services.policy_server.conftest import policy_settings

PROMPT = "Once upon a time"
LONG = {"max_tokens": 250, "temperature": 0, "ignore_eos": True}


async def test_switch_keeps_the_generation_in_flight_on_the_old_model(tmp_path, tiny_checkpoints):
    old, new = tiny_checkpoints
    async with running(policy_settings(tmp_path, old)) as server:
        async with PolicyClient(server.base_url, "smollm2", retries=0) as client:
            on_old = (await client.complete(PROMPT, **LONG)).text

            stream = client.stream(PROMPT, **LONG)
            pieces = [(await anext(stream)).text]
            report = await client.load(str(new))
            pieces += [chunk.text async for chunk in stream]

            assert report["in_flight"] == 1 and report["path"] == str(new)
            assert report["total_seconds"] < 3.0 and report["swap_seconds"] < report["total_seconds"]
            assert "".join(pieces) == on_old  # every token of it came from the old weights
            on_new = (await client.complete(PROMPT, **LONG)).text
            assert on_new != on_old
            assert (await client.models()) == ["smollm2"]
            assert server.engine.current.path == new and server.engine.in_flight == 0


async def test_switch_to_a_missing_checkpoint_is_400_and_changes_nothing(tmp_path, tiny_checkpoints):
    async with running(policy_settings(tmp_path, tiny_checkpoints[0])) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            for model in (str(tmp_path / "nowhere"), str(tmp_path)):
                response = await http.post("/load", json={"model": model})
                assert response.status_code == 400
                assert "checkpoint" in response.json()["error"]["message"]
            renamed = await http.post("/load", json={"model": str(tiny_checkpoints[1]), "served_model_name": "policy-v2"})
            assert renamed.json()["model"] == "policy-v2"
            assert [m["id"] for m in (await http.get("/models")).json()["data"]] == ["policy-v2"]
        assert server.engine.current.path == tiny_checkpoints[1]


async def test_tokens_guard_the_api_and_the_admin_route(tmp_path, tiny_checkpoints):
    settings = policy_settings(
        tmp_path, tiny_checkpoints[0], api_key=SecretStr("client-key"), admin_token=SecretStr("admin-key")
    )
    async with running(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            body = {"prompt": PROMPT, "max_tokens": 2}
            assert (await http.post("/completions", json=body)).status_code == 401
            authorised = {"authorization": "Bearer client-key"}
            assert (await http.post("/completions", json=body, headers=authorised)).status_code == 200
            load = {"model": str(tiny_checkpoints[1])}
            assert (await http.post("/load", json=load, headers=authorised)).status_code == 401
            admin = {"authorization": "Bearer admin-key"}
            assert (await http.post("/load", json=load, headers=admin)).status_code == 200
            health = await http.get(server.base_url.removesuffix("/v1") + "/health")
            assert health.status_code == 200  # probes need no token
