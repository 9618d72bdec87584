"""Planner service: SR2AM System III (configurator) and System II (simulative planner)."""
