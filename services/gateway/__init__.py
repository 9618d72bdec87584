"""The OpenAI-compatible HTTP gateway: chat completions in front of executor.Solve, the model
names that pick a routing strategy or pin a mode, and feedback that becomes a reward."""
