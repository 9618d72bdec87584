"""Executor wiring: channels to the other services, the policy client, and the spool with its
replay task (durable_store.py)."""

from __future__ import annotations

import asyncio

from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.planner.v1 import planner_pb2_grpc
from gearshift.api.reward.v1 import reward_pb2_grpc
from gearshift.api.router.v1 import router_pb2_grpc
from gearshift.api.sandbox.v1 import sandbox_pb2_grpc
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import service_channel
from gearshift.policy_client import PolicyClient
from gearshift.pricing import CostTable
from gearshift.server import Handler, Service
from gearshift.services.executor.durable_store import DurableStore
from gearshift.services.executor.episode import Downstream
from gearshift.services.executor.native import runner_class
from gearshift.services.executor.servicer import ExecutorServicer
from gearshift.services.executor import spool_volume
from gearshift.settings import Settings

FULL_NAME = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
SPOOL_DIR = "executor-spool"  # under data_dir, unless executor.spool_dir names another place


async def build(settings: Settings) -> Service:
    channels = {name: service_channel(name, settings) for name in ("router", "planner", "sandbox", "reward", "store")}
    downstream = Downstream(
        router=router_pb2_grpc.RouterStub(channels["router"]),
        planner=planner_pb2_grpc.PlannerStub(channels["planner"]),
        sandbox=sandbox_pb2_grpc.SandboxStub(channels["sandbox"]),
        reward=reward_pb2_grpc.RewardStub(channels["reward"]),
        store=store_pb2_grpc.TrajectoryStoreStub(channels["store"]),
    )
    spool_root = settings.executor.spool_dir or settings.data_dir / SPOOL_DIR
    stored = DurableStore(downstream.store, spool_volume.claim(spool_root, spool_volume.replica_name()), settings.executor)
    policy = PolicyClient.from_settings(settings)
    runner = runner_class(settings.policy_client.protocol)(
        policy, downstream, settings.executor, settings.limits, CostTable.from_prices(settings.prices), settings.policy_client.model, stored
    )
    stored.start()  # what a previous run left in the spool goes to the store as soon as it answers
    adopting = asyncio.create_task(spool_volume.keep_adopting(stored.spool, spool_root, stored.wake), name="spool-adoption")

    servicer = ExecutorServicer(runner)

    async def close() -> None:
        # Called once the drain is over: the episodes it cut are stored (or spooled) before the
        # channels they are stored through close, and before the process exits.
        await servicer.stop()
        adopting.cancel()
        await stored.close()
        await policy.aclose()
        for channel in channels.values():
            await channel.close()

    return Service("executor", [Handler(executor_pb2_grpc.add_ExecutorServicer_to_server, servicer, FULL_NAME)], on_close=[close])
