"""The built-in policy server: one process holding the model behind an OpenAI-compatible HTTP
API (completions, chat completions with tools and reasoning, streaming, hot checkpoint switch).

Run it with `gearshift serve-policy` or `python -m gearshift.services.policy_server`.
"""

from gearshift.services.policy_server.openmp import set_wait_policy
from gearshift.settings import Settings

# libgomp reads its wait policy once, when torch loads: set here, before anything imports torch
# (a process that already has torch keeps what it has). Settings(), not get_settings(): importing
# must not fix the settings cache.
set_wait_policy(Settings().policy_server.spin_wait)
