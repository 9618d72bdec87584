"""FSDP's layout: each decoder layer, the embeddings and the head (one group when tied) sharded on
their own, then the root; on a 2-D mesh (HSDP) 2 ranks as 1 x 2 or 2 x 1 learn what one process
learns; each decoder layer compiled, a run still trains."""

from __future__ import annotations

import pytest
import torch

from tests.jobs.rank_runs import assert_same_run


@pytest.fixture(scope="module")
def runs(worker_runs) -> dict[str, dict]:
    """layout_cases' runs by name, without their "layout-": two SFT steps on the tiny model in each
    layout (tests/jobs/rank_runs.py), in the rank tests' launches."""
    return {name.removeprefix("layout-"): run for named in worker_runs.values() for name, run in named.items() if name.startswith("layout-")}


@pytest.mark.ranks
@pytest.mark.parametrize("shape", ["1x2", "2x1"])
def test_two_ranks_on_a_two_dimensional_mesh_learn_what_one_process_learns(runs, shape):
    assert_same_run(runs[shape], runs["eager"])


@pytest.mark.ranks
def test_a_run_with_compiled_decoder_layers_trains(runs):
    # aot_eager: dynamo captures each layer's graph and AOT autograd its backward, as inductor
    # would, without generating kernels (minutes on 2 cores).
    assert_same_run(runs["compiled"], runs["eager"])


def test_shard_groups_layers_embeddings_and_head_then_the_root(tiny_dir, tmp_path):
    """One process in a process group of one, so fully_shard runs: the tied embedding and head are
    one group of their own, each decoder layer its own, the root holds neither."""
    import torch.distributed as dist
    from gearshift.training import checkpoints, distributed, forward
    from gearshift.training.config import ModelConfig, RuntimeConfig
    from torch.distributed.fsdp import FSDPModule

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = checkpoints.load_policy(ModelConfig(base=str(tiny_dir)), tmp_path).model
        module = distributed.shard(forward.TargetForward(model), distributed.Ranks(), RuntimeConfig(), torch.float32)
        embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
        assert head.weight is embeddings.weight
        assert isinstance(embeddings, FSDPModule) and isinstance(head, FSDPModule)
        state = embeddings._get_fsdp_state()
        assert head._get_fsdp_state() is state  # one group: a tied weight is one parameter
        (group,) = [state._fsdp_param_group]
        assert [p._module_info.param_name for p in group.fsdp_params] == ["weight"]
        layers = distributed.decoder_layers(module)
        assert all(isinstance(layer, FSDPModule) for layer in layers)
        assert len({id(layer._get_fsdp_state()) for layer in layers}) == len(layers)
        root = module._get_fsdp_state()._fsdp_param_group
        held = {id(p.sharded_param) for p in root.fsdp_params}
        assert id(embeddings.weight) not in held and len(root.fsdp_params) == 1  # the final norm alone
    finally:
        dist.destroy_process_group()
