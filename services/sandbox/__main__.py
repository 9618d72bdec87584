"""Sandbox service: runs the policy's tool calls in isolation."""
from gearshift.server import main
from gearshift.services.sandbox.service import build

main(build)
