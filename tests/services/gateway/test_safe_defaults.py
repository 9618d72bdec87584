"""The gateway's safe defaults, on the real gateway over HTTP with no platform behind it (these
routes need none): the reserved key names, the start log line saying how clients are
authenticated, and a client's traceparent continued but forcing sampling only for a trusted key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from gearshift import tracing
from gearshift.http_server import running
from gearshift.services.gateway.api_keys import ApiKeys, check_key_name, key_hash, new_key, read_keys
from gearshift.services.gateway.service import build
from gearshift.settings import ClientKeyPolicy, GatewaySettings, Settings, TracingSettings
from gearshift.testing.otlp_receiver import OtlpReceiver
from gearshift.testing.ports import free_port

ALICE, BOB = new_key(), new_key()
# Trace ids whose low 64 bits put them inside and outside a 0.5 sampling ratio (TraceIdRatioBased).
KEPT_BY_RATIO = "0af7651916cd43dd0000000000000001"
DROPPED_BY_RATIO = "0af7651916cd43ddffffffffffffff01"
PARENT = "b7ad6b7169203331"


def keys_file(tmp_path, **keys: str):
    path = tmp_path / "api-keys.json"
    path.write_text(json.dumps({name: key_hash(key) for name, key in keys.items()}))
    return path


@pytest.mark.parametrize("name", ["platform", "anonymous"])
async def test_a_keys_file_naming_a_reserved_name_accepts_no_key(tmp_path, caplog, name):
    with pytest.raises(ValueError, match="reserved"):
        check_key_name(name)
    path = keys_file(tmp_path, alice=ALICE, **{name: BOB})
    with pytest.raises(ValueError, match=f"{name}.*reserved"):
        read_keys(path)
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING", gateway=GatewaySettings(api_keys_file=path))
    async with running(await build(settings), settings) as gateway:
        # Logged at start, not at the first request.
        assert any("reserved" in record.getMessage() for record in caplog.records), caplog.text
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}/v1", timeout=30) as http:
            for key in (ALICE, BOB):  # fail closed: a broken file accepts no key
                assert (await http.get("/models", headers={"Authorization": f"Bearer {key}"})).status_code == 401


def start_line(tmp_path, **env: str) -> str:
    """The gateway process's line saying it listens (then it is stopped)."""
    port = free_port()
    environment = {**os.environ, "GEARSHIFT_PORT": str(port), "GEARSHIFT_METRICS_PORT": "0", "GEARSHIFT_DATA_DIR": str(tmp_path), **env}
    gateway = subprocess.Popen([sys.executable, "-m", "gearshift.services.gateway"], env=environment, stderr=subprocess.PIPE, text=True)
    try:
        for line in gateway.stderr:
            if "listening on" in line:
                return line
        raise AssertionError("the gateway exited before listening")
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)


def test_the_start_line_says_how_clients_are_authenticated(tmp_path):
    path = keys_file(tmp_path, alice=ALICE)
    keyed = start_line(tmp_path, GEARSHIFT_GATEWAY__API_KEYS_FILE=str(path), GEARSHIFT_AUTH_TOKEN="t")
    assert f"client keys from {path}" in keyed and "auth off" not in keyed
    assert ApiKeys(None, "t", False).describe() == "client key: the platform token"
    assert ApiKeys(None, None, False).describe() == "client keys off: the gateway is open"


async def test_a_traceparent_forces_sampling_only_for_a_trusted_key(tmp_path):
    with OtlpReceiver() as receiver:
        settings = Settings(
            data_dir=tmp_path, metrics_port=0, log_level="WARNING",
            gateway=GatewaySettings(api_keys_file=keys_file(tmp_path, alice=ALICE, bob=BOB), key_policies={"alice": ClientKeyPolicy(trust_trace=True)}),
            tracing=TracingSettings(enabled=True, otlp_endpoint=receiver.endpoint, sample_ratio=0.5),
        )
        async with running(await build(settings), settings) as gateway, httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}/v1") as http:
            async def models(key: str, trace_id: str) -> None:
                headers = {"Authorization": f"Bearer {key}", "traceparent": f"00-{trace_id}-{PARENT}-01"}
                assert (await http.get("/models", headers=headers)).status_code == 200

            await models(BOB, DROPPED_BY_RATIO)  # its sampled flag is not obeyed: the ratio drops it
            await models(BOB, KEPT_BY_RATIO)  # continued: the ratio keeps it, under the client's parent
            await models(ALICE, DROPPED_BY_RATIO.replace("0af7", "1af7"))  # trusted: its flag is obeyed
        tracing.flush()
        kept = {span.trace_id: span for span in receiver.spans}
    assert set(kept) == {KEPT_BY_RATIO, DROPPED_BY_RATIO.replace("0af7", "1af7")}
    assert {span.parent_span_id for span in kept.values()} == {PARENT}
