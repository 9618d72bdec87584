"""Sandbox service: runs the policy's tool calls in isolation."""
from gearshift.cli import serve_service

serve_service("sandbox")
