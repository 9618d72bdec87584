"""Reward service: correctness, format validity, cost, the APO and SR2AM rewards, cost of pass."""
