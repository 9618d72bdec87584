"""vLLM's CPU LoRA ops (vllm/lora/ops/torch_ops/lora_ops.py) without their per-token copy of each
adapter matrix, for the tests' vLLM servers (sitecustomize.py beside this file installs them).

vLLM's CPU build applies LoRA with `lora_b_weights[lora_indices_tensor]`: a copy of the adapter's
matrix for every token, then a batched matrix-vector product, so a prefill of n tokens copies n
matrices per adapted layer. These ops do one matmul per adapter in the batch: the same products,
the same outputs (tests/test_vllm_cpu_lora.py), about 2.3 times faster on the end-to-end tests'
requests (an 891-token prompt and 32 tokens on the default policy's adapter: 21 to 25 s against
about 10; the base model without LoRA: 6 to 7 s). The GPU build runs its own kernels."""

import torch


def _lora_outputs(inputs, weights, indices, dtype):
    """inputs [b, i] times the adapter matrix each row's index names ([n, o, i] or [n, 1, o, i]):
    one matmul per adapter in the batch, where vLLM's ops copy a matrix per token."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    if indices.numel() == 0 or inputs.shape[0] != indices.shape[0]:  # vLLM's own way (einsum broadcasts one row)
        return torch.einsum("bi, boi -> bo", inputs, weights[indices].to(dtype))
    first = int(indices[0])
    if bool((indices == first).all()):
        return inputs @ weights[first].to(dtype).T
    outputs = inputs.new_empty(inputs.shape[0], weights.shape[1])
    for index in indices.unique().tolist():
        rows = (indices == index).nonzero().squeeze(1)
        outputs[rows] = inputs[rows] @ weights[index].to(dtype).T
    return outputs


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    outputs = _lora_outputs(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    outputs = _lora_outputs(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs=True):
    outputs = _lora_outputs(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def install() -> None:
    import vllm.lora.ops.torch_ops as package
    from vllm.lora.ops.torch_ops import lora_ops

    for name in ("bgmv_expand", "bgmv_shrink", "bgmv_expand_slice"):
        setattr(lora_ops, name, globals()[name])  # the sgmv_* ops call these by module name
        setattr(package, name, globals()[name])
