"""Loaded by every Python process of the tests' vLLM servers (tests/vllm_servers.py puts this folder
on their PYTHONPATH): vLLM's CPU LoRA ops grouped by adapter (vllm_cpu_lora.py), and its message
queues polled instead of spun on (vllm_no_spin.py)."""

import vllm_cpu_lora
import vllm_no_spin

vllm_cpu_lora.install()
vllm_no_spin.install()
