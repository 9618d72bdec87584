"""Reward wiring: the scorer, the optional LLM judge's policy client, the servicer."""

from __future__ import annotations

from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.policy_client import PolicyClient
from gearshift.rewards.judge import LLMJudge
from gearshift.server import Handler, Service
from gearshift.services.reward.core import RewardScorer
from gearshift.services.reward.servicer import RewardServicer
from gearshift.settings import Settings

FULL_NAME = reward_pb2.DESCRIPTOR.services_by_name["Reward"].full_name


async def build(settings: Settings) -> Service:
    config = settings.reward
    client = PolicyClient.from_settings(settings) if config.judge_enabled else None
    judge = LLMJudge(client, config.judge_max_tokens, config.judge_model) if client else None
    scorer = RewardScorer(settings, judge)

    async def close() -> None:
        await scorer.close()
        if client is not None:
            await client.aclose()

    servicer = RewardServicer(scorer)
    return Service("reward", [Handler(reward_pb2_grpc.add_RewardServicer_to_server, servicer, FULL_NAME)], on_close=[close])
