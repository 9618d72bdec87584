"""Greedy tokens of a checkpoint with a LoRA adapter on vLLM's CPU build, offline (run with
vLLM's own Python):

    vllm-venv/bin/python tests/jobs/vllm_lora_greedy.py CHECKPOINT ADAPTER PROMPT MAX_TOKENS MAX_LORA_RANK

prints the generated token ids as a line "TOKENS <JSON list>" (vLLM logs to stdout too)."""

import json
import sys

from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

if __name__ == "__main__":  # vLLM's engine starts processes that import this file again
    checkpoint, adapter, prompt, max_tokens, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    llm = LLM(model=checkpoint, dtype="float32", max_model_len=512, enforce_eager=True, enable_lora=True, max_lora_rank=rank)
    (result,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens), lora_request=LoRARequest("adapter", 1, adapter))
    print("TOKENS", json.dumps(list(result.outputs[0].token_ids)), flush=True)
