"""A closed server lets its weights go: a process that starts servers one after another (an
evaluation per checkpoint in `gearshift loop`, the test suite) must not keep every model it served."""

from __future__ import annotations

import gc
import weakref

from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.server import running

from tests.services.policy_server.conftest import policy_settings


async def test_the_weights_of_a_closed_server_are_freed(tmp_path, tiny_checkpoints):
    async with running(policy_settings(tmp_path, tiny_checkpoints[0])) as server:
        async with PolicyClient(server.base_url, "smollm2", retries=0) as client:
            assert (await client.complete("Once upon a time", max_tokens=4, temperature=0)).text
        model = weakref.ref(server.engine.current.model)
    gc.collect()
    assert model() is None
