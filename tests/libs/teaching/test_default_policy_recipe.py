"""The default policy's recipe teaches the whole curriculum by need, and the shipped card is the
recipe's: a change to one without a rebuild fails here."""

import json

from gearshift import weights
from gearshift.evaluation import curriculum
from gearshift.teaching.default_policy import NEED_MODES, Recipe, run_key


def test_every_curriculum_family_is_taught_agentic_and_in_the_cheapest_mode_its_need_allows():
    taught = {family.suite: family.modes for family in Recipe().families}
    for name, (need, _, _) in curriculum.TASKS.items():
        assert taught.get(name) == NEED_MODES[need], name
    assert all("agentic" in modes for modes in NEED_MODES.values())
    assert {"instant", "reasoning", "agentic"} == {modes[0] for modes in NEED_MODES.values()} | {"agentic"}


def test_the_shipped_card_records_the_current_recipe():
    card = json.loads((weights.DEFAULT_ADAPTER / "training.json").read_text())
    assert card["recipe"] == json.loads(Recipe().model_dump_json())
    taught = {f"{family.suite}/{family.teacher}/{mode}" for family in Recipe().families for mode in family.modes}
    assert set(card["teachers"]) == taught


def test_the_checkpoint_is_named_by_the_recipe_and_the_data_it_taught():
    """A rebuild after a teacher changed (same recipe, new episodes) registers a new checkpoint;
    a rerun on the same stored episodes resumes the same one."""
    recipe = Recipe()
    assert run_key(recipe, "snapshot-a") == run_key(Recipe(), "snapshot-a")
    assert run_key(recipe, "snapshot-a") != run_key(recipe, "snapshot-b")
    assert run_key(recipe, "snapshot-a") != run_key(recipe.model_copy(update={"max_tokens_per_turn": 64}), "snapshot-a")
