"""Greedy tokens of a checkpoint on vLLM's CPU build, offline (run with vLLM's own Python):

    vllm-venv/bin/python tests/jobs/vllm_greedy.py CHECKPOINT PROMPT MAX_TOKENS

prints the generated token ids as a line "TOKENS <JSON list>" (vLLM logs to stdout too)."""

import json
import sys

from vllm import LLM, SamplingParams

if __name__ == "__main__":  # vLLM's engine starts processes that import this file again
    checkpoint, prompt, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = LLM(model=checkpoint, dtype="float32", max_model_len=512, enforce_eager=True)
    (result,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens))
    print("TOKENS", json.dumps(list(result.outputs[0].token_ids)), flush=True)
