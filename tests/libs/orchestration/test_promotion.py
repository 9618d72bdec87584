"""The promotion gate: refused on a regressing candidate, accepted on an improving one, with
the figures recorded in the real registry (store service on Postgres)."""

from __future__ import annotations

import math

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration import steps
from gearshift.orchestration.promotion import EvalResult, Margins, decide

MARGINS = Margins(accuracy=0.02, cost_of_pass=0.10)
BASE = EvalResult(accuracy=0.50, cost_of_pass=0.0010)


@pytest.mark.parametrize(
    ("candidate", "promote"),
    [
        (EvalResult(0.60, 0.0008), True),  # better on both
        (EvalResult(0.49, 0.00109), True),  # worse, but within both margins
        (EvalResult(0.47, 0.0008), False),  # accuracy drops by more than 0.02
        (EvalResult(0.60, 0.00111), False),  # cost of pass rises by more than 10 %
        (EvalResult(0.0, math.inf), False),  # solves nothing
    ],
)
def test_decide_against_hand_computed_margins(candidate, promote):
    decision = decide(candidate, BASE, MARGINS)
    assert decision.promote is promote
    assert all(("accuracy" in r) or ("cost of pass" in r) for r in decision.reasons)


def test_first_checkpoint_and_two_unsolved():
    assert decide(EvalResult(0.1, 0.5), None, MARGINS).promote
    assert not decide(EvalResult(0.0, math.inf), None, MARGINS).promote
    assert decide(EvalResult(0.0, math.inf), EvalResult(0.0, math.inf), MARGINS).promote  # a tie


class TableEvaluator:
    """Figures per checkpoint id: the gate's logic isolated from how evaluation runs."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def evaluate(self, checkpoint, suite, split):
        self.calls.append((checkpoint.id, suite, split))
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
        evaluator = TableEvaluator({"base": BASE, "worse": EvalResult(0.40, 0.0009), "better": EvalResult(0.55, 0.0009)})

        refused = await steps.gate(stack, "worse", evaluator)
        assert not refused.decision.promote and refused.baseline.id == "base"
        assert "accuracy 0.400 < published 0.500" in refused.decision.reasons[0]
        accepted = await steps.gate(stack, "better", evaluator)
        assert accepted.decision.promote

        # The published baseline was evaluated once; its figures now live in the registry.
        assert evaluator.calls == [("worse", "s", "test"), ("base", "s", "test"), ("better", "s", "test")]
        base = await steps.get_checkpoint(stack, "base")
        assert base.eval_metrics["s/test/accuracy"] == 0.5 and base.eval_metrics["s/test/cost_of_pass"] == 0.001
        assert (await steps.get_checkpoint(stack, "worse")).eval_metrics["accuracy"] == 0.4
