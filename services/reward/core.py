"""Reward logic behind the service, free of gRPC: input checks, verification off the event
loop, scoring, pricing and cost of pass. The formulas themselves live in gearshift.rewards and
gearshift.pricing, shared with evaluation and training."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Cost, Mode, TokenUsage, Trajectory
from gearshift.errors import FailedPrecondition, InvalidArgument
from gearshift.pricing import CostTable
from gearshift.rewards import verifiers
from gearshift.rewards.cost_of_pass import CostOfPass, compute_cost_of_pass
from gearshift.rewards.formats import final_answer
from gearshift.rewards.judge import LLMJudge
from gearshift.rewards.scoring import APO, GroupScore, resolve_verifier, score_group, verify
from gearshift.settings import Settings

log = logging.getLogger("gearshift.reward")

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class ScoredGroup:
    """A scored group, each rollout's cost and the tokens a judge spent on it, in rollout order."""

    score: GroupScore
    costs: list[Cost]
    judge_usage: list[TokenUsage]


class RewardScorer:
    """Scores rollout groups, prices trajectories and computes cost of pass."""

    def __init__(self, settings: Settings, judge: LLMJudge | None = None):
        self.config = settings.reward
        self.limits = settings.limits
        self.prices = CostTable.from_prices(settings.prices)
        self.judge = judge
        # math-verify runs with its signal timeouts off, so it gets its own threads and a
        # wall-clock bound here; a runaway check keeps its thread but not the request.
        self._pool = ThreadPoolExecutor(self.config.verify_threads, thread_name_prefix="verify")
        self._slots = asyncio.Semaphore(self.config.verify_threads)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def score(self, reference: str, verifier: str | None, kind: str, rollouts: Sequence[Trajectory]) -> ScoredGroup:
        """Verifies every rollout's answer, then applies the reward formula to the group."""
        self._check_group(reference, kind, rollouts)
        costs = [self._price(rollout, f"rollout {i}: ") for i, rollout in enumerate(rollouts)]
        name = resolve_verifier(verifier, reference)
        if name == verifiers.JUDGE and self.judge is None:
            raise FailedPrecondition("the LLM judge is off; set GEARSHIFT_REWARD__JUDGE_ENABLED=true to use VERIFIER_JUDGE")
        answers = [final_answer(rollout) for rollout in rollouts]
        for index, answer in enumerate(answers):
            if len(answer) > self.limits.max_answer_chars:
                raise InvalidArgument(f"rollout {index}: answer longer than {self.limits.max_answer_chars} characters")
        # Identical answers (the judge: identical question and answer) are checked once.
        keys = [(rollout.query if name == verifiers.JUDGE else "", answer) for rollout, answer in zip(rollouts, answers)]
        unique = list(dict.fromkeys(keys))
        results = await asyncio.gather(*(self._verify(question, answer, reference, name) for question, answer in unique))
        verdicts = dict(zip(unique, results))
        correct = [verdicts[key][0] for key in keys]
        # A judgement shared by identical answers was paid once: by the first of them.
        first = {key: keys.index(key) for key in unique}
        usage = [verdicts[key][1] if first[key] == index else TokenUsage() for index, key in enumerate(keys)]
        return ScoredGroup(score_group(rollouts, correct, kind, name, self.config), costs, usage)

    def price(self, trajectory: Trajectory) -> Cost:
        """The trajectory's cost breakdown from the shared price table."""
        self._check_size(trajectory, "")
        return self._price(trajectory, "")

    async def cost_of_pass(
        self, costs: Sequence[float], correct: Sequence[bool], samples: int, confidence: float, seed: int,
        items: Sequence[str] | None = None,
    ) -> CostOfPass:
        """Total cost / correct answers with a seeded item-level bootstrap interval (0 = defaults)."""
        if not costs:
            raise InvalidArgument("no outcomes: cost of pass needs at least one attempt")
        if len(costs) > self.config.max_outcomes:
            raise InvalidArgument(f"{len(costs)} outcomes; at most {self.config.max_outcomes} per request")
        for index, cost in enumerate(costs):
            if not math.isfinite(cost) or cost < 0:
                raise InvalidArgument(f"outcome {index} has cost {cost}; costs must be finite and non-negative")
        samples = samples or self.config.bootstrap_samples
        if not 0 < samples <= self.config.max_bootstrap_samples:
            raise InvalidArgument(f"bootstrap_samples must lie in 1..{self.config.max_bootstrap_samples}")
        confidence = confidence or DEFAULT_CONFIDENCE
        if not 0 < confidence < 1:
            raise InvalidArgument(f"confidence {confidence} must lie strictly between 0 and 1")
        return await asyncio.to_thread(compute_cost_of_pass, costs, correct, samples, confidence, seed, items)

    async def _verify(self, question: str, answer: str, reference: str, name: str) -> tuple[bool, TokenUsage]:
        """The verdict, and the tokens a judge spent reaching it."""
        if not answer.strip():
            return False, TokenUsage()
        if name == verifiers.JUDGE:
            verdict = await self.judge.judge(question, answer, reference)
            return verdict.correct, verdict.usage.tokens()
        async with self._slots:
            work = asyncio.get_running_loop().run_in_executor(self._pool, verify, answer, reference, name, self.config)
            try:
                return await asyncio.wait_for(work, self.config.verify_timeout_seconds), TokenUsage()
            except TimeoutError:
                log.warning("%s check gave up after %.1fs; counted incorrect", name, self.config.verify_timeout_seconds)
                return False, TokenUsage()

    def _check_group(self, reference: str, kind: str, rollouts: Sequence[Trajectory]) -> None:
        if not rollouts:
            raise InvalidArgument("no rollouts: Score needs a group of at least one")
        if len(rollouts) > self.config.max_group_size:
            raise InvalidArgument(f"{len(rollouts)} rollouts; at most {self.config.max_group_size} per group")
        if not reference.strip():
            raise InvalidArgument("reference_answer is empty; correctness needs a reference")
        if len(reference) > self.limits.max_answer_chars:
            raise InvalidArgument(f"reference_answer longer than {self.limits.max_answer_chars} characters")
        for index, rollout in enumerate(rollouts):
            self._check_size(rollout, f"rollout {index}: ")
            if kind == APO and rollout.mode == Mode.MODE_UNSPECIFIED:
                raise InvalidArgument(f"rollout {index}: APO needs the mode each rollout ran in")

    def _check_size(self, trajectory: Trajectory, where: str) -> None:
        if len(trajectory.answer) > self.limits.max_answer_chars:
            raise InvalidArgument(f"{where}answer longer than {self.limits.max_answer_chars} characters")
        if len(trajectory.turns) > self.limits.max_turns:
            raise InvalidArgument(f"{where}{len(trajectory.turns)} turns; at most {self.limits.max_turns}")

    def _price(self, trajectory: Trajectory, where: str) -> Cost:
        try:
            return self.prices.price_trajectory(trajectory)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}{exc}") from exc
