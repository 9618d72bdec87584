"""Weights to a rollout fleet without a disk round trip: the tensors checkpoints.save_weights
exports (the same names, layouts, dtype and values, a LoRA adapter merged), made whole parameter
by parameter from the FSDP shards, packed into buckets and broadcast bucket by bucket from the
trainer's rank 0 to receivers in a small process group of their own (rank 0 and the receivers,
apart from the trainer's torchrun world).

The exchange has the shape of vLLM's packed NCCL weight transfer (vllm/distributed/weight_transfer/
nccl_engine.py and packed_tensor.py): a bucket travels as one flat uint8 buffer broadcast from
group rank 0, described by its update info (names, dtype_names, shapes, in buffer order; each
tensor's offset is the sum of the sizes before it). vLLM's workers get the update info over HTTP
(weight_transfer.py); the receiver here (receive) gets it by a broadcast just before the bucket, so
a plain process receives over gloo on the CPU (the tests) or over NCCL (the GPU check).

Memory: every rank makes one parameter whole at a time (full_tensor(), a collective) and drops it
once rank 0 has copied it into the bucket's buffer. Rank 0 holds at most that buffer and the
parameter being copied in, which the plan (plan_buckets) keeps within bucket_bytes; a parameter
that does not fit beside another travels alone as its own buffer, with no copy. Held counts the
bytes of whole tensors a process holds, its own shards aside.

A receiver process (the tests' and the GPU check's):

    python -m gearshift.training.weight_stream --address HOST:PORT --size 2 --streams 1 --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # a receiver process needs none of the training stack
    from gearshift.training.checkpoints import ExportedTensor

GROUP_TIMEOUT = datetime.timedelta(minutes=10)  # a receiver may join long after the trainer opens the group
UNIQUE_ID_KEY = "nccl-unique-id"


@dataclass(frozen=True)
class Bucket:
    """What one broadcast buffer holds, in order: as vLLM's NCCLWeightTransferUpdateInfo has it."""

    names: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, tensors: Sequence[ExportedTensor]) -> Bucket:
        return cls(tuple(t.name for t in tensors), tuple(t.dtype for t in tensors), tuple(tuple(t.shape) for t in tensors))

    @property
    def sizes(self) -> list[int]:
        return [math.prod(shape) * dtype.itemsize for shape, dtype in zip(self.shapes, self.dtypes)]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def update_info(self) -> dict:
        """vLLM's update info: the body of POST /update_weights, and the header receive() reads."""
        return {"names": list(self.names), "dtype_names": [str(dtype).removeprefix("torch.") for dtype in self.dtypes],
                "shapes": [list(shape) for shape in self.shapes]}

    @classmethod
    def from_update_info(cls, info: dict) -> Bucket:
        dtypes = tuple(getattr(torch, name) for name in info["dtype_names"])
        if not all(isinstance(dtype, torch.dtype) for dtype in dtypes):
            raise ValueError(f"not torch dtypes: {info['dtype_names']}")
        return cls(tuple(info["names"]), dtypes, tuple(tuple(shape) for shape in info["shapes"]))

    def unpack(self, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The named tensors of a received buffer: views of it, as vLLM's unpack_tensor makes them."""
        if flat.numel() != self.nbytes:
            raise ValueError(f"a bucket of {self.nbytes} bytes received {flat.numel()}")
        parts = flat.split(self.sizes)
        return [(name, part.view(dtype).view(shape)) for name, dtype, shape, part in zip(self.names, self.dtypes, self.shapes, parts)]


def plan_buckets(sizes: Sequence[int], itemsizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive parameters (their export bytes and element size) grouped into buckets, in order.
    One joins the current bucket while the bucket and the largest of its parameters fit in
    bucket_bytes (rank 0 holds the buffer and one whole parameter while it copies that one in)
    and the bucket's size so far is a multiple of its element size (a receiver views it in place);
    a parameter that fits beside none travels alone, with no copy, however large."""
    buckets: list[list[int]] = []
    size = largest = 0
    for index, (nbytes, itemsize) in enumerate(zip(sizes, itemsizes)):
        if not buckets or size + nbytes + max(largest, nbytes) > bucket_bytes or size % itemsize:
            buckets.append([])
            size = largest = 0
        buckets[-1].append(index)
        size, largest = size + nbytes, max(largest, nbytes)
    return buckets


def parameters(tensors: Sequence[ExportedTensor]) -> list[list[ExportedTensor]]:
    """The export's tensors grouped by the parameter they come from (one, or an MoE layer's fused
    experts split per expert: consecutive tensors laid out like the same parameter)."""
    groups: list[list[ExportedTensor]] = []
    for tensor in tensors:
        if groups and groups[-1][0].like is tensor.like:
            groups[-1].append(tensor)
        else:
            groups.append([tensor])
    return groups


def buckets_of(tensors: Sequence[ExportedTensor], bucket_bytes: int) -> list[list[list[ExportedTensor]]]:
    """The export's parameters in their buckets (plan_buckets)."""
    units = parameters(tensors)
    sizes = [sum(t.nbytes for t in unit) for unit in units]
    itemsizes = [unit[0].dtype.itemsize for unit in units]
    return [[units[i] for i in bucket] for bucket in plan_buckets(sizes, itemsizes, bucket_bytes)]


def whole(unit: Sequence[ExportedTensor]) -> torch.Tensor:
    """A parameter's export tensors made whole on every rank, flat, in export order (a collective:
    every rank calls it for the same parameter). Each rank's part is what the export writes from it
    (ExportedTensor.rows: cast, a LoRA adapter merged), laid out as the parameter's local shard;
    full_tensor() gathers the parts as the parameter's own placements say. An MoE layer's experts
    are split per expert: the pieces of a rank's experts tile its rows in order, so they are joined
    into its rows first."""
    from torch.distributed.tensor import DTensor

    like = unit[0].like
    parts = [tensor.rows() for tensor in unit]
    if len(parts) == 1 and parts[0].dim() == like.dim():
        local = parts[0]  # the parameter itself: its local block (rows, and columns under tensor parallelism)
    else:
        local = torch.cat([part.reshape(-1) for part in parts]).view(-1, *like.shape[1:])
    if isinstance(like, DTensor):
        local = DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                                   stride=like.stride()).full_tensor()
    flat = local.contiguous().view(-1)
    if flat.numel() * flat.element_size() != sum(tensor.nbytes for tensor in unit):
        raise ValueError(f"{unit[0].name}: made {flat.numel() * flat.element_size()} bytes of {sum(t.nbytes for t in unit)}")
    return flat


@dataclass
class Held:
    """Bytes of whole tensors this process holds at once, its own shards aside: now, the most
    ever, and the most since the last window()."""

    now: int = 0
    peak: int = 0
    window_peak: int = 0

    def take(self, nbytes: int) -> None:
        self.now += nbytes
        self.peak, self.window_peak = max(self.peak, self.now), max(self.window_peak, self.now)

    def drop(self, nbytes: int) -> None:
        self.now -= nbytes

    def window(self) -> int:
        """The most held since the last call; a new window starts at what is held now."""
        most, self.window_peak = self.window_peak, self.now
        return most


@dataclass
class Streamed:
    """One stream as this rank saw it: each bucket's bytes and the most this rank held while it
    was made and sent, and the whole stream's."""

    buckets: list[tuple[int, int]] = field(default_factory=list)
    tensors: int = 0
    peak_held: int = 0
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(nbytes for nbytes, _ in self.buckets)

    def as_dict(self) -> dict:
        return {"buckets": self.buckets, "tensors": self.tensors, "bytes": self.bytes, "peak_held": self.peak_held,
                "seconds": round(self.seconds, 4)}


class Sink(Protocol):
    """Where rank 0's buckets go: each buffer lies on device."""

    device: torch.device

    async def send(self, bucket: Bucket, flat: torch.Tensor) -> None: ...


async def stream(tensors: Sequence[ExportedTensor], bucket_bytes: int, sink: Sink | None) -> Streamed:
    """Sends the export's tensors to sink bucket by bucket (buckets_of). Every rank calls it, in
    lockstep (making each parameter whole is a collective); sink is rank 0's, None on the others."""
    started, held, streamed = time.perf_counter(), Held(), Streamed()
    for members in buckets_of(tensors, bucket_bytes):
        bucket = Bucket.of([tensor for unit in members for tensor in unit])
        flat = _packed(members, bucket.nbytes, sink.device if sink else None, held)
        if sink is not None:
            await sink.send(bucket, flat)
            held.drop(flat.numel())
        del flat
        streamed.buckets.append((bucket.nbytes, held.window()))
        streamed.tensors += len(bucket.names)
    streamed.peak_held, streamed.seconds = held.peak, time.perf_counter() - started
    return streamed


async def to_receivers(tensors: Sequence[ExportedTensor], bucket_bytes: int, group: Group | None) -> Streamed:
    """stream() to the receivers (receive) of group, rank 0's (None on the other ranks), then its end."""
    sink = Announced(group) if group is not None else None
    streamed = await stream(tensors, bucket_bytes, sink)
    if sink is not None:
        await sink.end()
    return streamed


def _packed(members: list[list[ExportedTensor]], nbytes: int, device: torch.device | None, held: Held) -> torch.Tensor | None:
    """A bucket's buffer on device (rank 0's; None on the others, which only take part in making
    each parameter whole). A lone parameter is its own buffer; others are copied in one by one."""
    if len(members) == 1:
        flat = whole(members[0]).view(torch.uint8)
        held.take(flat.numel())
        if device is None:
            held.drop(flat.numel())
            return None
        moved = flat.to(device)
        if moved.data_ptr() != flat.data_ptr():
            held.take(moved.numel())
            held.drop(flat.numel())
        return moved
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device) if device is not None else None
    held.take(nbytes if flat is not None else 0)
    offset = 0
    for unit in members:
        part = whole(unit).view(torch.uint8)
        held.take(part.numel())
        if flat is not None:
            flat[offset:offset + part.numel()].copy_(part)
        offset += part.numel()
        held.drop(part.numel())
        del part
    return flat


# Groups: rank 0 the sender, the receivers 1..size-1, broadcasting from rank 0.


class GlooGroup:
    """A gloo process group of its own over a TCPStore at address (host:port) that rank 0 serves."""

    def __init__(self, address: str, rank: int, size: int, timeout: datetime.timedelta = GROUP_TIMEOUT):
        host, port = address.rsplit(":", 1)
        self.rank, self.size, self.device = rank, size, torch.device("cpu")
        self.store = dist.TCPStore(host, int(port), size, is_master=rank == 0, timeout=timeout)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("gearshift-weights", self.store), rank, size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor, 0).wait()


class NcclGroup:
    """An NCCL communicator of its own, from a unique id that rank 0 minted (vLLM's
    nccl_unique_id_b64 rendezvous: no vLLM code and no TCPStore of vLLM's needed). Right after it
    is made, a one-element float32 all-reduce: the warm-up vLLM's PyNcclCommunicator runs, which
    every member must match before any other collective. Made and used in a thread whose CUDA
    device is device (distributed.in_thread)."""

    def __init__(self, unique_id: bytes, rank: int, size: int, device: torch.device):
        import torch.cuda.nccl as nccl

        self.rank, self.size, self.device, self.nccl = rank, size, device, nccl
        torch.cuda.set_device(device)
        self.comm = nccl.init_rank(size, unique_id, rank)
        warm_up = torch.zeros(1, device=device)
        nccl.all_reduce([warm_up], comms=[self.comm])
        torch.cuda.current_stream(device).synchronize()

    @staticmethod
    def unique_id() -> bytes:
        import torch.cuda.nccl as nccl

        return nccl.unique_id()

    @classmethod
    def at(cls, address: str, rank: int, size: int, device: torch.device, timeout: datetime.timedelta = GROUP_TIMEOUT) -> NcclGroup:
        """The members meet at a TCPStore at address that rank 0 serves, where it leaves the id."""
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), size, is_master=rank == 0, timeout=timeout)
        if rank == 0:
            store.set(UNIQUE_ID_KEY, cls.unique_id())
        return cls(store.get(UNIQUE_ID_KEY), rank, size, device)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.nccl.broadcast([tensor], root=0, comms=[self.comm])
        torch.cuda.current_stream(self.device).synchronize()


class Group(Protocol):
    rank: int
    device: torch.device

    def broadcast(self, tensor: torch.Tensor) -> None: ...


def join(backend: str, address: str, rank: int, size: int, device: torch.device | None = None) -> Group:
    """This process's membership of a weight group at address: gloo on the CPU, or NCCL on device."""
    if backend == "gloo":
        return GlooGroup(address, rank, size)
    if backend == "nccl":
        return NcclGroup.at(address, rank, size, device or torch.device("cuda", torch.cuda.current_device()))
    raise ValueError(f"unknown weight group backend {backend!r} (gloo or nccl)")


# The receiver's protocol: each bucket's update info (JSON, its length first) then its buffer; a
# length of 0 ends the stream.


class Announced:
    """rank 0's Sink towards receivers of receive(): the bucket's update info, then the buffer."""

    def __init__(self, group: Group):
        self.group, self.device = group, group.device

    async def send(self, bucket: Bucket, flat: torch.Tensor) -> None:
        _announce(self.group, json.dumps(bucket.update_info()).encode())
        self.group.broadcast(flat)

    async def end(self) -> None:
        _announce(self.group, b"")


def _announce(group: Group, text: bytes) -> None:
    group.broadcast(torch.tensor([len(text)], dtype=torch.int64, device=group.device))
    if text:
        group.broadcast(torch.frombuffer(bytearray(text), dtype=torch.uint8).to(group.device))


def _announced(group: Group) -> Bucket | None:
    length = torch.zeros(1, dtype=torch.int64, device=group.device)
    group.broadcast(length)
    if not length.item():
        return None
    text = torch.empty(int(length.item()), dtype=torch.uint8, device=group.device)
    group.broadcast(text)
    return Bucket.from_update_info(json.loads(text.cpu().numpy().tobytes()))


def receive(group: Group) -> Iterator[tuple[str, torch.Tensor]]:
    """One stream's tensors as they arrive, bucket by bucket, until rank 0 ends it (a receiver)."""
    while (bucket := _announced(group)) is not None:
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=group.device)
        group.broadcast(flat)
        yield from bucket.unpack(flat)


def main() -> None:
    parser = argparse.ArgumentParser(description="Receives weight streams and saves each (a test and GPU-check receiver).")
    parser.add_argument("--address", required=True, help="host:port of the group's TCPStore, which rank 0 serves")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--size", type=int, default=2, help="members: rank 0 and the receivers")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--streams", type=int, default=1, help="streams to receive before exiting")
    parser.add_argument("--out", type=Path, required=True, help="folder for stream-K.safetensors (with --save) and report.json")
    parser.add_argument("--save", action="store_true", help="write each stream's tensors")
    args = parser.parse_args()
    from safetensors.torch import save_file

    group = join(args.backend, args.address, args.rank, args.size)
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    for index in range(args.streams):
        started, names, received = time.perf_counter(), [], 0
        tensors = {}
        for name, tensor in receive(group):
            names.append(name)
            received += tensor.numel() * tensor.element_size()
            if args.save:
                tensors[name] = tensor.cpu().clone()  # a bucket's views share its buffer: saved apart
        seconds = time.perf_counter() - started
        if args.save:
            save_file(tensors, args.out / f"stream-{index}.safetensors")
        report.append({"names": names, "bytes": received, "seconds": round(seconds, 4)})
        del tensors
    (args.out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
