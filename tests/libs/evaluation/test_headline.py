"""`gearshift eval headline` end to end on the embedded stack (every service in process, SQLite
store, gRPC over loopback, the learned router trained, registered, published and served). The
model is a ScriptedPolicy stand-in whose right and wrong answers are known per family and mode,
so the report's figures can be checked against the stored trajectories."""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict

import pytest
from gearshift.api.common.v1.common_pb2 import CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.before_after import compare_runs, write_before_after
from gearshift.evaluation.headline import HeadlinePlan, run_headline
from gearshift.evaluation.report import fetch_run
from gearshift.evaluation.runner import eval_mode_of
from gearshift.evaluation.suites import HEADLINE_FAMILIES, family_of, get_suite
from gearshift.protocol.modes import mode_name
from gearshift.settings import LearnedRouterSettings
from gearshift.testing.scripted_policy import serve_scripted

N, TRAIN_N = 3, 4
ROUTE = {"facts": "default_agent", "chain_sum": "default_agent", "gsm_symbolic": "reasoning_agent",
         "large_multiplication": "toolcalling_agent"}
# Which families each forced mode gets right: instant the direct ones, reasoning also the
# multi-step ones, agentic everything (the model routing itself to the oracle mode).
RIGHT = {"instant": {"facts", "chain_sum"}, "reasoning": {"facts", "chain_sum", "gsm_symbolic"}, "agentic": set(HEADLINE_FAMILIES)}


def known_items():
    suite = get_suite("headline")
    return {item.question: item for split, n in (("test", N), ("train", TRAIN_N)) for item in suite.items_per_family(split, n)}


def scripted(route: dict[str, str]):
    items = known_items()

    def respond(body: dict) -> str:
        text = "\n".join(str(m.get("content", "")) for m in body.get("messages") or []) + str(body.get("prompt", ""))
        item = next((item for question, item in items.items() if question in text), None)
        family = family_of(item.id) if item else "facts"
        answer = lambda mode: item.answer if item and family in RIGHT[mode] else "0"  # noqa: E731
        last = (body.get("messages") or [{}])[-1].get("content", "")
        if "</classification>" in (body.get("stop") or []):
            return f"Decided.\n<classification>\n{route[family]}\n</classification>"
        if last.startswith("You regulate"):
            return "PLAN_NEW"
        if last.startswith("Plan:\n- Current State:"):
            return " the question\n- Action: answer it\n- Expected Outcome: the answer"
        if last.rstrip().endswith("<answer>"):
            return f"{answer('instant')}</answer>"
        if last.rstrip().endswith("<reasoning>"):
            return "Step by step, carefully. " * 6 + f"</reasoning>\n<answer>{answer('reasoning')}</answer>"
        return "Goal: answer with a checked plan. " * 12 + f"</plan>\n<answer>{answer('agentic')}</answer>"

    return respond


@pytest.fixture
def fast_router(settings):
    return settings.model_copy(update={"learned_router": LearnedRouterSettings(poll_seconds=0.2)})


async def stored(settings, run_id):
    async with channel(settings.store_addr, settings) as ch:
        return await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), run_id)


async def test_headline_end_to_end(fast_router, tmp_path):
    plan = HeadlinePlan("hl", n_per_family=N, train_n=TRAIN_N, concurrency=4, router_embedding="none", bootstrap_samples=300,
                        policy_weights="the scripted policy")
    async with serve_scripted(scripted(ROUTE)) as url, embedded(fast_router.with_policy(url)) as platform:
        stack = platform.settings
        result = await run_headline(stack, plan, tmp_path / "out")
        trajectories = await stored(stack, "hl")
        train = await stored(stack, "hl-train")
        async with channel(stack.store_addr, stack) as ch:
            router = await store_pb2_grpc.TrajectoryStoreStub(ch).GetCheckpoint(store_pb2.GetCheckpointRequest(id="router-hl"))
        again = await run_headline(stack, plan, tmp_path / "out")  # resumes: everything is stored

    assert result.errors == [] and again.errors == []
    assert {p.name for p in result.files} == {"report.md", "report.json", "accuracy_cost_of_pass.png", "reductions.png",
                                              "mode_share_by_family.png"}
    assert all(p.stat().st_size > 0 for p in result.files)
    assert router.kind == "router" and router.status == CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED
    assert len(train) == 4 * TRAIN_N * 3 and {t.split for t in train} == {"train"}
    assert len(trajectories) == 4 * N * 5 and len(again.report.modes["learned"].statuses) >= 1

    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["items_per_family"] == {family: N for family in sorted(HEADLINE_FAMILIES)}
    assert data["budgets"]["policy_weights"] == "the scripted policy"  # every checkpoint is served under one name
    assert list(data["modes"]) == ["instant", "reasoning", "agentic", "auto", "learned"]
    assert set(data["reductions"]) == {"auto", "learned"}
    assert all(set(by) == {"instant", "reasoning", "agentic"} for by in data["reductions"].values())

    # The figures, recomputed from the stored trajectories.
    by_mode = defaultdict(list)
    for t in trajectories:
        by_mode[eval_mode_of(t)].append(t)
    for mode, ts in by_mode.items():
        figures = data["modes"][mode]
        assert figures["pass_at_1"] == pytest.approx(sum(t.reward.correct for t in ts) / len(ts))
        assert figures["mean_cost_usd"] == pytest.approx(sum(t.cost.total_usd for t in ts) / len(ts))
        assert figures["protocol_valid"] == pytest.approx(sum(t.reward.format_valid for t in ts) / len(ts))
        assert figures["cost_of_pass_usd"] == pytest.approx(sum(t.cost.total_usd for t in ts) / sum(t.reward.correct for t in ts))
    assert data["modes"]["instant"]["pass_at_1"] == pytest.approx(0.5)  # facts and chain_sum
    assert data["modes"]["reasoning"]["pass_at_1"] == pytest.approx(0.75)
    assert data["modes"]["agentic"]["pass_at_1"] == data["modes"]["auto"]["pass_at_1"] == 1.0
    cop = {m: data["modes"][m]["cost_of_pass_usd"] for m in data["modes"]}
    for forced in ("instant", "reasoning", "agentic"):
        r = data["reductions"]["auto"][forced]
        assert r["value"] == pytest.approx(1 - cop["auto"] / cop[forced])
        assert r["low"] <= r["value"] <= r["high"]

    # auto routes each family as scripted, which is the per-item oracle here.
    chosen = {family_of(t.labels["item_id"]): mode_name(t.mode) for t in by_mode["auto"]}
    assert chosen == {"facts": "instant", "chain_sum": "instant", "gsm_symbolic": "reasoning", "large_multiplication": "agentic"}
    assert data["mode_share_by_family"]["auto"]["gsm_symbolic"] == {"reasoning": 1.0}
    assert data["routing_accuracy"]["auto"] == {"accuracy": 1.0, "items": 4.0 * N, "items_without_oracle": 0.0}
    learned_hits = data["routing_accuracy"]["learned"]
    assert 0.0 <= learned_hits["accuracy"] <= 1.0 and learned_hits["items"] == 4 * N
    assert isinstance(data["goal_met"], bool) and {g["mode"] for g in data["goal"]} == {"auto", "learned"}
    assert "Goal check" in (tmp_path / "out" / "report.md").read_text()
    assert data["router"]["version"] == "router-hl" and data["router"]["train_run"] == "hl-train"
    # offline, on the test run's forced outcomes: the same 12 items the report routes online
    assert data["router"]["eval_metrics"]["eval_items"] == 4 * N and 0 <= data["router"]["eval_metrics"]["routing_accuracy"] <= 1
    assert again.report.modes["auto"].pass_at_1 == 1.0 and len(again.report.modes) == 5


async def test_before_and_after_on_the_same_items(settings, tmp_path):
    """A base run, then an 'after' policy that overthinks facts (routes them to reasoning)."""
    overthinking = ROUTE | {"facts": "reasoning_agent"}
    base = HeadlinePlan("base", n_per_family=N, modes=("instant", "auto"), bootstrap_samples=300)
    after = HeadlinePlan("after", n_per_family=N, modes=("auto",), bootstrap_samples=300)
    async with serve_scripted(scripted(ROUTE)) as url, embedded(settings.with_policy(url)) as platform:
        await run_headline(platform.settings, base, tmp_path / "base")
        before = await stored(platform.settings, "base")
        async with serve_scripted(scripted(overthinking)) as url_after:
            async with embedded(platform.settings.with_policy(url_after), ("router", "planner", "executor")) as second:
                candidate = await run_headline(second.settings, after, tmp_path / "after")
        later = await stored(platform.settings, "after")

    # Auto alone: no router trained, no reductions to draw, and a goal that cannot be checked.
    assert {p.name for p in candidate.files} == {"report.md", "report.json", "accuracy_cost_of_pass.png", "mode_share_by_family.png"}
    assert not candidate.report.goal_met and "no forced reasoning run" in candidate.report.goal[0].reasons[0]
    assert {t.labels["eval_mode"] for t in later} == {"auto"} and len(later) == 4 * N

    result = compare_runs(before, later, "base", "after", "auto", samples=300)
    assert result.items == 4 * N and result.instant_correct_items == 2 * N  # facts and chain_sum
    assert result.before.non_instant_share_on_instant_correct == 0.0
    assert result.after.non_instant_share_on_instant_correct == pytest.approx(0.5)  # facts now go to reasoning
    assert result.non_instant_share_change.value == pytest.approx(0.5)
    assert result.accuracy_change.value == 0.0 and result.before.accuracy == result.after.accuracy == 1.0
    assert result.cost_of_pass_reduction.value < 0  # reasoning on facts costs more per correct answer
    assert result.after.cost_of_pass_usd > result.before.cost_of_pass_usd
    written = write_before_after(result, tmp_path / "compared")
    text = written[0].read_text()
    assert "on the 6 items the base answers in instant mode | 0.0% | 50.0% | +50.0 points" in text
    assert json.loads(written[1].read_text())["non_instant_share_change"]["value"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no forced instant"):
        compare_runs(later, before, "after", "base", "auto")
    assert math.isfinite(result.cost_of_pass_reduction.low)


async def test_the_commands_against_a_running_stack(settings, tmp_path, monkeypatch):
    """`gearshift eval headline` and `gearshift eval before-after` as a user types them, against
    a stack already running (the addresses come from the environment, as with `gearshift up`)."""
    from click.testing import CliRunner
    from gearshift.cli import main
    from gearshift.settings import get_settings

    async with serve_scripted(scripted(ROUTE)) as url, embedded(settings.with_policy(url)) as platform:
        for name in ("executor", "store", "router"):
            monkeypatch.setenv(f"GEARSHIFT_{name.upper()}_ADDR", platform.settings.address_of(name))
        monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path))
        get_settings.cache_clear()
        try:
            # click's runner calls asyncio.run: off this loop, which keeps serving the stack
            first = await asyncio.to_thread(CliRunner().invoke, main, ["eval", "headline", "--n-per-family", "2", "--modes",
                                                                       "instant,auto", "--run-id", "cli", "--bootstrap", "200"])
            compared = await asyncio.to_thread(CliRunner().invoke, main, ["eval", "before-after", "cli", "cli", "--bootstrap", "200"])
            missing = await asyncio.to_thread(CliRunner().invoke, main, ["eval", "before-after", "cli", "nothing"])
        finally:
            get_settings.cache_clear()

    assert first.exit_code == 0, first.output
    assert "goal not met" in first.output and "no forced reasoning run" in first.output
    data = json.loads((tmp_path / "headline" / "cli" / "report.json").read_text())
    assert data["items_per_family"] == {family: 2 for family in sorted(HEADLINE_FAMILIES)} and list(data["modes"]) == ["instant", "auto"]
    assert data["budgets"]["policy_weights"] == "as the running stack serves them"
    assert compared.exit_code == 0, compared.output
    assert "+0.0 points (95% CI +0.0 points to +0.0 points)" in compared.output  # a run against itself changes nothing
    assert (tmp_path / "headline" / "cli" / "before_after.md").exists()
    assert missing.exit_code == 1 and missing.output.strip() == "Error: run 'nothing' has no finished auto episodes"
