"""The promotion gate runs its episodes concurrently, so its policy server can batch them: the
gate's callers (planner, router, executor) over real gRPC, the SQLite store and the reward
service, and a ScriptedPolicy stand-in for the model that counts the requests it holds at once."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, TrajectoryStatus
from gearshift.embedded import embedded
from gearshift.orchestration.evaluators import POLICY_CALLERS, GateEvaluator
from gearshift.orchestration.loop import QUICK_CONFIG, apo_config, loop_settings
from gearshift.settings import Settings
from gearshift.testing.scripted_policy import serve_scripted

EPISODES = 3
HOLD_SECONDS = 2.0  # how long a turn waits for company; only a serial gate ever waits it out


class OverlapProbe:
    """A stand-in model whose turns each wait (up to HOLD_SECONDS) until a second request is in
    flight, recording the most requests it held at once."""

    def __init__(self):
        self.in_flight = self.peak = 0
        self.company = asyncio.Event()

    async def __call__(self, body: dict) -> str:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= 2:
            self.company.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.company.wait(), HOLD_SECONDS)
            return "4</answer>"
        finally:
            self.in_flight -= 1


class ScriptedGate(GateEvaluator):
    """The gate evaluator, its checkpoint served by the stand-in instead of a built-in server."""

    def __init__(self, settings: Settings, policy_url: str, concurrency: int | None = None):
        super().__init__(settings, concurrency=concurrency)
        self.policy_url = policy_url

    def serving(self, checkpoint: Checkpoint):
        return embedded(self.settings.with_policy(self.policy_url), POLICY_CALLERS)


def gate_settings(tmp_path) -> Settings:
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING")
    orchestration = settings.orchestration.model_copy(update={"eval_items": EPISODES, "gate_modes": ["instant"]})
    return settings.model_copy(update={"orchestration": orchestration})


@pytest.mark.parametrize(("concurrency", "overlapping"), [(None, True), (1, False)], ids=["default", "serial"])
async def test_gate_episodes_are_in_flight_together(tmp_path, concurrency, overlapping):
    probe = OverlapProbe()
    settings = gate_settings(tmp_path)
    async with serve_scripted(probe) as url, embedded(settings, ("store", "sandbox", "reward")) as platform:
        gate = ScriptedGate(platform.settings, url, concurrency)
        figures = await gate.run(Checkpoint(id="scripted", kind="policy", uri="unused"))
    assert figures["instant"]["episodes"] == EPISODES
    assert (probe.peak >= 2) is overlapping, f"at most {probe.peak} request(s) in flight"


def test_the_default_gate_and_loop_run_episodes_concurrently():
    assert Settings().orchestration.eval_concurrency > 1
    settings = loop_settings(Settings(metrics_port=0), QUICK_CONFIG)
    assert GateEvaluator(settings).concurrency == QUICK_CONFIG.concurrency > 1
    assert apo_config(QUICK_CONFIG, [])["rollout"]["concurrency"] == QUICK_CONFIG.concurrency


class DropsConnections:
    """A stand-in model that answers its first request, then drops the connection of the next
    `drops` (a server restarting): more than the client's retries, so the episode meeting them fails."""

    def __init__(self, drops: int):
        self.answered, self.drops = 0, drops

    async def __call__(self, body: dict) -> str:
        if self.answered and self.drops:
            self.drops -= 1
            raise ConnectionResetError("dropped by the stand-in")
        self.answered += 1
        return "4</answer>"


async def test_an_episode_failed_on_an_infrastructure_error_runs_again(tmp_path):
    settings = gate_settings(tmp_path)
    model = DropsConnections(settings.policy_client.retries + 1)
    async with serve_scripted(model) as url, embedded(settings, ("store", "sandbox", "reward")) as platform:
        gate = ScriptedGate(platform.settings, url, concurrency=1)
        checkpoint = Checkpoint(id="scripted", kind="policy", uri="unused")
        figures = await gate.run(checkpoint)
    assert model.drops == 0
    statuses = [t.status for t in gate.trajectories[checkpoint.id]]
    assert statuses.count(TrajectoryStatus.TRAJECTORY_STATUS_FAILED) == 1
    assert figures["instant"]["episodes"] == EPISODES  # the failed one ran again: every item counts
