"""Weights streamed bucket by bucket (gearshift.training.weight_stream) arrive equal to the export,
tensor for tensor, in its names and order, with no process holding more than one bucket beyond its
shards (the largest parameter, when it exceeds a bucket, travelling alone)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from gearshift.testing.ports import free_port
from gearshift.training import checkpoints, weight_stream
from gearshift.training.config import ModelConfig
from gearshift.training.distributed import Ranks
from gearshift.training.tiny import tiny_moe_checkpoint
from gearshift.training.weight_transfer import init_info, require_cuda, wire_bytes
from safetensors.torch import load_file
from tests.libs.training import weight_stream_worker
from tests.rank_processes import run_ranks
from tests.vllm_servers import VLLM_PYTHON

ROOT = Path(__file__).parents[3]
DRIVER = Path(__file__).with_name("drive_vllm_receiver.py")
KIB = 1024


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return tiny_moe_checkpoint(tmp_path_factory.mktemp("training") / "tiny-moe")


def header_names(path: Path) -> list[str]:
    """A safetensors file's tensor names in the order its header lists them (the order written)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return [name for name in header if name != "__metadata__"]


def test_buckets_keep_the_order_and_hold_the_parameter_being_copied_in_within_the_bucket_size():
    # 40 + 30 + its largest 40 = 110 > 100: the 30 starts the next bucket; 30 + 20 + 30 = 80 fits;
    # 50 + 30 + 50 = 130 does not; 250 fits beside nothing and goes alone; 4 + 2 + 4 = 10 fits, but
    # the 4-byte tensor after 6 bytes would lie off its alignment.
    sizes = [40, 30, 20, 30, 250, 4, 2, 4]
    itemsizes = [2, 2, 2, 2, 2, 2, 2, 4]
    assert weight_stream.plan_buckets(sizes, itemsizes, 100) == [[0], [1, 2], [3], [4], [5, 6], [7]]


def test_a_bucket_unpacks_the_buffer_its_update_info_describes():
    tensors = {"a.weight": torch.randn(3, 4).to(torch.bfloat16), "b.bias": torch.arange(5, dtype=torch.float32),
               "c.weight": torch.randn(2, 2).to(torch.bfloat16)}
    bucket = weight_stream.Bucket(tuple(tensors), tuple(t.dtype for t in tensors.values()), tuple(tuple(t.shape) for t in tensors.values()))
    info = bucket.update_info()
    assert info == {"names": ["a.weight", "b.bias", "c.weight"], "dtype_names": ["bfloat16", "float32", "bfloat16"],
                    "shapes": [[3, 4], [5], [2, 2]]}  # vLLM's NCCLWeightTransferUpdateInfo, field for field
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()])
    unpacked = weight_stream.Bucket.from_update_info(json.loads(json.dumps(info))).unpack(flat)
    assert [name for name, _ in unpacked] == list(tensors)
    assert all(torch.equal(got, tensors[name]) and got.dtype == tensors[name].dtype for name, got in unpacked)


def test_nccl_without_cuda_is_refused():
    with pytest.raises(ValueError, match="needs the trainer on CUDA"):
        require_cuda(torch.device("cpu"))


def test_one_process_streams_to_a_receiver_what_it_exports(tiny_dir, tmp_path):
    policy = checkpoints.load_policy(ModelConfig(base=str(tiny_dir)), tmp_path)
    checkpoints.save_weights(policy, tmp_path / "export", Ranks(), torch.bfloat16)
    address, received = f"127.0.0.1:{free_port()}", []

    def receiver():
        received.extend(weight_stream.receive(weight_stream.GlooGroup(address, 1, 2)))

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    tensors = checkpoints.export_tensors(policy, torch.bfloat16)
    streamed = asyncio.run(weight_stream.to_receivers(tensors, 32 * KIB, weight_stream.GlooGroup(address, 0, 2)))
    thread.join(60)
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert [name for name, _ in received] == header_names(tmp_path / "export" / "model.safetensors")
    assert all(torch.equal(tensor, exported[name]) and tensor.dtype == torch.bfloat16 for name, tensor in received)
    assert len(streamed.buckets) > 5 and streamed.bytes == sum(t.numel() * 2 for t in exported.values())
    assert all(nbytes <= peak <= max(32 * KIB, nbytes) for nbytes, peak in streamed.buckets)


@pytest.mark.slow("two trainer ranks and a receiver process")
@pytest.mark.ranks
def test_two_fsdp_ranks_stream_to_a_receiver_process_what_they_export(tiny_dir, moe_dir, tmp_path):
    """A tiny Llama in bf16 and a tiny Qwen3-MoE in float32 (its fused experts split per expert),
    sharded over 2 ranks: the receiver gets the export's files, tensor for tensor, in their order;
    every rank holds at most a bucket (rank 0: at least the bucket it sends), or the one parameter
    larger than a bucket (the embeddings) alone."""
    bucket_bytes, address, out = 32 * KIB, f"127.0.0.1:{free_port()}", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    receiver = subprocess.Popen([sys.executable, "-m", "gearshift.training.weight_stream", "--address", address, "--streams", "2",
                                 "--out", str(out / "received"), "--save"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        run_ranks(2, weight_stream_worker.main, address, str(bucket_bytes), str(out), f"{tiny_dir}:bfloat16", f"{moe_dir}:float32", timeout=300)
        assert receiver.wait(60) == 0, receiver.stderr.read()[-3000:]
    finally:
        receiver.kill()
    seen = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    for index, dtype in enumerate((torch.bfloat16, torch.float32)):
        files = out / f"export-{index}" / "model.safetensors"
        exported, streamed = load_file(files), load_file(out / "received" / f"stream-{index}.safetensors")
        assert json.loads((out / "received" / "report.json").read_text())[index]["names"] == header_names(files)
        assert streamed.keys() == exported.keys()
        assert all(torch.equal(streamed[name], exported[name]) and streamed[name].dtype == dtype for name in exported)
        largest = max(t.numel() * t.element_size() for t in exported.values())
        assert largest > bucket_bytes and len(seen[0][index]["buckets"]) > 10
        for rank, report in enumerate(seen):
            assert all(peak <= max(bucket_bytes, nbytes) for nbytes, peak in report[index]["buckets"]), (rank, report[index]["buckets"])
            assert report[index]["peak_held"] == largest  # the embeddings, whole, and nothing beside them
        assert all(peak >= nbytes for nbytes, peak in seen[0][index]["buckets"])  # rank 0 held each bucket it sent
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in streamed  # the checkpoint layout: a matrix per expert


class Kept:
    """A Sink that keeps what rank 0 sends: each bucket and a copy of its buffer."""

    device = torch.device("cpu")

    def __init__(self):
        self.sent: list[tuple[weight_stream.Bucket, torch.Tensor]] = []

    async def send(self, bucket: weight_stream.Bucket, flat: torch.Tensor) -> None:
        self.sent.append((bucket, flat.clone()))


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.vllm
def test_the_pinned_vllms_nccl_engine_reads_the_buckets_as_sent(moe_dir, tmp_path):
    """vLLM's own init and update info classes parse the payloads, and its packed consumer, given
    each bucket's update info in its own /update_weights call, makes one broadcast of exactly the
    bucket's bytes (an MoE layer's experts, split per expert, larger than a bucket: 8 tensors in one
    buffer) and loads the export's tensors in its order (the NCCL communicator aside: no GPU here)."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"vLLM is not installed at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    policy = checkpoints.load_policy(ModelConfig(base=str(moe_dir)), tmp_path)
    tensors, bucket_bytes, kept = checkpoints.export_tensors(policy, torch.bfloat16), 16 * KIB, Kept()
    asyncio.run(weight_stream.stream(tensors, bucket_bytes, kept))
    job = {"init_info": init_info(os.urandom(128), 1, wire_bytes(tensors, bucket_bytes)),
           "buckets": [{"update_info": bucket.update_info(), "flat": base64.b64encode(flat.numpy().tobytes()).decode()} for bucket, flat in kept.sent]}
    done = subprocess.run([str(VLLM_PYTHON), str(DRIVER)], input=json.dumps(job), capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))
    assert done.returncode == 0, done.stderr[-3000:]
    vllm = json.loads(done.stdout.splitlines()[-1])
    assert vllm["init"] == {"rank_offset": 1, "world_size": 2, "packed": True, "unique_id_bytes": 128,
                            "packed_buffer_size_bytes": max(bucket.nbytes for bucket, _ in kept.sent)}
    assert any(len(bucket.names) == 8 and bucket.nbytes > bucket_bytes for bucket, _ in kept.sent)
    assert vllm["broadcasts"] == [bucket.nbytes for bucket, _ in kept.sent]
    checkpoints.save_weights(policy, tmp_path / "export", Ranks(), torch.bfloat16)
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert vllm["loaded"] == [[name, "bfloat16", list(exported[name].shape), digest(exported[name])]
                              for name in header_names(tmp_path / "export" / "model.safetensors")]
