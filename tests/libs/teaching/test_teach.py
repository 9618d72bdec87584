"""`gearshift teach` with a model teacher served here: several samples per item at a
temperature (rejection sampling), stored as training data under the teacher's name."""

from __future__ import annotations

from click.testing import CliRunner

from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.cli import main
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.report import fetch_run
from gearshift.settings import ExecutorSettings
from gearshift.teaching.teach import TeachersConfig, assign, teach

SAMPLED = TeachersConfig.model_validate({"teachers": [
    {"name": "tiny-sampled", "kind": "model", "model": "tiny", "temperature": 1.0, "samples": 2, "domains": ["facts"]},
    {"name": "solvers", "kind": "solvers", "modes": ["agentic"]},
]})


async def test_a_sampled_model_teacher_stores_every_sample_as_training_data(settings):
    small = settings.model_copy(update={"executor": ExecutorSettings(max_tokens_per_turn=8, max_steps_other=1)})
    async with embedded(small, ("store", "sandbox", "reward")) as platform:
        done = await teach(platform.settings, "facts", "train", SAMPLED, ["instant"], 2, "s")
        async with channel(platform.settings.store_addr, platform.settings) as ch:
            stored = await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), "s-tiny-sampled-instant")
    assert list(done) == ["tiny-sampled"] and done["tiny-sampled"]["instant"].summary.planned == 4
    assert len(stored) == 4 and {t.model_version for t in stored} == {"tiny-sampled"}
    assert {t.labels["sample"] for t in stored} == {"0", "1"} and {t.purpose for t in stored} == {3}  # PURPOSE_TRAINING
    assert all(t.reward.verifier == "suite:facts" for t in stored)  # the suite's verdict, kept


def test_items_go_to_the_first_teacher_that_teaches_their_domain_and_mode():
    from gearshift.evaluation.suites import get_suite

    facts, products = get_suite("facts").items("train", 2), get_suite("large_multiplication").items("train", 2)
    plan = assign(SAMPLED, facts + products, ["instant", "agentic"])
    assert {mode: [i.id for i in items] for mode, items in plan["tiny-sampled"].items()} == {
        "instant": [i.id for i in facts], "agentic": [i.id for i in facts]}
    assert [i.id for i in plan["solvers"]["agentic"]] == [i.id for i in products]  # nobody teaches products instantly


def test_the_command_refuses_the_test_split(tmp_path):
    teachers = tmp_path / "teachers.yaml"
    teachers.write_text("teachers: [{name: solvers, kind: solvers}]\n")
    outcome = CliRunner().invoke(main, ["teach", "--suite", "facts", "--split", "test", "--teachers", str(teachers)])
    assert outcome.exit_code == 2 and "'test' is not one of 'train', 'dev'" in outcome.output
