"""Per-mode success classifiers (L2-regularised logistic regression in numpy), per-mode cost
regressions (ridge: the expected cost of one attempt for this query) and the versioned router
artefact: weights.npz + metadata.json in one directory.

Format 2 adds the cost regressions, format 3 the pass value (gearshift.routing.decision). Older
artefacts still load and decide exactly as before: format 1 (one mean cost per mode) gets a
constant regression, the mean; without a pass value the per-query cost of pass decides.

Inference is one standardisation and two small matrix-vector products: microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gearshift.protocol.modes import MODE_OF, NAME_OF
from gearshift.routing.decision import Choice, choose_mode, pass_value
from gearshift.routing.features import FeatureSpec

FORMAT_VERSION = 3
# Formats this code reads; 1 has no cost regression (a constant cost per mode stands in), 1 and
# 2 no pass value.
READABLE_FORMATS = (1, 2, 3)
WEIGHTS_FILE = "weights.npz"
METADATA_FILE = "metadata.json"
# A light pull on the bias: a mode that always (or never) succeeded in training gets a large
# but finite logit instead of one that grows with every Newton step.
BIAS_PENALTY = 1e-3
# A predicted cost never falls below this share of the mode's mean cost: a linear fit can
# extrapolate below zero, and a free mode would win every decision.
MIN_COST_SHARE = 0.05


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # stable for any z


@dataclass(frozen=True)
class LogisticFit:
    weights: np.ndarray
    bias: float
    iterations: int


def fit_logistic(
    features: np.ndarray, targets: np.ndarray, sample_weights: np.ndarray, l2: float, max_iterations: int = 50, tol: float = 1e-8
) -> LogisticFit:
    """Weighted logistic regression by Newton's method; targets may be fractions (a query's
    success rate over several samples). Minimises sum w * logloss + l2/2 * |weights|^2 (the
    bias is not penalised)."""
    n, d = features.shape
    design = np.hstack([features, np.ones((n, 1))])
    penalty = np.full(d + 1, l2)
    penalty[-1] = BIAS_PENALTY
    theta = np.zeros(d + 1)
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        p = _sigmoid(design @ theta)
        gradient = design.T @ (sample_weights * (p - targets)) + penalty * theta
        curvature = sample_weights * p * (1 - p)
        hessian = (design * curvature[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.max(np.abs(step)) < tol:
            break
    return LogisticFit(theta[:-1].copy(), float(theta[-1]), iterations)


@dataclass(frozen=True)
class RidgeFit:
    weights: np.ndarray
    bias: float


def fit_ridge(features: np.ndarray, targets: np.ndarray, sample_weights: np.ndarray, l2: float) -> RidgeFit:
    """Weighted ridge regression in closed form on (standardised) features: minimises
    sum w * (y - x.w - b)^2 + l2 * |w|^2; the bias is not penalised (it is the weighted mean
    of the targets once the features are centred by those weights)."""
    total = sample_weights.sum()
    x_mean = (sample_weights[:, None] * features).sum(axis=0) / total
    y_mean = float((sample_weights * targets).sum() / total)
    centred = features - x_mean
    gram = (centred * sample_weights[:, None]).T @ centred + l2 * np.eye(features.shape[1])
    weights = np.linalg.solve(gram, (centred * sample_weights[:, None]).T @ (targets - y_mean))
    return RidgeFit(weights, y_mean - float(x_mean @ weights))


@dataclass
class RouterModel:
    """A trained router: the feature spec, one success classifier and one cost regression per
    mode; expected_cost_usd keeps each mode's mean cost over the training items (the floor of
    the regressions' predictions is a share of it); pass_value_usd is the cost of pass its
    decisions reach over the training queries, by its own estimates (None: decide per query)."""

    version: str
    spec: FeatureSpec
    modes: tuple[int, ...]
    weights: np.ndarray  # [dim, len(modes)]
    bias: np.ndarray  # [len(modes)]
    mean: np.ndarray  # feature standardisation, [dim]
    scale: np.ndarray  # [dim]
    expected_cost_usd: dict[int, float]
    metadata: dict = field(default_factory=dict)  # training runs, metrics, config, ...
    cost_weights: np.ndarray | None = None  # [dim, len(modes)]; None: the mean cost for every query
    cost_bias: np.ndarray | None = None  # [len(modes)]
    pass_value_usd: float | None = None

    def __post_init__(self) -> None:
        dim, count = self.spec.dim, len(self.modes)
        if self.weights.shape != (dim, count) or self.bias.shape != (count,) or self.mean.shape != (dim,) or self.scale.shape != (dim,):
            raise ValueError(f"weights do not fit the feature spec ({dim} features, {count} modes)")
        if set(self.expected_cost_usd) != set(self.modes):
            raise ValueError("expected costs must name exactly the modes with a classifier")
        if self.cost_weights is None:
            self.cost_weights = np.zeros((dim, count))
            self.cost_bias = np.asarray([self.expected_cost_usd[m] for m in self.modes], dtype=np.float64)
        if self.cost_weights.shape != (dim, count) or self.cost_bias is None or self.cost_bias.shape != (count,):
            raise ValueError(f"cost regressions do not fit the feature spec ({dim} features, {count} modes)")

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(correct) per mode: [n, len(modes)] for [n, dim] rows, [len(modes)] for one row."""
        return _sigmoid(((features - self.mean) / self.scale) @ self.weights + self.bias)

    def probabilities(self, row: np.ndarray) -> dict[int, float]:
        return dict(zip(self.modes, self.predict(row).tolist()))

    def predict_cost(self, features: np.ndarray) -> np.ndarray:
        """Expected cost of one attempt per mode, USD: [n, len(modes)] for [n, dim] rows."""
        floor = MIN_COST_SHARE * np.asarray([self.expected_cost_usd[m] for m in self.modes])
        return np.maximum(((features - self.mean) / self.scale) @ self.cost_weights + self.cost_bias, floor)

    def expected_costs(self, row: np.ndarray) -> dict[int, float]:
        """This query's expected cost of one attempt per mode."""
        return dict(zip(self.modes, self.predict_cost(row).tolist()))

    def choose(self, row: np.ndarray, accuracy_floor: float) -> Choice:
        """This query's mode (gearshift.routing.decision)."""
        return choose_mode(self.probabilities(row), self.expected_costs(row), accuracy_floor, self.pass_value_usd)

    def estimates(self, features: np.ndarray) -> list[tuple[dict[int, float], dict[int, float]]]:
        """Per row of [n, dim] features: P(correct) per mode, expected cost of one attempt per mode."""
        return [(dict(zip(self.modes, p.tolist())), dict(zip(self.modes, c.tolist())))
                for p, c in zip(self.predict(features), self.predict_cost(features))]

    def choose_many(self, features: np.ndarray, accuracy_floor: float) -> list[Choice]:
        """choose() for every row of [n, dim] features."""
        return [choose_mode(p, c, accuracy_floor, self.pass_value_usd) for p, c in self.estimates(features)]

    def save(self, directory: Path) -> Path:
        """Writes the artefact; the directory must not hold one already (versions are immutable)."""
        directory.mkdir(parents=True, exist_ok=True)
        if (directory / METADATA_FILE).exists():
            raise FileExistsError(f"{directory} already holds a router artefact")
        np.savez(directory / WEIGHTS_FILE, weights=self.weights, bias=self.bias, mean=self.mean, scale=self.scale,
                 cost_weights=self.cost_weights, cost_bias=self.cost_bias)
        meta = {
            **self.metadata,
            "format_version": FORMAT_VERSION,
            "version": self.version,
            "feature_spec": self.spec.to_json(),
            "modes": [NAME_OF[m] for m in self.modes],
            "expected_cost_usd": {NAME_OF[m]: c for m, c in self.expected_cost_usd.items()},
            "pass_value_usd": self.pass_value_usd,
        }
        # metadata last: its presence marks a complete artefact
        (directory / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        return directory

    @classmethod
    def load(cls, directory: Path) -> RouterModel:
        meta = json.loads((Path(directory) / METADATA_FILE).read_text())
        found = meta.get("format_version")
        if found not in READABLE_FORMATS:
            raise ValueError(f"router artefact format {found} is not one this code reads ({', '.join(map(str, READABLE_FORMATS))}); "
                             "retrain it with `gearshift train router`")
        with np.load(Path(directory) / WEIGHTS_FILE) as arrays:
            weights, bias, mean, scale = (arrays[k] for k in ("weights", "bias", "mean", "scale"))
            cost_weights, cost_bias = (arrays["cost_weights"], arrays["cost_bias"]) if found >= 2 else (None, None)
        modes = tuple(MODE_OF[name] for name in meta["modes"])
        costs = {MODE_OF[name]: float(c) for name, c in meta["expected_cost_usd"].items()}
        return cls(meta["version"], FeatureSpec.from_json(meta["feature_spec"]), modes, weights, bias, mean, scale, costs, meta,
                   cost_weights, cost_bias, meta.get("pass_value_usd"))


def train_router_model(
    version: str,
    spec: FeatureSpec,
    features: np.ndarray,
    per_mode: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
    expected_cost_usd: Mapping[int, float],
    l2: float,
    max_iterations: int,
    metadata: dict | None = None,
    per_mode_cost: Mapping[int, np.ndarray] | None = None,
    cost_l2: float = 1.0,
    accuracy_floor: float | None = None,
) -> RouterModel:
    """Fits one classifier per mode and, with per_mode_cost, one cost regression per mode;
    with accuracy_floor, the pass value its decisions reach over these queries under that floor.
    per_mode[mode] = (row indices into features, success rates, attempt counts as weights);
    per_mode_cost[mode] = the mean attempt cost of those rows, USD."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale[scale < 1e-9] = 1.0  # constant features stay 0 after standardising
    standard = (features - mean) / scale
    modes = tuple(sorted(per_mode))
    weights, cost_weights = np.zeros((spec.dim, len(modes))), np.zeros((spec.dim, len(modes)))
    bias = np.zeros(len(modes))
    costs = {m: float(expected_cost_usd[m]) for m in modes}
    cost_bias = np.asarray([costs[m] for m in modes])
    for column, mode in enumerate(modes):
        rows, targets, counts = per_mode[mode]
        fit = fit_logistic(standard[rows], targets, counts, l2, max_iterations)
        weights[:, column], bias[column] = fit.weights, fit.bias
        if per_mode_cost is not None:
            ridge = fit_ridge(standard[rows], per_mode_cost[mode], counts, cost_l2)
            cost_weights[:, column], cost_bias[column] = ridge.weights, ridge.bias
    model = RouterModel(version, spec, modes, weights, bias, mean, scale, costs, dict(metadata or {}), cost_weights, cost_bias)
    if accuracy_floor is not None:
        model.pass_value_usd = pass_value(model.estimates(features), accuracy_floor)
    return model
