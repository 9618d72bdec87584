"""The router's per-query cost regressions and pass value: ridge by hand, decisions that follow a
query's own expected cost, queries no mode answers sent to the cheapest mode, and format 1 and
2 artefacts (one mean cost per mode; no pass value) still loading and deciding as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gearshift.routing.decision import choose_mode
from gearshift.routing.features import FeatureSpec
from gearshift.routing.model import FORMAT_VERSION, METADATA_FILE, WEIGHTS_FILE, RouterModel, fit_ridge, train_router_model

from tests.libs.routing.synthetic import AGENTIC, INSTANT, REASONING

SPEC = FeatureSpec(embedding="none")


def test_ridge_by_hand():
    x, y, w = np.array([[-1.0], [0.0], [1.0]]), np.array([1.0, 2.0, 3.0]), np.ones(3)
    exact = fit_ridge(x, y, w, l2=0.0)
    assert exact.weights[0] == pytest.approx(1.0) and exact.bias == pytest.approx(2.0)
    # Penalised: w = sum(x y_c) / (sum(x^2) + l2) = 2 / (2 + 2) = 0.5; the bias stays the mean.
    shrunk = fit_ridge(x, y, w, l2=2.0)
    assert shrunk.weights[0] == pytest.approx(0.5) and shrunk.bias == pytest.approx(2.0)
    # Weights: the item at x = 1 counts three times: weighted means x 0.4, y 2.4; by hand w = 1 still.
    weighted = fit_ridge(x, y, np.array([1.0, 1.0, 3.0]), l2=0.0)
    assert weighted.weights[0] == pytest.approx(1.0) and weighted.bias == pytest.approx(2.0)


def world(n: int = 300, seed: int = 0):
    """Both modes always right; instant costs 1e-4 on every query, reasoning 1e-4 * (2 + x0):
    cheaper than instant exactly where the first feature is below -1."""
    rng = np.random.default_rng(seed)
    features = rng.uniform(-1.5, 1.5, size=(n, SPEC.dim))
    rows, ones = np.arange(n), np.ones(n)
    costs = {INSTANT: np.full(n, 1e-4), REASONING: 1e-4 * (2 + features[:, 0])}
    model = train_router_model("v", SPEC, features, {INSTANT: (rows, ones, ones), REASONING: (rows, ones, ones)},
                               {m: float(c.mean()) for m, c in costs.items()}, l2=1.0, max_iterations=20,
                               per_mode_cost=costs, cost_l2=1e-3)
    return model, features


def decide(model: RouterModel, row: np.ndarray) -> int:
    return choose_mode(model.probabilities(row), model.expected_costs(row), accuracy_floor=0.5).mode


def test_the_decision_follows_the_query_own_expected_cost():
    model, features = world()
    low, high = features.mean(axis=0).copy(), features.mean(axis=0).copy()
    low[0], high[0] = -1.4, 1.4
    assert model.expected_costs(low)[REASONING] == pytest.approx(1e-4 * 0.6, rel=0.02)
    assert model.expected_costs(high)[REASONING] == pytest.approx(1e-4 * 3.4, rel=0.02)
    assert (decide(model, low), decide(model, high)) == (REASONING, INSTANT)
    # One mean cost per mode (2e-4 for reasoning) would send both to instant.
    assert choose_mode(model.probabilities(low), model.expected_cost_usd, 0.5).mode == INSTANT


def test_predicted_costs_stay_positive():
    model, features = world()
    far = features.mean(axis=0).copy()
    far[0] = -50.0  # the linear fit alone would predict a negative cost
    assert model.expected_costs(far)[REASONING] == pytest.approx(0.05 * model.expected_cost_usd[REASONING])


def unanswered_world(n: int = 400, seed: int = 0):
    """Two families told apart by the first feature (+1 or -1): on the known one instant answers
    90% and agentic always; on the other nothing answers but agentic, 5% of the time. Agentic
    costs 20x instant."""
    rng = np.random.default_rng(seed)
    features = rng.uniform(-1.5, 1.5, size=(n, SPEC.dim))
    known = rng.random(n) < 0.5
    features[:, 0] = np.where(known, 1.0, -1.0)
    rows = np.arange(n)
    rates = {INSTANT: np.where(known, 0.9, 0.0), AGENTIC: np.where(known, 1.0, 0.05)}
    costs = {INSTANT: 1e-5, AGENTIC: 2e-4}
    model = train_router_model("v", SPEC, features, {m: (rows, r, np.full(n, 20.0)) for m, r in rates.items()}, costs,
                               l2=1.0, max_iterations=50, accuracy_floor=0.5)
    return model, features, known


def test_queries_no_mode_answers_go_to_the_cheapest_mode():
    model, features, known = unanswered_world()
    chosen = np.asarray([c.mode for c in model.choose_many(features, 0.5)])
    assert (chosen == INSTANT).all()
    # its pass value is the cost of pass of its own choices, by its own estimates, and lower
    # than that of per-query choices (no pass value, as in a format 2 artefact), where agentic's
    # 5% beats instant's ~0%: 20x the cost for 1 pass in 20
    def cost_of_pass(choices):
        return sum(c.chosen.expected_cost_usd for c in choices) / sum(c.chosen.probability for c in choices)

    value = model.pass_value_usd
    assert cost_of_pass(model.choose_many(features, 0.5)) == pytest.approx(value, rel=1e-9)
    model.pass_value_usd = None
    per_query = model.choose_many(features, 0.5)
    assert cost_of_pass(per_query) > 1.2 * value
    per_query = np.asarray([c.mode for c in per_query])
    assert (per_query[~known] == AGENTIC).all()


def test_format_3_round_trip_and_formats_1_and_2_still_load(tmp_path):
    model, features, _ = unanswered_world()
    model.save(tmp_path / "v3")
    loaded = RouterModel.load(tmp_path / "v3")
    assert json.loads((tmp_path / "v3" / METADATA_FILE).read_text())["format_version"] == FORMAT_VERSION == 3
    assert loaded.pass_value_usd == model.pass_value_usd
    np.testing.assert_allclose(loaded.predict_cost(features[:5]), model.predict_cost(features[:5]))

    # A format 2 artefact: no pass value, so the per-query cost of pass decides.
    meta = json.loads((tmp_path / "v3" / METADATA_FILE).read_text())
    v2 = tmp_path / "v2-no-pass-value"
    loaded.save(v2)
    del meta["pass_value_usd"]
    (v2 / METADATA_FILE).write_text(json.dumps(meta | {"format_version": 2}))
    assert RouterModel.load(v2).pass_value_usd is None

    model, features = world()
    model.save(tmp_path / "v2")

    # A format 1 artefact: no cost arrays, one mean cost per mode, which every query then gets.
    old = tmp_path / "v1"
    old.mkdir()
    np.savez(old / WEIGHTS_FILE, weights=model.weights, bias=model.bias, mean=model.mean, scale=model.scale)
    meta = json.loads((tmp_path / "v2" / METADATA_FILE).read_text()) | {"format_version": 1}
    (old / METADATA_FILE).write_text(json.dumps(meta))
    v1 = RouterModel.load(old)
    expected = [model.expected_cost_usd[m] for m in model.modes]
    np.testing.assert_allclose(v1.predict_cost(features[:3]), np.tile(expected, (3, 1)))

    meta["format_version"] = 4
    (old / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="format 4 is not one this code reads"):
        RouterModel.load(old)
