"""Reward service: correctness, format validity, cost, the APO and SR2AM rewards, cost of pass."""
from gearshift.cli import serve_service

serve_service("reward")
