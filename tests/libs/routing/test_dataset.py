"""The training dataset read from a real store (SQLite and Postgres) through Export."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import RoutingStrategy
from gearshift.clients import channel
from gearshift.routing.dataset import DatasetQuery, load_dataset

from tests.libs.routing.synthetic import AGENTIC, COST, INSTANT, REASONING, SUITE, put, running_store, trajectory, world
from tests.libs.storage.helpers import migrated_postgres_url, store_database_url  # noqa: F401


async def test_outcomes_per_query_from_the_store(settings, store_database_url):
    run = "eval-1"
    data = world(run, {"train": 6, "dev": 3})
    # two more samples of instant on one item (one correct), an unscored attempt, a learned-routing attempt
    query = next(t.query for t in data if t.labels["item_id"] == "train-1")
    data.append(trajectory(run, "train", "train-1", query, INSTANT, True, 0.00002, sample=1))
    data.append(trajectory(run, "train", "train-1", query, INSTANT, False, 0.00002, sample=2))
    unscored = trajectory(run, "train", "train-2", "x", INSTANT, True, 0.1, sample=9)
    unscored.ClearField("reward")
    learned = trajectory(run, "train", "train-2", "x", AGENTIC, True, 0.1, sample=8, strategy=RoutingStrategy.ROUTING_STRATEGY_LEARNED)
    data += [unscored, learned, *world("other-run", {"train": 3})]  # a rerun of the same items

    async with running_store(settings.model_copy(update={"database_url": store_database_url})) as (configured, stub):
        await put(stub, data)
        async with channel(configured.store_addr, configured) as ch:
            dataset = await load_dataset(ch, DatasetQuery(task_source=SUITE, run_ids=(run,)))
            dev_only = await load_dataset(ch, DatasetQuery(task_source=SUITE, run_ids=(run,), splits=("dev",)))
            both_runs = await load_dataset(ch, DatasetQuery(run_ids=(run, "other-run"), splits=("train",)))

    assert len(dataset.items) == 9 and dataset.unscored == 1 and dataset.other == 1
    assert dataset.run_ids == [run]
    items = {item.key: item for item in dataset.items}
    word = items[f"{SUITE}/train-1"]  # index 1: a word problem (instant wrong)
    assert sorted(word.forced) == [INSTANT, REASONING, AGENTIC]
    assert sorted(a.correct for a in word.forced[INSTANT]) == [False, False, True]
    assert word.success_rate(INSTANT) == 1 / 3
    assert word.success_rate(REASONING) == 1.0 and word.oracle_mode() == REASONING
    assert word.domain == "word" and word.split == "train"
    assert [a.mode for a in word.native] == [AGENTIC]  # the model-native attempt, kept apart
    assert items[f"{SUITE}/train-0"].oracle_mode() == INSTANT  # a fact
    assert items[f"{SUITE}/train-2"].oracle_mode() == AGENTIC  # big numbers
    assert abs(items[f"{SUITE}/train-0"].mean_cost(AGENTIC) - COST[AGENTIC]) <= 0.1 * COST[AGENTIC]

    assert {item.split for item in dev_only.items} == {"dev"} and len(dev_only.items) == 3
    # the same suite item in two runs pools its attempts
    assert len(both_runs.items) == 6 and both_runs.run_ids == ["eval-1", "other-run"]
    pooled = {item.key: item for item in both_runs.items}[f"{SUITE}/train-0"]
    assert sorted(a.run_id for a in pooled.forced[INSTANT]) == ["eval-1", "other-run"]


async def test_an_item_with_no_correct_mode_has_no_oracle(settings):
    data = [trajectory("r", "train", "hard", "Prove the Riemann hypothesis.", mode, False, 0.01) for mode in (INSTANT, AGENTIC)]
    async with running_store(settings) as (configured, stub):
        await put(stub, data)
        async with channel(configured.store_addr, configured) as ch:
            dataset = await load_dataset(ch, DatasetQuery())
    (item,) = dataset.items
    assert sorted(item.forced) == [INSTANT, AGENTIC] and item.oracle_mode() is None
