"""Greedy tokens of an exported checkpoint from transformers and from the built-in policy server,
for the tests that check an export serves what it learned."""

from __future__ import annotations

from pathlib import Path

import httpx
import torch


async def transformers_and_builtin_greedy(checkpoint: Path, data_dir: Path, prompt: str, count: int) -> tuple[list[int], list[int]]:
    """(transformers' greedy token ids, the built-in server's) for prompt, count new tokens each."""
    from gearshift.services.policy_server.server import running
    from gearshift.settings import PolicyServerSettings, Settings
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(checkpoint).encode(prompt, return_tensors="pt")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32)
    expected = model.generate(ids, max_new_tokens=count, do_sample=False)[0, ids.shape[1]:].tolist()
    served = PolicyServerSettings(model=str(checkpoint), port=0, threads=1)
    async with running(Settings(data_dir=data_dir, metrics_port=0, log_level="WARNING", policy_server=served)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
            body = {"prompt": prompt, "max_tokens": count, "temperature": 0, "return_token_ids": True}
            reply = (await http.post("/completions", json=body)).json()
    return expected, reply["choices"][0]["token_ids"]
