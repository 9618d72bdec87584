"""Loaded by every Python process of the tests' vLLM servers (tests/vllm_servers.py puts this folder
on their PYTHONPATH): vLLM's CPU LoRA ops grouped by adapter (vllm_cpu_lora.py)."""

import vllm_cpu_lora

vllm_cpu_lora.install()
