"""Shared fixtures: settings isolated from the developer's environment."""

from __future__ import annotations

import pytest

from gearshift.settings import Settings


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, metrics_port=0)
