"""The tests' vLLM servers apply LoRA with tests/vllm_site/vllm_cpu_lora.py's ops: they give what
vLLM's own CPU ops give, on adapters mixed in one batch, stacked 3-D and 4-D, added or written,
into slices, and on one row against many; compared in vLLM's environment, which has both."""

import subprocess

from tests.vllm_servers import VLLM_PYTHON, vllm_site

COMPARE = """
import importlib, torch, vllm_cpu_lora
from vllm.lora.ops.torch_ops import lora_ops

assert lora_ops.bgmv_shrink is vllm_cpu_lora.bgmv_shrink  # sitecustomize installed them, as in the servers
importlib.reload(lora_ops)  # vLLM's own again

torch.manual_seed(0)
cases = 0
for rows, loras, indices in ((7, 3, [0, 2, 2, -1, 1, 0, 2]), (5, 2, [1] * 5), (1, 2, [1, 1, 1])):
    indices = torch.tensor(indices)
    for stacked in ((loras, 1, 24, 16), (loras, 24, 16)):
        weights, inputs = torch.randn(*stacked), torch.randn(rows, 16)
        for add in (True, False):
            for name, extra in (("bgmv_expand", (add,)), ("bgmv_expand_slice", (8, 24, add)), ("bgmv_shrink", (0.5,))):
                width = 40 if name == "bgmv_expand_slice" else 24
                start = torch.randn(max(rows, len(indices)), width)
                ours, theirs = start.clone(), start.clone()
                getattr(vllm_cpu_lora, name)(inputs, weights, ours, indices, *extra)
                getattr(lora_ops, name)(inputs, weights, theirs, indices, *extra)
                assert torch.allclose(ours, theirs, atol=1e-5), (name, rows, stacked, add)
                cases += 1
print(cases)
"""


def test_the_grouped_lora_ops_give_what_vllms_give():
    done = subprocess.run([str(VLLM_PYTHON), "-c", COMPARE], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(vllm_site()), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) == 36
