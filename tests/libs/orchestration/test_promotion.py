"""The promotion gate: paired item-level intervals against the margins, refusal of a candidate
that solves nothing, and the figures recorded in the real registry (store service on Postgres)."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration import checkpoint_registry, task_bodies
from gearshift.orchestration.promotion import EvalResult, ItemOutcome, Margins, decide, paired_intervals

MARGINS = Margins(accuracy=0.02, cost_of_pass=0.10)


def result(correct: list[int], cost: float = 0.001) -> EvalResult:
    """One attempt per item, each costing `cost`: correct[i] says whether item i was right."""
    return EvalResult.of({f"item-{i}": ItemOutcome(cost, right, 1) for i, right in enumerate(correct)})


def test_intervals_by_hand():
    same = result([1, 0] * 20)
    accuracy, cost = paired_intervals(same, same)
    assert (accuracy.low, accuracy.high, cost.low, cost.high) == (0.0, 0.0, 0.0, 0.0)  # identical: no difference in any resample
    cheaper = result([1, 0] * 20, cost=0.0005)
    accuracy, cost = paired_intervals(cheaper, same)
    assert accuracy.low == accuracy.high == 0.0 and cost.low == cost.high == -0.5  # half the cost on every resample


def test_decide_promotes_only_what_the_interval_clears():
    base = result([1, 0] * 20)
    assert decide({"auto": result([1, 1] * 20)}, {"auto": base}, MARGINS).promote  # right on every item: clearly better
    assert decide({"auto": result([1, 0] * 20, cost=0.00105)}, {"auto": base}, MARGINS).promote  # +5 % cost, inside the margin
    dearer = decide({"auto": result([1, 0] * 20, cost=0.0012)}, {"auto": base}, MARGINS)
    assert not dearer.promote and "worse beyond the margin" in dearer.reasons[0]
    # One item better, one worse out of 40: the point estimate ties, the interval reaches below -0.02.
    noisy = [1, 0] * 20
    noisy[1], noisy[2] = 1, 0
    assert not decide({"auto": result(noisy)}, {"auto": base}, MARGINS).promote


def test_a_round_meant_to_move_a_family_promotes_an_improvement_only():
    base, improving = Margins(require_improvement=True), result([1, 0] * 20)
    assert not decide({"auto": improving}, {"auto": result([1, 0] * 20)}, base).promote  # no loss is not enough
    better = decide({"auto": result([1, 1] * 20)}, {"auto": result([1, 0] * 20)}, base)
    assert better.promote and "must lie above 0" in better.reasons[0]
    slightly = [1, 0] * 20
    slightly[1] = 1  # one item better of 40: the interval reaches 0
    assert not decide({"auto": result(slightly)}, {"auto": result([1, 0] * 20)}, base).promote


def test_a_candidate_that_solves_nothing_is_refused_whatever_the_baseline():
    nothing = result([0] * 10)
    assert not decide({"auto": nothing}, None, MARGINS).promote
    both = decide({"auto": nothing}, {"auto": result([0] * 10)}, MARGINS)
    assert not both.promote and "nor does the published checkpoint" in both.reasons[0]  # two infinities are no tie
    assert decide({"auto": result([1] + [0] * 9)}, None, MARGINS).promote  # the first checkpoint that solves anything


def test_every_gated_mode_must_pass():
    base = {"auto": result([1, 0] * 20), "learned": result([1, 0] * 20)}
    candidate = {"auto": result([1, 1] * 20), "learned": result([0, 0] * 20)}
    decision = decide(candidate, base, MARGINS)
    assert not decision.promote and [r.split(":")[0] for r in decision.reasons] == ["auto", "learned"]


class TableEvaluator:
    """Results per checkpoint id: the gate's logic isolated from how evaluation runs."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def evaluate(self, checkpoint):
        self.calls.append(checkpoint.id)
        return self.table[checkpoint.id]


async def test_gate_refuses_a_regression_and_accepts_an_improvement(tmp_path, orchestration_db):
    from gearshift.settings import OrchestrationSettings, Settings

    settings = Settings(data_dir=tmp_path, metrics_port=0, database_url=orchestration_db.url.render_as_string(hide_password=False),
                        orchestration=OrchestrationSettings(accuracy_margin=0.02, cost_of_pass_margin=0.10, eval_suite="s", eval_split="test"))
    async with embedded(settings, ("store",)) as platform:
        stack = platform.settings
        async with channel(stack.store_addr, stack) as ch:
            store = store_pb2_grpc.TrajectoryStoreStub(ch)
            for ident, parent in (("base", ""), ("worse", "base"), ("better", "base")):
                await store.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(
                    checkpoint=Checkpoint(id=ident, kind="policy", uri=f"/ckpt/{ident}", parent_id=parent, job="sft")))
            await store.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="base", status=CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED))
        evaluator = TableEvaluator({"base": {"auto": result([1, 0] * 20)}, "worse": {"auto": result([0, 0, 1, 0] * 10)},
                                    "better": {"auto": result([1, 1] * 20)}})

        refused = await task_bodies.gate(stack, "worse", evaluator)
        assert not refused.decision.promote and refused.baseline.id == "base"
        assert "accuracy 0.250 vs 0.500" in refused.decision.reasons[0]
        accepted = await task_bodies.gate(stack, "better", evaluator)
        assert accepted.decision.promote

        assert evaluator.calls == ["worse", "base", "better", "base"]  # the published one on the same items each time
        base = await checkpoint_registry.get_checkpoint(stack, "base")
        assert base.eval_metrics["s/test/auto/accuracy"] == 0.5 and base.eval_metrics["s/test/auto/cost_of_pass"] == pytest.approx(0.002)
        assert (await checkpoint_registry.get_checkpoint(stack, "worse")).eval_metrics["s/test/auto/accuracy"] == 0.25
