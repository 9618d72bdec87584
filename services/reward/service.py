"""Reward wiring: the scorer, the optional LLM judge's HTTP client, the servicer."""

from __future__ import annotations

import httpx

from gearshift.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.rewards.judge import LLMJudge
from gearshift.server import Handler, Service
from gearshift.services.reward.core import RewardScorer
from gearshift.services.reward.servicer import RewardServicer
from gearshift.settings import Settings

FULL_NAME = reward_pb2.DESCRIPTOR.services_by_name["Reward"].full_name


async def build(settings: Settings) -> Service:
    config = settings.reward
    client = httpx.AsyncClient(timeout=config.judge_timeout_seconds) if config.judge_enabled else None
    judge = None
    if client is not None:
        api_key = settings.policy.api_key.get_secret_value() if settings.policy.api_key else None
        model = config.judge_model or settings.policy_model
        judge = LLMJudge(client, settings.policy_url, model, config.judge_max_tokens, api_key)
    scorer = RewardScorer(settings, judge)

    async def close() -> None:
        await scorer.close()
        if client is not None:
            await client.aclose()

    servicer = RewardServicer(scorer)
    return Service("reward", [Handler(reward_pb2_grpc.add_RewardServicer_to_server, servicer, FULL_NAME)], on_close=[close])
