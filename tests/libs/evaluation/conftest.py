"""The real-model fixtures of the end-to-end tests, shared rather than copied."""

from tests.e2e.conftest import builtin_policy, smollm2_dir  # noqa: F401
