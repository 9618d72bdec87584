"""Writes the parsers' conformance corpus: the trajectories the executor stores when the default
policy (on the built-in server) solves the demo's questions and two test items of each headline
family, under the text protocol and the native one, as JSON lines, each native turn with the raw
text the engine split (its sampled ids, decoded). tests/libs/protocol/parsers/test_conformance.py
reads it.

    .venv/bin/python scripts/parser-corpus.py [OUT.jsonl]
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from gearshift import weights
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.cli.platform import DEMO_QUESTIONS
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.suites import get_suite
from gearshift.settings import Settings

OUT = Path(__file__).resolve().parents[1] / "tests" / "libs" / "protocol" / "parsers" / "corpus" / "default_policy.jsonl"


def questions() -> list[tuple[str, str]]:
    items = get_suite("headline").items_per_family("test", 2)
    return [(question, answer) for question, answer, _ in DEMO_QUESTIONS] + [(item.question, item.answer) for item in items]


async def solve_all(settings: Settings, protocol: str, tokenizer) -> list[dict]:
    client = settings.policy_client.model_copy(update={"protocol": protocol, "timeout_seconds": 900.0})
    settings = settings.model_copy(update={"policy_client": client})
    rows = []
    async with embedded(settings, policy_model=weights.DEFAULT) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        for question, answer in questions():
            request = executor_pb2.SolveRequest(query=question, reference_answer=answer)
            trajectory = [event async for event in stub.Solve(request)][-1].final.trajectory
            raw = [tokenizer.decode(turn.token_ids, skip_special_tokens=False) for turn in trajectory.turns] if protocol == "native" else []
            rows.append({"trajectory": MessageToDict(trajectory, preserving_proto_field_name=True), "raw_turns": raw})
            print(f"{protocol}: {question[:60]!r} -> {trajectory.answer[:40]!r}", file=sys.stderr)
    return rows


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=data_dir, log_level="WARNING")
        tokenizer = weights.smollm2_tokenizer(settings.models_dir)
        rows = [row for protocol in ("text", "native") for row in asyncio.run(solve_all(settings, protocol, tokenizer))]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} trajectories to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
