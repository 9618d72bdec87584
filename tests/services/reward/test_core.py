"""RewardScorer without gRPC: the wall-clock bound on math-verify running off the main thread."""

from __future__ import annotations

import logging
import threading
import time

from gearshift.rewards import verifiers
from gearshift.services.reward.core import RewardScorer

from tests.libs.rewards.trajectories import INSTANT, rollout


async def test_math_runs_off_the_main_thread_and_a_slow_check_counts_incorrect(settings, caplog, monkeypatch):
    threads = []
    real_math_match = verifiers.math_match

    def slow_math_match(*args):
        threads.append(threading.current_thread())
        time.sleep(0.3)  # slower than the bound below, whatever sympy has cached by now
        return real_math_match(*args)

    monkeypatch.setattr(verifiers, "math_match", slow_math_match)
    scorer = RewardScorer(settings.model_copy(update={"reward": settings.reward.model_copy(update={"verify_timeout_seconds": 0.005})}))
    try:
        slow = rollout(INSTANT, "$(x+1)^{40}$")
        with caplog.at_level(logging.WARNING, logger="gearshift.reward"):
            scored = await scorer.score("$(x+1)^{40}$", None, "correctness", [slow])
        assert not scored.score.rewards[0].correct
        assert "gave up" in caplog.text
        assert threads and threads[0] is not threading.main_thread()
    finally:
        await scorer.close()
