"""Checkpoints reload in the policy server's loader with the trained weights."""

import torch
from gearshift import weights
from gearshift.training import checkpoints
from gearshift.training.config import ModelConfig, OptimConfig
from gearshift.training.distributed import Ranks
from gearshift.training.runtime import build_optimizer


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _nudge(model):
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))


def test_full_weights_reload_in_the_policy_server_loader(tiny_dir, tmp_path):
    policy = checkpoints.load_policy(ModelConfig(base=str(tiny_dir)), tmp_path)
    _nudge(policy.model)
    checkpoints.save_weights(policy, tmp_path / "ckpt", Ranks())
    loaded = weights.load(str(tmp_path / "ckpt"), tmp_path)
    ids = torch.tensor([[1, 5, 9, 200]])
    assert torch.allclose(_logits(loaded.model, ids), _logits(policy.model, ids), atol=1e-5)


def test_lora_saves_adapter_and_merged_weights(tiny_dir, tmp_path):
    policy = checkpoints.load_policy(ModelConfig(base=str(tiny_dir), lora=True, lora_rank=4), tmp_path)
    assert policy.is_lora
    _nudge(policy.model)
    checkpoints.save_weights(policy, tmp_path / "ckpt", Ranks())
    assert (tmp_path / "ckpt" / checkpoints.ADAPTER_DIR / "adapter_model.safetensors").exists()
    loaded = weights.load(str(tmp_path / "ckpt"), tmp_path)
    ids = torch.tensor([[1, 5, 9, 200]])
    base = weights.load(str(tiny_dir), tmp_path)
    assert torch.allclose(_logits(loaded.model, ids), _logits(policy.model, ids), atol=1e-5)
    assert not torch.allclose(_logits(base.model, ids), _logits(loaded.model, ids), atol=1e-5)


def test_resume_state_round_trip(tiny_dir, tmp_path):
    policy = checkpoints.load_policy(ModelConfig(base=str(tiny_dir)), tmp_path)
    optimizer, scheduler = build_optimizer(policy.model, OptimConfig(learning_rate=1e-2))
    policy.model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    scheduler.step()
    checkpoints.save_resume(tmp_path / "resume", policy.model, optimizer, scheduler, 7, Ranks())
    fresh = checkpoints.load_policy(ModelConfig(base=str(tiny_dir)), tmp_path)
    fresh_optimizer, fresh_scheduler = build_optimizer(fresh.model, OptimConfig(learning_rate=1e-2))
    assert checkpoints.load_resume(tmp_path / "resume", fresh.model, fresh_optimizer, fresh_scheduler, Ranks()) == 7
    for (name, a), (_, b) in zip(policy.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a, b), name
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    assert fresh_scheduler.last_epoch == scheduler.last_epoch
