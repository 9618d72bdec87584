"""Fixtures: tiny checkpoints (random weights, the real SmolLM2 tokenizer), a fresh Postgres
database for the orchestration tables, and settings pointing at them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gearshift import weights
from gearshift.settings import Settings
from gearshift.storage import create_store_engine, upgrade_to_head
from gearshift.testing.postgres import scratch_database


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> list[Path]:
    """Two seeded tiny Llamas (different weights, same tokenizer) as checkpoint directories."""
    models = tmp_path_factory.mktemp("tiny-models")
    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    return [weights.create_tiny(models / f"tiny-{seed}", seed=seed, tokenizer=tokenizer) for seed in (0, 1)]


@pytest.fixture
def orchestration_db():
    """A fresh, migrated Postgres database of its own (the store tests truncate the shared one)."""
    with scratch_database("gearshift_orch") as url:
        engine = create_store_engine(url, pool_size=2)
        upgrade_to_head(engine)
        try:
            yield engine
        finally:
            engine.dispose()


@pytest.fixture
def fake_kube():
    """A fake Kubernetes API over HTTP (tests/fake_kubernetes.py); fake_kube.api_client is a real
    kubernetes ApiClient pointed at it."""
    from tests.fake_kubernetes import fake_kubernetes

    with fake_kubernetes() as fake:
        yield fake


@pytest.fixture
def kubeconfig(fake_kube, tmp_path, monkeypatch):
    """A kubeconfig naming the fake, as `kubectl config` would write one for a cluster."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake_kube.url}}],
        "users": [{"name": "worker", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "worker", "namespace": "serving"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path
