"""The built-in policy server: one process holding the model behind an OpenAI-compatible HTTP
API (completions, chat completions with tools and reasoning, streaming, hot checkpoint switch).

Run it with `gearshift serve-policy` or `python -m gearshift.services.policy_server`.
"""

import os

# OpenMP threads that spin between torch ops make a shared CPU crawl: when another process holds
# one core, the spinning thread burns the other while the op waits for its partner (measured on
# two shared cores: a batch-of-8 decode step took 0.9-1.5 s spinning, 0.17-0.29 s sleeping).
# libgomp reads this once, when torch loads, so it is set here, before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
