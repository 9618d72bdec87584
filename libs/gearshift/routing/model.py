"""Per-mode success classifiers (L2-regularised logistic regression in numpy) and the versioned
router artefact: weights.npz + metadata.json in one directory.

Inference is one standardisation and one small matrix-vector product: microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gearshift.protocol.modes import MODE_OF, NAME_OF
from gearshift.routing.features import FeatureSpec

FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.npz"
METADATA_FILE = "metadata.json"
# A light pull on the bias: a mode that always (or never) succeeded in training gets a large
# but finite logit instead of one that grows with every Newton step.
BIAS_PENALTY = 1e-3


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


@dataclass
class RouterModel:
    """A trained router: the feature spec, one classifier per mode, expected costs per mode."""

    version: str
    spec: FeatureSpec
    modes: tuple[int, ...]
    weights: np.ndarray  # [dim, len(modes)]
    bias: np.ndarray  # [len(modes)]
    mean: np.ndarray  # feature standardisation, [dim]
    scale: np.ndarray  # [dim]
    expected_cost_usd: dict[int, float]
    metadata: dict = field(default_factory=dict)  # training runs, metrics, config, ...

    def __post_init__(self) -> None:
        dim, count = self.spec.dim, len(self.modes)
        if self.weights.shape != (dim, count) or self.bias.shape != (count,) or self.mean.shape != (dim,) or self.scale.shape != (dim,):
            raise ValueError(f"weights do not fit the feature spec ({dim} features, {count} modes)")
        if set(self.expected_cost_usd) != set(self.modes):
            raise ValueError("expected costs must name exactly the modes with a classifier")

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(correct) per mode: [n, len(modes)] for [n, dim] rows, [len(modes)] for one row."""
        return _sigmoid(((features - self.mean) / self.scale) @ self.weights + self.bias)

    def probabilities(self, row: np.ndarray) -> dict[int, float]:
        return dict(zip(self.modes, self.predict(row).tolist()))

    def save(self, directory: Path) -> Path:
        """Writes the artefact; the directory must not hold one already (versions are immutable)."""
        directory.mkdir(parents=True, exist_ok=True)
        if (directory / METADATA_FILE).exists():
            raise FileExistsError(f"{directory} already holds a router artefact")
        np.savez(directory / WEIGHTS_FILE, weights=self.weights, bias=self.bias, mean=self.mean, scale=self.scale)
        meta = {
            **self.metadata,
            "format_version": FORMAT_VERSION,
            "version": self.version,
            "feature_spec": self.spec.to_json(),
            "modes": [NAME_OF[m] for m in self.modes],
            "expected_cost_usd": {NAME_OF[m]: c for m, c in self.expected_cost_usd.items()},
        }
        # metadata last: its presence marks a complete artefact
        (directory / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        return directory

    @classmethod
    def load(cls, directory: Path) -> RouterModel:
        meta = json.loads((Path(directory) / METADATA_FILE).read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"router artefact format {meta.get('format_version')} is not {FORMAT_VERSION}")
        with np.load(Path(directory) / WEIGHTS_FILE) as arrays:
            weights, bias, mean, scale = (arrays[k] for k in ("weights", "bias", "mean", "scale"))
        modes = tuple(MODE_OF[name] for name in meta["modes"])
        costs = {MODE_OF[name]: float(c) for name, c in meta["expected_cost_usd"].items()}
        return cls(meta["version"], FeatureSpec.from_json(meta["feature_spec"]), modes, weights, bias, mean, scale, costs, meta)


def train_router_model(
    version: str,
    spec: FeatureSpec,
    features: np.ndarray,
    per_mode: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
    expected_cost_usd: Mapping[int, float],
    l2: float,
    max_iterations: int,
    metadata: dict | None = None,
) -> RouterModel:
    """Fits one classifier per mode. per_mode[mode] = (row indices into features, success
    rates, attempt counts as weights)."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale[scale < 1e-9] = 1.0  # constant features stay 0 after standardising
    standard = (features - mean) / scale
    modes = tuple(sorted(per_mode))
    weights = np.zeros((spec.dim, len(modes)))
    bias = np.zeros(len(modes))
    for column, mode in enumerate(modes):
        rows, targets, counts = per_mode[mode]
        fit = fit_logistic(standard[rows], targets, counts, l2, max_iterations)
        weights[:, column], bias[column] = fit.weights, fit.bias
    costs = {m: float(expected_cost_usd[m]) for m in modes}
    return RouterModel(version, spec, modes, weights, bias, mean, scale, costs, dict(metadata or {}))
