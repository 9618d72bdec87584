"""Publishing to the built-in policy server: the switch happens while a generation is in
flight, which finishes on the old weights; the switch time is measured."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Checkpoint
from gearshift.orchestration.publishing import publish_builtin
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings

PROMPT = "Once upon a time"
LONG = {"max_tokens": 200, "temperature": 0, "ignore_eos": True}


async def test_publish_switches_a_running_server_without_dropping_the_request_in_flight(tmp_path, tiny_models):
    old, new = tiny_models
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING",
                        policy_server=PolicyServerSettings(model=str(old), port=0, threads=1, max_tokens_cap=1000))
    async with running(settings) as server:
        settings = settings.with_policy(server.base_url)
        async with PolicyClient(server.base_url, "smollm2", retries=0) as client:
            on_old = (await client.complete(PROMPT, **LONG)).text
            stream = client.stream(PROMPT, **LONG)
            pieces = [(await anext(stream)).text]
            report = await publish_builtin(Checkpoint(id="tiny-1", uri=str(new)), settings)
            pieces += [chunk.text async for chunk in stream]
            assert "".join(pieces) == on_old  # the request in flight finished, on the old weights
            assert report.details["in_flight"] == 1 and report.details["path"] == str(new)
            assert 0 < report.switch_seconds < 3.0
            assert (await client.complete(PROMPT, **LONG)).text != on_old
        assert server.engine.current.path == new
