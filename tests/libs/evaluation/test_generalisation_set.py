"""The generalisation set stays held out: no training recipe, teacher or test touches its
families, so what is measured on them is the mode decision generalising, not remembered."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gearshift import weights
from gearshift.evaluation.suites import GENERALISATION_FAMILIES, get_suite
from gearshift.teaching.default_policy import Recipe
from gearshift.teaching.solvers import solve

ROOT = Path(__file__).resolve().parents[3]
# Where teachers, trainers and tests get their data and configuration. The set is named only in
# suites.py (the generators), docs and docs/results/generalisation.md (the measurement), and this file.
WATCHED = ("tests", "training-jobs", "charts", "libs/gearshift/teaching", "libs/gearshift/orchestration", "libs/gearshift/training",
           "libs/gearshift/default_policy")
NAMED = re.compile(r"\b(" + "|".join(GENERALISATION_FAMILIES) + r")\b")


def test_the_set_has_six_families_or_more_that_generate_gradable_items():
    assert len(GENERALISATION_FAMILIES) >= 6
    for name in GENERALISATION_FAMILIES:
        items = get_suite(name).items("test", 6)
        assert len(items) == 6 and {item.family for item in items} == {name}
        assert all(item.grade(item.answer) for item in items), name
        others = [(item, other.answer) for item, other in zip(items, items[1:]) if other.answer != item.answer]
        assert others and not any(item.grade(wrong) for item, wrong in others), name


def test_the_default_policy_recipe_and_its_shipped_card_teach_none_of_them():
    recipe = Recipe()
    taught = {item.family for family in recipe.families for item in get_suite(family.suite).items("train", 40)}
    assert taught and not taught & set(GENERALISATION_FAMILIES)
    card = json.loads((weights.DEFAULT_ADAPTER / "training.json").read_text())
    assert card["teachers"] and not {key.split("/")[0] for key in card["teachers"]} & set(GENERALISATION_FAMILIES)


def test_the_solver_teachers_cannot_answer_them():
    # A solvers teacher refuses what it cannot solve, and a refusal grades wrong: none enters SFT data.
    for name in GENERALISATION_FAMILIES:
        assert [solve(item) for item in get_suite(name).items("train", 9)] == [None] * 9, name


def test_no_test_config_or_training_code_names_them():
    here = Path(__file__).resolve()
    named = [
        f"{path.relative_to(ROOT)}: {match[0]}"
        for top in WATCHED for path in sorted((ROOT / top).rglob("*"))
        if path.is_file() and path != here and path.suffix in (".py", ".json", ".yaml", ".yml", ".jsonl", ".md", ".tpl")
        for match in [NAMED.search(path.read_text(errors="replace"))] if match
    ]
    assert not named, named
