"""The suite's policy server: the instant stand-in (gearshift.testing.scripted_policy, every
mode answers Paris) taking a fixed time per call, as a model does, so that episodes are in flight
when a fault strikes; on a fixed port, so that a killed one is started again where every client
looks for it.

    python -m tests.faults.policy_stub PORT SECONDS_PER_CALL
"""

from __future__ import annotations

import asyncio
import sys

from gearshift.testing.scripted_policy import instant_policy, serve_scripted


async def serve(port: int, seconds: float) -> None:
    async def respond(body: dict) -> str:
        await asyncio.sleep(seconds)
        return instant_policy(body)

    async with serve_scripted(respond, model="smollm2", port=port) as url:
        print(url, flush=True)  # it listens
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), float(sys.argv[2])))
