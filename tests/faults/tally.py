"""What each fault did to the episodes, counted against the store: a row per fault of the
episodes acknowledged, stored (an acknowledged trajectory in the store afterwards, its id and its
query the request's), failed with a clear error, and lost (acknowledged but not stored, or no
clear outcome at all); and any query stored twice, which would be one request run as two episodes."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings

from tests.faults.faults import FaultRun, Form
from tests.faults.load import ACKNOWLEDGED, FAILED, UNCLEAR, Outcome

REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16,}")


@dataclass
class Row:
    fault: str
    down_seconds: float
    requests: int
    acknowledged: int
    stored: int
    failed: int
    lost: int
    throttled: int
    feedback: Counter  # ACKNOWLEDGED, FAILED, UNCLEAR -> count
    told: Counter  # what the clients that got no answer (or no graded feedback) were told -> count
    notes: list[str]
    back: bool
    lost_examples: list[str]


async def stored_queries(settings: Settings) -> dict[str, str]:
    """Trajectory id -> query of every trajectory in the store (the suite's own database)."""
    async with channel(settings.store_addr, settings) as ch:
        exported = store_pb2_grpc.TrajectoryStoreStub(ch).Export(store_pb2.ExportRequest())
        return {trajectory.id: trajectory.query async for trajectory in exported}


def rows(runs: list[FaultRun], stored: dict[str, str]) -> list[Row]:
    return [row(run, stored) for run in runs]


def row(run: FaultRun, stored: dict[str, str]) -> Row:
    acknowledged = [o for o in run.outcomes if o.kind == ACKNOWLEDGED]
    kept = [o for o in acknowledged if stored.get(o.trajectory_id) == o.query]
    unclear = [o for o in run.outcomes if o.kind == UNCLEAR]
    missing = [o for o in acknowledged if stored.get(o.trajectory_id) != o.query]
    told = Counter(_gist(o) for o in run.outcomes if o.kind != ACKNOWLEDGED)
    told += Counter(f"feedback: {_gist(o)}" for o in run.feedback if o.kind != ACKNOWLEDGED)
    lost = [f"acknowledged, not stored: {o.trajectory_id} ({o.query})" for o in missing]
    lost += [f"{o.query}: {o.detail}" for o in unclear + [f for f in run.feedback if f.kind == UNCLEAR]]
    return Row(run.fault, run.down_seconds, len(run.outcomes), len(acknowledged), len(kept),
               sum(1 for o in run.outcomes if o.kind == FAILED), len(missing) + len(unclear), run.throttled,
               Counter(o.kind for o in run.feedback), told, run.notes, run.back, lost)


def twice(stored: dict[str, str]) -> list[str]:
    """Queries with more than one stored trajectory."""
    return [query for query, count in Counter(stored.values()).items() if count > 1]


def _gist(outcome: Outcome) -> str:
    """What the client was told, with ids taken out so that alike failures count together."""
    return REQUEST_ID.sub("…", outcome.detail)[:110]


def table(rows: list[Row], form: Form) -> str:
    """The rows as a Markdown table, then what the clients that got no answer were told."""
    lines = [
        f"Fault suite, {form.name} form: {form.clients} clients through the gateway, {form.rate:g} requests a second among them, "
        f"the policy {form.seconds_per_call:g} s a call; {form.before:g} s of load before each fault, "
        f"{form.after:g} s after it healed; replicas killed for {form.down:g} s, Postgres cut for {form.outage:g} s.",
        "",
        "| fault | broken → back in use (s) | episodes asked for | acknowledged | stored | failed (clear error) | lost | 429 then retried "
        "| feedback ok / failed | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r.fault} | {r.down_seconds:.1f} | {r.requests} | {r.acknowledged} | {r.stored} | {r.failed} | {r.lost} | {r.throttled} | "
                     f"{r.feedback[ACKNOWLEDGED]} / {r.feedback[FAILED] + r.feedback[UNCLEAR]} | {'; '.join(r.notes)} |")
    told = [f"- {r.fault}: {count} × {gist}" for r in rows for gist, count in r.told.most_common()]
    if told:
        lines += ["", "What the clients that got no answer were told:", *told]
    lost = [f"- {r.fault}: {example}" for r in rows for example in r.lost_examples[:5]]
    if lost:
        lines += ["", "Lost, or no clear outcome (the first five of each fault):", *lost]
    return "\n".join(lines)

