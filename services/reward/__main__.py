"""Reward service: correctness, format validity, cost, the APO and SR2AM rewards, cost of pass."""
from gearshift.server import main
from gearshift.services.reward.service import build

main(build)
