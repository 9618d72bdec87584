"""One training job across the ranks torchrun starts, or one process when nothing started it.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; from them this module initialises the process
group (nccl on CUDA, gloo on the CPU), picks the rank's device (cuda:LOCAL_RANK or the CPU),
wraps the model for data parallelism (FSDP2: each decoder layer, the embeddings, the head, then
the root, HSDP on a 2-D mesh across nodes, or over the shard dim of tensor parallelism's 2-D mesh;
or DDP) and gives the jobs the few collectives they need. Without torchrun no process group exists
and every collective is the identity, so a job runs in one process as it always did."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from gearshift.training.config import RuntimeConfig

log = logging.getLogger("gearshift.training")
T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job: its rank among world_size, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    # Consecutive ranks that learn the same examples, each a part of the work on them (context x
    # tensor parallel): the data is split over the world_size / splitting groups of them.
    splitting: int = 1
    # Of those, how many compute the same per-token values (tensor parallel: each holds its
    # examples' whole loss); context parallel ranks each hold a part of them.
    copies: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes files, registers and publishes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def data_rank(self) -> int:
        """Which share of the data this rank learns (the same for the ranks that split it)."""
        return self.rank // self.splitting

    @property
    def data_ranks(self) -> int:
        """How many shares the data is split into."""
        return self.world_size // self.splitting

    def split_by(self, context: int, tensor: int) -> Ranks:
        """These ranks with groups of context x tensor consecutive ranks learning the same examples."""
        if self.world_size % (context * tensor):
            raise ValueError(f"context_parallel x tensor_parallel = {context * tensor} does not divide the job's {self.world_size} ranks")
        return dataclasses.replace(self, splitting=context * tensor, copies=tensor)

    def shard(self, items: list[T]) -> list[T]:
        """This rank's contiguous slice of items (the ranks' slices cover items once, in order): a
        share of work every rank does apart, such as rollouts (the data a step learns is split over
        data ranks instead: batching.balanced)."""
        start, end = (len(items) * self.rank) // self.world_size, (len(items) * (self.rank + 1)) // self.world_size
        return items[start:end]

    def sum(self, values: list[float]) -> list[float]:
        """The element-wise sum of values over every rank."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def data_sum(self, values: list[float]) -> list[float]:
        """The sum over the data's shares of values that every rank splitting a share holds alike
        (a count of its examples): the sum over every rank, over splitting."""
        return [value / self.splitting for value in self.sum(values)]

    def token_sum(self, values: list[float]) -> list[float]:
        """The sum of values over the tokens a rank computed (a loss, a count of tokens): over
        every rank, over the copies tensor parallelism makes of them."""
        return [value / self.copies for value in self.sum(values)]

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def min(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MIN)

    def _reduce(self, values: list[float], op) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def shared(self, make: Callable[[], T]) -> T:
        """make() run on rank 0 alone, its result given to every rank (pickled: objects of this job)."""
        if not self.distributed:
            return make()
        box = [make() if self.main else None]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(device_ids=[self.local_rank] if self.device.type == "cuda" else None)


_started: Ranks | None = None


def start(runtime: RuntimeConfig) -> Ranks:
    """This process's ranks; the first call initialises the process group when torchrun started
    the job (later calls return the same)."""
    global _started
    if _started is not None:
        return _started
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(runtime.device, local_rank)
    if world_size > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=runtime.collective_timeout_seconds)
        dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
        atexit.register(dist.destroy_process_group)
        log.info("rank %d of %d on %s (%s)", rank, world_size, device, backend)
    _started = Ranks(rank, world_size, local_rank, device)
    return _started


def _device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("runtime.device is cuda, but torch sees no CUDA device (a CPU build of torch, or no GPU in the pod)")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def compute_dtype(runtime: RuntimeConfig, device: torch.device) -> torch.dtype:
    """The dtype the forward and backward run in: bf16 on CUDA and fp32 on the CPU unless set."""
    precision = runtime.precision if runtime.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    return torch.bfloat16 if precision == "bf16" else torch.float32


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of the transformers model in module (the classes its _no_split_modules
    names: the unit FSDP shards by)."""
    names = next((set(m._no_split_modules) for m in module.modules() if getattr(m, "_no_split_modules", None)), set())
    layers = [m for m in module.modules() if any(cls.__name__ in names for cls in type(m).__mro__)]  # FSDP subclasses them
    if not layers:
        raise ValueError(f"{type(module).__name__} holds no model that names its decoder layer class (_no_split_modules)")
    return layers


def parallelize(module: torch.nn.Module, ranks: Ranks, runtime: RuntimeConfig, dtype: torch.dtype) -> torch.nn.Module:
    """The module on the rank's device, wrapped for data parallelism across more than one rank,
    each decoder layer compiled when runtime.compile asks.

    FSDP2 (shard()) works on a module whose parameters are still on the meta device: they get
    storage later (loading.materialise), a shard per rank. DDP replicates a module that already
    has its weights (bf16 compute then comes from autocast, see autocast())."""
    if runtime.compile:
        for layer in decoder_layers(module):
            layer.compile(backend=runtime.compile_backend)
    if not any(param.is_meta for param in module.parameters()):
        module = module.to(ranks.device)
    check_expert_parallel(module, ranks, runtime)
    check_tensor_parallel(module, ranks, runtime)
    if not ranks.distributed:
        return module
    if runtime.parallelism == "ddp":
        if any(param.is_meta for param in module.parameters()):
            raise ValueError("DDP wraps a module whose weights are loaded: materialise it first")
        device_ids = [ranks.local_rank] if ranks.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids, gradient_as_bucket_view=True)
    return shard(module, ranks, runtime, dtype)


def shard(module: torch.nn.Module, ranks: Ranks, runtime: RuntimeConfig, dtype: torch.dtype) -> torch.nn.Module:
    """FSDP2 groups, as torchtitan lays them out: every decoder layer, the input embeddings, the
    head (one group with the embeddings when they are the same tied weight: a parameter belongs to
    one group), then the root (the final norm and whatever is left). In bf16 the parameters are
    gathered in bf16 for compute while the float32 shards stay the master weights and gradients
    are reduced in float32. On a 2-D mesh (mesh()), HSDP: shards within a row, replicas across.
    With expert parallelism an MoE layer's experts are a group of their own (experts.py). With
    tensor parallelism each decoder layer's projections are split over the mesh's "tensor" dim
    first (tensor_parallel.py), then every group is sharded over its "shard" dim (2-D DTensors)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device_mesh = mesh(ranks, runtime)
    options = {"mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32), "mesh": device_mesh}
    if runtime.expert_parallel > 1:
        from gearshift.training.experts import parallelize_experts

        options["mesh"] = device_mesh["shard"]
        parallelize_experts(module, device_mesh, options)
    if runtime.tensor_parallel > 1:
        from gearshift.training.tensor_parallel import parallelize_dense

        options["mesh"] = device_mesh["shard"]
        parallelize_dense(module, decoder_layers(module), device_mesh["tensor"])
    for layer in decoder_layers(module):
        fully_shard(layer, **options)
    model = getattr(module, "model", module)
    embeddings, head = model.get_input_embeddings(), getattr(module, "head", None) or model.get_output_embeddings()
    if head is not None and head.weight is embeddings.weight:
        fully_shard([embeddings, head], **options)
    else:
        fully_shard(embeddings, **options)
        if head is not None:
            fully_shard(head, **options)
    fully_shard(module, **options)
    return module


def check_expert_parallel(module: torch.nn.Module, ranks: Ranks, runtime: RuntimeConfig) -> None:
    """runtime.expert_parallel, refused in one line where it cannot apply."""
    degree = runtime.expert_parallel
    if degree == 1:
        return
    from gearshift.training.experts import experts_of

    experts = experts_of(module)
    if not experts:
        raise ValueError(f"runtime.expert_parallel is {degree}, but the model has no mixture-of-experts layers")
    if experts[0].num_experts % degree:
        raise ValueError(f"runtime.expert_parallel {degree} does not divide the model's {experts[0].num_experts} experts")
    if ranks.world_size % degree:
        raise ValueError(f"runtime.expert_parallel {degree} does not divide the job's {ranks.world_size} ranks")
    if runtime.parallelism != "fsdp":
        raise ValueError("runtime.expert_parallel needs runtime.parallelism fsdp")
    if len(mesh_shape(ranks, runtime)) == 2 and mesh_shape(ranks, runtime)[0] > 1:
        raise ValueError("runtime.expert_parallel with HSDP (replicas across nodes) is not supported: set runtime.mesh_shape [1, ranks]")


def check_tensor_parallel(module: torch.nn.Module, ranks: Ranks, runtime: RuntimeConfig) -> None:
    """runtime.tensor_parallel, refused in one line where it cannot apply."""
    degree = runtime.tensor_parallel
    if degree == 1:
        return
    from gearshift.training.experts import experts_of
    from gearshift.training.tensor_parallel import model_config, split_sizes

    if ranks.world_size % degree:
        raise ValueError(f"runtime.tensor_parallel {degree} does not divide the job's {ranks.world_size} ranks")
    if runtime.parallelism != "fsdp":
        raise ValueError("runtime.tensor_parallel needs runtime.parallelism fsdp")
    if runtime.mesh_shape and runtime.mesh_shape[0] > 1:
        raise ValueError("runtime.tensor_parallel with HSDP (replicas across nodes) is not supported: set runtime.mesh_shape [1, ranks]")
    if runtime.expert_parallel > 1 or experts_of(module):
        raise ValueError("runtime.tensor_parallel is for dense models: this one has mixture-of-experts layers (use runtime.expert_parallel)")
    if any(".lora_" in name for name, _ in module.named_parameters()):
        raise ValueError("runtime.tensor_parallel with LoRA is not supported: train the full weights, or set it to 1")
    for what, size in split_sizes(model_config(module)).items():
        if size % degree:
            raise ValueError(f"runtime.tensor_parallel {degree} does not divide the model's {size} {what}")


def mesh_shape(ranks: Ranks, runtime: RuntimeConfig) -> tuple[int, ...]:
    """(replicas, shards) for HSDP, or (ranks,) for FSDP: runtime.mesh_shape when set, else a
    replica per node (WORLD_SIZE over LOCAL_WORLD_SIZE) when the job spans more than one node."""
    if runtime.mesh_shape:
        replicas, shards = runtime.mesh_shape
        if replicas * shards != ranks.world_size:
            raise ValueError(f"runtime.mesh_shape {replicas} x {shards} does not hold the job's {ranks.world_size} ranks")
        return replicas, shards
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size))
    if 0 < per_node < ranks.world_size and ranks.world_size % per_node == 0 and runtime.expert_parallel == runtime.tensor_parallel == 1:
        return ranks.world_size // per_node, per_node
    return (ranks.world_size,)


def mesh(ranks: Ranks, runtime: RuntimeConfig):
    """The device mesh FSDP shards over (mesh_shape); with expert parallelism (shard_mod_ep, ep),
    its two dims flattened as "shard" for the dense layers (ep the inner one: an ep group is
    consecutive ranks, on one node); with tensor parallelism (shard, tensor), tensor the inner one
    (a tensor group is consecutive ranks, on one node; a context group's ranks, if any, lie on
    shard with the data's)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(ranks, runtime)
    if runtime.tensor_parallel > 1:
        degree = runtime.tensor_parallel
        return init_device_mesh(ranks.device.type, (ranks.world_size // degree, degree), mesh_dim_names=("shard", "tensor"))
    if runtime.expert_parallel > 1:
        degree = runtime.expert_parallel
        device_mesh = init_device_mesh(ranks.device.type, (ranks.world_size // degree, degree), mesh_dim_names=("shard_mod_ep", "ep"))
        device_mesh[("shard_mod_ep", "ep")]._flatten("shard")
        return device_mesh
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    return init_device_mesh(ranks.device.type, shape, mesh_dim_names=names)


def is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def autocast(module: torch.nn.Module, device: torch.device, dtype: torch.dtype):
    """bf16 compute over float32 weights where FSDP's mixed precision does not already give it."""
    if dtype == torch.float32 or is_sharded(module):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@contextlib.contextmanager
def gradient_sync(module: torch.nn.Module, sync: bool) -> Iterator[None]:
    """DDP reduces gradients only on the last micro-batch of a step (FSDP reduce-scatters each
    micro-batch's gradients into its shards: no unsharded gradients are kept between them)."""
    if sync or not isinstance(module, torch.nn.parallel.DistributedDataParallel):
        yield
        return
    with module.no_sync():
        yield


def scalar(value: torch.Tensor) -> float:
    """A float from a tensor that may be a DTensor (FSDP's gradient norm)."""
    full = getattr(value, "full_tensor", None)
    return float(full() if full else value)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ where gradients may lie on different meshes (expert parallelism: the
    experts' on (shard_mod_ep, ep), the rest on shard), which torch's cannot stack: each mesh's
    norm made whole, then combined. Returns the total norm."""
    grads = [param.grad for param in params if param.grad is not None]
    by_mesh: dict = {}
    for grad in grads:
        by_mesh.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    if len(by_mesh) <= 1:
        return scalar(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = math.sqrt(sum(scalar(torch.nn.utils.get_total_norm(group)) ** 2 for group in by_mesh.values()))
    coefficient = max_norm / (total + 1e-6)  # as torch's
    if coefficient < 1.0:
        torch._foreach_mul_(grads, coefficient)
    return total


async def in_thread(device: torch.device, function: Callable[..., T], *args) -> T:
    """function(*args) in a worker thread on device. CUDA's current device is per thread: a thread
    that did not set it runs its kernels and collectives on cuda:0, whatever its rank's device."""

    def on_device() -> T:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return function(*args)

    return await asyncio.to_thread(on_device)
