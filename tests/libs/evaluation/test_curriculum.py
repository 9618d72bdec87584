"""The curriculum's families: deterministic items in several phrasings, graded on their answer,
with solutions a teacher can write in every mode (the python really prints the answer)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gearshift.evaluation import curriculum
from gearshift.evaluation.suites import GENERALISATION_FAMILIES, HEADLINE_FAMILIES, curriculum_task, get_suite
from gearshift.teaching.solvers import solve


def test_twenty_families_and_more_of_every_need_none_held_out():
    needs = {need for need, _, _ in curriculum.TASKS.values()}
    assert len(curriculum.TASKS) + 4 >= 20 and needs == {"computed", "derived", "known"}  # with the four taught before
    assert not set(curriculum.TASKS) & {*GENERALISATION_FAMILIES, *HEADLINE_FAMILIES}


@pytest.mark.parametrize("name", list(curriculum.TASKS))
def test_items_are_phrased_several_ways_and_their_solutions_are_right(name):
    items = get_suite(name).items("train", 24)
    assert [item.id for item in items] == [item.id for item in get_suite(name).items("train", 24)]  # seeded
    assert len({item.question.split()[0] for item in items}) >= 2  # phrasings, not one template
    for item in items:
        task, solution = curriculum_task(item), solve(item)
        assert solution.answer == item.answer == task.answer and solution.steps and solution.code
        printed = subprocess.run([sys.executable, "-c", solution.code], capture_output=True, text=True, timeout=30).stdout.strip()
        assert item.grade(printed) and item.grade(f"So the answer is {item.answer}."), (item.question, printed)
        assert not item.grade(item.answer + "7"), item.question


def test_graders_read_the_last_integer_or_the_words():
    assert curriculum.grader("391")("17 * 23 = 391") and not curriculum.grader("391")("391 or 392")
    assert curriculum.grader("Friday")("It is Friday.") and not curriculum.grader("Friday")("not Friday")
