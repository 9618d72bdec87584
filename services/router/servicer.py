"""Router servicer: protobuf <-> ModeRouter."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.errors import InvalidArgument
from gearshift.protocol import prompts
from gearshift.sampling import requested_sampling, sampling_options
from gearshift.services.router.core import ModeRouter
from gearshift.settings import Limits


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, router: ModeRouter, limits: Limits):
        self.router = router
        self.limits = limits

    async def Route(self, request: router_pb2.RouteRequest, context) -> router_pb2.RouteResponse:
        if len(request.query) > self.limits.max_query_chars:
            raise InvalidArgument(f"query longer than {self.limits.max_query_chars} characters")
        if request.strategy not in RoutingStrategy.values():
            raise InvalidArgument(f"unknown strategy {request.strategy}")
        if request.forced_mode not in Mode.values():
            raise InvalidArgument(f"unknown mode {request.forced_mode}")
        prompts.check_conversation(request.conversation, self.limits.max_query_chars * 8)
        decision = await self.router.route(request.query, request.strategy, request.forced_mode,
                                           sampling_options(requested_sampling(request)), request.conversation)
        return router_pb2.RouteResponse(
            mode=decision.mode,
            strategy=decision.strategy,
            rationale=decision.rationale,
            scores=[
                router_pb2.ModeScore(mode=mode, score=score, expected_cost_of_pass_usd=cost)
                for mode, (score, cost) in decision.scores.items()
            ],
            usage=decision.usage,
            assistant_prefix=decision.assistant_prefix,
            attempts=decision.attempts,
            router_version=decision.router_version,
            sampled=decision.sampled,
        )
