"""The solver teachers: worked steps by hand, and episodes through the real executor, sandbox and
reward service whose transcripts pass the strict checks and grade right by the suites' own
graders. They never hold an evaluation or demo question."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from gearshift.cli.platform import DEMO_QUESTIONS
from gearshift.embedded import embedded
from gearshift.evaluation.report import fetch_run
from gearshift.evaluation.suites import get_suite
from gearshift.protocol.parsers.a2fm import read_step
from gearshift.rewards.formats import check_trajectory_format
from gearshift.rewards.structure import check_structure
from gearshift.teaching.solvers import REFUSAL, SolverTeacher, arithmetic_steps, product_steps, python_call, solve
from gearshift.teaching.teach import TeachersConfig, teach


def run_python(code: str) -> str:
    """What the program prints (a teacher's program is trusted: no sandbox needed to check it)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    return printed.getvalue().strip()


SOLVERS = TeachersConfig.model_validate({"teachers": [{"name": "solvers", "kind": "solvers", "domains": ["arithmetic", "word_problems"]}]})


def test_worked_steps_by_hand():
    assert arithmetic_steps("-( ( 626 - 208 ) - 576 )") == (["626 - 208 = 418", "418 - 576 = -158", "-(-158) = 158"], 158)
    assert arithmetic_steps("385 - 902 - 746") == (["385 - 902 = -517", "-517 - 746 = -1263"], -1263)
    assert product_steps(37739, 208) == ["37739 * 8 = 301912", "37739 * 200 = 7547800", "301912 + 7547800 = 7849712"]


@pytest.mark.parametrize("suite", ["large_multiplication", "gsm_symbolic", "basic_arithmetic", "chain_sum", "facts"])
def test_every_generated_family_is_solved_right(suite):
    for item in get_suite(suite).items("train", 12):
        solution = solve(item)
        assert solution is not None and item.grade(solution.answer), item.question
        assert not solution.code or item.grade(run_python(solution.code)), solution.code  # the tool prints the answer


def test_the_python_call_is_double_quoted_so_the_programs_own_quotes_stay_inside():
    item = get_suite("binary").items("train", 1)[0]  # its program prints format(n, 'b')
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": item.question},
                         {"role": "assistant", "content": "<plan>"}]}
    written = SolverTeacher([item])(body)
    ((_, call),) = read_step(written, {"python"}).calls
    code = json.loads(call.arguments)["code"]
    assert "'b'" in code and item.grade(run_python(code))
    assert python_call("print(1)").endswith("""{'code': "print(1)"}}""")  # one quoting rule for every program


def test_the_solvers_hold_no_test_or_demo_question():
    train = [i for s in ("large_multiplication", "gsm_symbolic", "basic_arithmetic") for i in get_suite(s).items("train", 20)]
    teacher = SolverTeacher(train)
    held_out = [i for s in ("large_multiplication", "gsm_symbolic") for i in get_suite(s).items("test", 10)]
    for question in [i.question for i in held_out] + [q for q, _, _ in DEMO_QUESTIONS]:
        body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": question}, {"role": "assistant", "content": "<answer>"}]}
        assert teacher(body) == REFUSAL


async def test_teaching_runs_through_the_executor_and_stores_graded_training_data(settings):
    async with embedded(settings, ("store", "sandbox", "reward")) as platform:
        done = await teach(platform.settings, "large_multiplication", "train", SOLVERS, ["instant", "reasoning", "agentic"], 3, "t")
        from gearshift.api.store.v1 import store_pb2_grpc
        from gearshift.clients import channel

        async with channel(platform.settings.store_addr, platform.settings) as ch:
            agentic = await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), "t-solvers-agentic")
    assert {mode: e.report.modes[mode].correct for mode, e in done["solvers"].items()} == {"instant": 3, "reasoning": 3, "agentic": 3}
    for trajectory in agentic:
        assert trajectory.model_version == "solvers" and trajectory.purpose == 3  # PURPOSE_TRAINING
        assert trajectory.reward.verifier == "suite:large_multiplication" and trajectory.reward.correct
        assert check_trajectory_format(trajectory) and check_structure(trajectory.turns)
        call, answer = trajectory.turns
        assert call.tool_results[0].output.strip() == trajectory.answer  # the answer is the tool's real output
    with pytest.raises(ValueError, match="test split"):
        await teach(settings, "large_multiplication", "test", SOLVERS, ["agentic"], 3, "t")
