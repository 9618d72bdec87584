"""The gateway's answer to an executor that refuses, over a real socket with a stand-in executor
(no platform): the executor's RESOURCE_EXHAUSTED is the 429 rate_limit_error with Retry-After
that the policy server gives a full queue (tests/services/policy_server/test_batching.py)."""

from __future__ import annotations

import grpc
import httpx
import pytest
from gearshift.http_server import HttpService, running
from gearshift.openai_http import RETRY_AFTER_SECONDS
from gearshift.services.gateway.api_keys import ApiKeys
from gearshift.services.gateway.app import Gateway, create_app
from gearshift.settings import Settings

ASK = {"model": "gearshift-instant", "messages": [{"role": "user", "content": "hi"}]}


class RefusedCall:
    """A Solve call whose first read fails with code."""

    def __init__(self, code: grpc.StatusCode):
        self.code = code

    async def read(self):
        raise grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="queue full")

    def done(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False


class RefusingExecutor:
    def __init__(self, code: grpc.StatusCode):
        self.code = code

    def Solve(self, request, timeout=None) -> RefusedCall:
        return RefusedCall(self.code)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_executor_that_is_full_is_a_429_rate_limit_error_with_retry_after(tmp_path, stream):
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING")
    app = create_app(Gateway(settings, RefusingExecutor(grpc.StatusCode.RESOURCE_EXHAUSTED), None, None, ApiKeys(None, None, False)))
    async with running(HttpService("gateway", app, host="127.0.0.1"), settings) as gateway:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}/v1", timeout=30) as http:
            reply = await http.post("/chat/completions", json=ASK | {"stream": stream})
    assert reply.status_code == 429 and reply.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    assert reply.json() == {"error": {"message": "executor: queue full", "type": "rate_limit_error", "param": None, "code": 429}}
