"""The built-in policy server: one process holding the model behind an OpenAI-compatible HTTP
API (completions, chat completions with tools and reasoning, streaming, hot checkpoint switch).

Run it with `gearshift serve-policy` or `python -m gearshift.services.policy_server`.
"""
