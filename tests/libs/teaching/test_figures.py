"""The default policy's figures on episodes the executor really ran: the solvers' agentic turns
(python through the real sandbox) against a tiny random model's instant answers."""

from __future__ import annotations

from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.report import fetch_run
from gearshift.settings import ExecutorSettings
from gearshift.teaching.figures import figures, goals, markdown
from gearshift.teaching.teach import TeachersConfig, teach

SOLVERS = TeachersConfig.model_validate({"teachers": [{"name": "solvers", "kind": "solvers"}]})
TINY = TeachersConfig.model_validate({"teachers": [{"name": "tiny", "kind": "model", "model": "tiny"}]})


async def test_figures_count_what_the_stored_episodes_did(settings):
    small = settings.model_copy(update={"executor": ExecutorSettings(max_tokens_per_turn=8, max_steps_other=1)})
    async with embedded(small, ("store", "sandbox", "reward")) as platform:
        await teach(platform.settings, "large_multiplication", "train", SOLVERS, ["agentic"], 3, "trained")
        await teach(platform.settings, "facts", "train", TINY, ["instant"], 2, "base")
        async with channel(platform.settings.store_addr, platform.settings) as ch:
            store = store_pb2_grpc.TrajectoryStoreStub(ch)
            trained = figures(await fetch_run(store, "trained-solvers-agentic"))
            base_episodes = await fetch_run(store, "base-tiny-instant")
    base = figures(base_episodes)

    products = trained[("large_multiplication", "agentic")]
    assert (products.episodes, products.correct, products.format_valid) == (3, 3, 3)
    assert products.calls == 3 and products.parsed == 1.0  # one python call each, all parsed
    assert products.chosen == {"agentic": 3}
    facts = base[("facts", "instant")]
    assert facts.episodes == 2 and facts.correct == sum(t.reward.correct for t in base_episodes)

    met = {goal.name: goal for goal in goals(base, trained)}
    assert met["agentic accuracy on large products >= 90%"].met
    assert met["agentic accuracy on large products >= 90%"].measured == "100.0% of 3"
    assert not met["protocol validity >= 95% (instant)"].met  # the trained run has no instant episode
    assert not met["auto picks instant for >= 80% of facts"].met
    assert "| large_multiplication | agentic | -/3 | - → 100% |" in markdown(base, trained)
