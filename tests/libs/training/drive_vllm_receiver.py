"""Runs in vLLM's own virtual environment (tests/vllm_servers.VLLM_PYTHON): the pinned vLLM's NCCL
weight-transfer engine reading what gearshift's trainer side sends it (weight_transfer.py). Its
worker-side NCCLWeightTransferInitInfo parses the init_info; then, for each bucket, its
NCCLWeightTransferUpdateInfo parses the bucket's update info and its own packed consumer
(packed_tensor.packed_nccl_broadcast_consumer, as NCCLWeightTransferEngine.receive_weights calls
it) receives the bucket. The CPU has no NCCL and no CUDA streams: the communicator is replaced by
one that hands the consumer the next buffer rank 0 sent, and the streams by no-ops; the rest is
vLLM's code.

stdin: {"init_info": {...}, "buckets": [{"update_info": {...}, "flat": BASE64}, ...]}; stdout: one
JSON object: {"init": {its fields}, "broadcasts": [bytes of each broadcast vLLM made],
"loaded": [[name, dtype, shape, sha256 of its bytes], ...] in the order vLLM loaded them}."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sys


class NoStream:
    def synchronize(self) -> None:
        pass


class Handing:
    """The communicator's broadcast as a receiver sees it: the next buffer rank 0 sent."""

    def __init__(self, flats):
        self.flats, self.broadcasts = list(flats), []

    def broadcast(self, tensor, src: int) -> None:
        assert src == 0
        self.broadcasts.append(tensor.numel())
        sent = self.flats.pop(0)
        assert sent.numel() == tensor.numel(), f"vLLM expected {tensor.numel()} bytes, the trainer sent {sent.numel()}"
        tensor.copy_(sent)


def digest(tensor) -> str:
    import torch

    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def main() -> None:
    job = json.load(sys.stdin)
    import torch
    from vllm.distributed.weight_transfer import packed_tensor
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    init = NCCLWeightTransferInitInfo(**job["init_info"])
    packed_tensor._get_streams = lambda device, count: tuple(NoStream() for _ in range(count))
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.accelerator.current_device_index = lambda: 0
    flats = [torch.frombuffer(bytearray(base64.b64decode(bucket["flat"])), dtype=torch.uint8) for bucket in job["buckets"]]
    group, loaded = Handing(flats), []
    for bucket in job["buckets"]:
        update = NCCLWeightTransferUpdateInfo(**bucket["update_info"])
        metadata = ((name, (shape, getattr(torch, dtype))) for name, dtype, shape in zip(update.names, update.dtype_names, update.shapes))
        packed_tensor.packed_nccl_broadcast_consumer(
            iterator=metadata, group=group, src=0, post_unpack_func=loaded.extend, buffer_size_bytes=init.packed_buffer_size_bytes,
            num_buffers=init.packed_num_buffers, device="cpu")
    print(json.dumps({
        "init": {"rank_offset": init.rank_offset, "world_size": init.world_size, "packed": init.packed, "unique_id_bytes": len(init.nccl_unique_id_bytes),
                 "packed_buffer_size_bytes": init.packed_buffer_size_bytes},
        "broadcasts": group.broadcasts,
        "loaded": [[name, str(t.dtype).removeprefix("torch."), list(t.shape), digest(t)] for name, t in loaded],
    }))


if __name__ == "__main__":
    main()
