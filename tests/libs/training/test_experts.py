"""Expert parallelism's own parts, in one process: the all-to-all forward (over an ep group of
one) computes what transformers' experts compute, gradients included, and the degrees that
cannot apply are refused in one line. The ranks themselves: tests/jobs/test_distributed.py."""

import pytest
import torch
import torch.distributed as dist
from gearshift.training import distributed, loading
from gearshift.training.config import RuntimeConfig
from gearshift.training.distributed import Ranks
from gearshift.training.experts import ParallelExperts, experts_of, take_forward


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from gearshift.training.tiny import tiny_moe_checkpoint

    return tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "tiny-moe")


def test_the_all_to_all_forward_computes_what_transformers_experts_compute(moe_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32)
    experts = experts_of(model)[0]
    torch.manual_seed(0)
    hidden = torch.randn(11, 64, requires_grad=True)
    weights, chosen = torch.softmax(torch.randn(11, 4), -1).topk(2, dim=-1)
    chosen[0] = torch.tensor([3, 1])  # not in expert order
    expected = experts(hidden, chosen, weights)
    expected.square().sum().backward()
    grads = [tensor.grad.clone() for tensor in (hidden, experts.gate_up_proj, experts.down_proj)]
    for tensor in (hidden, experts.gate_up_proj, experts.down_proj):
        tensor.grad = None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        take_forward(experts, ParallelExperts)
        experts.ep_group = dist.group.WORLD
        got = experts(hidden, chosen, weights)
        got.square().sum().backward()
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(got, expected)
    for grad, tensor in zip(grads, (hidden, experts.gate_up_proj, experts.down_proj)):
        torch.testing.assert_close(tensor.grad, grad)


@pytest.mark.parametrize("degree, world_size, runtime, message", [
    (3, 3, {}, "runtime.expert_parallel 3 does not divide the model's 4 experts"),
    (2, 3, {}, "runtime.expert_parallel 2 does not divide the job's 3 ranks"),
    (2, 2, {"parallelism": "ddp"}, "runtime.expert_parallel needs runtime.parallelism fsdp"),
    (2, 4, {"mesh_shape": (2, 2)}, "runtime.expert_parallel with HSDP"),
])
def test_degrees_that_cannot_apply_are_refused_in_one_line(moe_dir, degree, world_size, runtime, message):
    model, _ = loading.build(moe_dir, torch.float32)
    with pytest.raises(ValueError, match=message):
        distributed.check_expert_parallel(model, Ranks(world_size=world_size), RuntimeConfig(expert_parallel=degree, **runtime))


def test_a_dense_model_with_expert_parallelism_is_refused(tiny_dir):
    model, _ = loading.build(tiny_dir, torch.float32)
    with pytest.raises(ValueError, match="runtime.expert_parallel is 2, but the model has no mixture-of-experts layers"):
        distributed.check_expert_parallel(model, Ranks(world_size=2), RuntimeConfig(expert_parallel=2))
