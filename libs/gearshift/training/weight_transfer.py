"""rollout.weight_transfer "nccl": a run's full weights into a running vLLM over NCCL after each
update, with no checkpoint written to the shared volume and read back (the "volume" route,
on_policy.RemotePolicy, stays the default and the fallback).

vLLM 0.32's NCCL weight-transfer engine (vllm/distributed/weight_transfer/nccl_engine.py) receives
them; the trainer's side is weight_stream's, with no vLLM code here:
- once: rank 0 mints an NCCL unique id and POSTs /init_weight_transfer_engine with it
  (nccl_unique_id_b64, rank_offset 1, world_size 1 + vLLM's workers, the packed wire parameters)
  while it joins the communicator as its rank 0 (both block until every member is in);
- each update: POST /pause?mode=keep (a request in flight waits: between start and finish vLLM's
  layers are being reloaded), /start_weight_update, then for each bucket POST /update_weights with
  its update info while the bucket's buffer is broadcast (vLLM's worker receives inside that call),
  then /finish_weight_update (the step as weight_version), /resume and /reset_prefix_cache (blocks
  cached with the old weights). packed_buffer_size_bytes is at least the largest bucket, so vLLM's
  consumer takes each call's tensors as one buffer, exactly the bucket sent.
vLLM runs with VLLM_SERVER_DEV_MODE=1 (the routes) and --weight-transfer-config '{"backend":
"nccl"}'; every trainer rank takes part (making the weights whole is a collective), rank 0 alone
talks to vLLM."""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass

import torch

from gearshift.errors import GearshiftError
from gearshift.policy_client import PolicyClient
from gearshift.training import checkpoints, distributed, weight_stream
from gearshift.training.runtime import Run

log = logging.getLogger("gearshift.training.weight_transfer")

BUCKET_BYTES = 1 << 30  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES
PACKED_NUM_BUFFERS = 2  # vLLM's default: only its receiving streams depend on it


def require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(f"rollout.weight_transfer 'nccl' streams over NCCL, which needs the trainer on CUDA (this run is on {device.type}): use 'volume'")


def init_info(unique_id: bytes, workers: int, wire_bytes: int) -> dict:
    """What POST /init_weight_transfer_engine carries as init_info: vLLM's worker-side
    NCCLWeightTransferInitInfo, joining through the unique id (no TCPStore, no vLLM code on this
    side), the trainer's rank 0 the sender and the workers after it, the packed wire format with
    buffers of wire_bytes: at least the largest bucket, so vLLM takes each /update_weights call's
    tensors as one buffer."""
    return {"rank_offset": 1, "world_size": 1 + workers, "nccl_unique_id_b64": base64.b64encode(unique_id).decode(),
            "packed": True, "packed_buffer_size_bytes": wire_bytes, "packed_num_buffers": PACKED_NUM_BUFFERS}


def wire_bytes(tensors: list[checkpoints.ExportedTensor], bucket_bytes: int) -> int:
    """The packed buffer size vLLM is told: bucket_bytes, or the largest bucket if larger (a lone parameter)."""
    return max([bucket_bytes] + [sum(t.nbytes for unit in bucket for t in unit) for bucket in weight_stream.buckets_of(tensors, bucket_bytes)])


def exported(run: Run) -> list[checkpoints.ExportedTensor]:
    """The tensors run.save_weights writes, in its order (the stream carries exactly those)."""
    return checkpoints.export_tensors(run.policy, run.dtype)


@dataclass
class VllmSink:
    """rank 0's buckets into vLLM: each bucket's update info POSTed while its buffer is broadcast."""

    client: PolicyClient
    group: weight_stream.NcclGroup
    device: torch.device

    async def send(self, bucket: weight_stream.Bucket, flat: torch.Tensor) -> None:
        await alongside(self.client.vllm_admin("/update_weights", {"update_info": bucket.update_info()}), self.device,
                        self.group.broadcast, flat)


async def alongside(request, device: torch.device, collective, *args):
    """collective(*args) in a thread on device while request (a call vLLM answers once its workers
    have done their side of the collective) runs; returns the collective's result. A request that
    fails first is raised at once: vLLM will not join, the collective waits in vain, the group is
    unusable and the job stops (its thread left behind)."""
    asking = asyncio.ensure_future(request)
    doing = asyncio.ensure_future(distributed.in_thread(device, collective, *args))
    done, _ = await asyncio.wait({asking, doing}, return_when=asyncio.FIRST_COMPLETED)
    if asking in done and asking.exception() is not None:
        raise asking.exception()
    result = await doing
    await asking
    return result


@dataclass
class VllmWeights:
    """The NCCL route to one vLLM server: opened once per run on every rank (open), then publish()
    after each update, close() at the end. client and group are rank 0's."""

    client: PolicyClient | None
    group: weight_stream.NcclGroup | None
    device: torch.device
    bucket_bytes: int = BUCKET_BYTES

    @classmethod
    async def open(cls, run: Run, client: PolicyClient | None, bucket_bytes: int = BUCKET_BYTES) -> VllmWeights:
        require_cuda(run.ranks.device)
        if not run.ranks.main:
            return cls(None, None, run.ranks.device, bucket_bytes)
        workers, unique_id = await client.vllm_workers(), weight_stream.NcclGroup.unique_id()
        body = {"init_info": init_info(unique_id, workers, wire_bytes(exported(run), bucket_bytes))}
        group = await alongside(client.vllm_admin("/init_weight_transfer_engine", body), run.ranks.device,
                                weight_stream.NcclGroup, unique_id, 0, 1 + workers, run.ranks.device)
        log.info("weights reach vLLM at %s over NCCL: %d worker(s), buckets of at most %d bytes", client.base_url, workers, bucket_bytes)
        return cls(client, group, run.ranks.device, bucket_bytes)

    async def publish(self, run: Run, step: int) -> weight_stream.Streamed:
        """Gives vLLM the run's current weights as step's (every rank calls it)."""
        client = self.client
        if client is None:
            return await weight_stream.stream(exported(run), self.bucket_bytes, None)
        await client.vllm_admin("/pause", params={"mode": "keep"})
        try:
            await client.vllm_admin("/start_weight_update")
            streamed = await weight_stream.stream(exported(run), self.bucket_bytes, VllmSink(client, self.group, self.device))
            await client.vllm_admin("/finish_weight_update", {"weight_version": str(step)})
        finally:
            await client.vllm_admin("/resume")
        await client.vllm_admin("/reset_prefix_cache")
        return streamed

    async def close(self) -> None:
        """vLLM drops the trainer's group (it goes on serving). A refusal (an update cut short is
        still active there) is logged, not raised: it would hide why the run stopped."""
        if self.client is None:
            return
        try:
            await self.client.vllm_admin("/shutdown_weight_transfer_engine")
        except GearshiftError as exc:
            log.warning("vLLM at %s kept the trainer's weight-transfer group: %s", self.client.base_url, exc)
