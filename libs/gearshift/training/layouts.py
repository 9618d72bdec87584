"""Each model family's checkpoint layout against the parameters transformers builds for it (what
torchtitan calls a state-dict adapter): which tensors of a Hugging Face checkpoint make which rows
of a parameter. Loading (loading.materialise: each rank reads the file tensors of its own rows),
export and weight publishing (checkpoints.save_weights) all go through it, so a family's names and
layouts are written down once.

The dense families (Llama, Qwen2/2.5, Qwen3) keep the checkpoint's names and shapes. transformers 5
builds a mixture-of-experts layer's experts fused, one row per expert (mlp.experts.gate_up_proj
[experts, 2 x intermediate, hidden], mlp.experts.down_proj [experts, hidden, intermediate]), while
checkpoints hold one matrix per expert (mlp.experts.<e>.gate_proj.weight, up_proj, down_proj): what
from_pretrained, save_pretrained and vLLM read and write. A LoRA adapter of the experts is saved
one matrix per expert likewise (adapter_files)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

DENSE_FAMILIES = ("llama", "qwen2", "qwen3")
MOE_FAMILIES = ("qwen3_moe",)


@dataclass(frozen=True)
class FileTensor:
    """A checkpoint tensor made of rows start:stop (dim 0) of a parameter, columns (dim 1) of them
    when set; per_row: it is one row of the parameter (an expert's matrix), without that dim."""

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int
    columns: slice | None = None
    per_row: bool = False

    def of(self, rows: torch.Tensor, offset: int) -> torch.Tensor:
        """This tensor's part of a parameter's rows offset:offset + len(rows) (a rank's shard):
        in order, the rows of the file tensor they hold, maybe none."""
        low, high = max(self.start, offset), min(self.stop, offset + len(rows))
        part = rows[max(0, low - offset):max(0, high - offset)]
        if self.columns is not None:
            part = part[:, self.columns]
        if not self.per_row:
            return part
        return part[0] if len(part) else part.new_empty((0, *self.shape[1:]))


class Layout:
    """A family whose checkpoint holds every parameter under its own name and shape."""

    def __init__(self, family: str):
        self.family = family

    def files(self, name: str, shape: tuple[int, ...]) -> list[FileTensor]:
        """The checkpoint tensors of a parameter (its name without peft's wrapping: file_key)."""
        return [FileTensor(name, shape, 0, shape[0] if shape else 1)]

    def adapter_files(self, name: str, shape: tuple[int, ...]) -> list[FileTensor] | None:
        """The adapter file's tensors of a trainable LoRA parameter that peft does not save itself
        (the experts' LoRA: expert_lora); None for peft's own, which peft names."""
        return None

    def read(self, files, name: str, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of a parameter, from the file tensors that make them (and no others)."""
        if not shape:
            return files.rows(name)
        pieces = [piece for piece in self.files(name, shape) if piece.start < stop and start < piece.stop]
        if len(pieces) == 1 and not pieces[0].per_row and pieces[0].columns is None:
            piece = pieces[0]
            return files.rows(piece.name, start - piece.start, stop - piece.start)
        rows = None
        for piece in pieces:
            value = files.rows(piece.name)[None] if piece.per_row else files.rows(piece.name, max(start, piece.start) - piece.start,
                                                                                  min(stop, piece.stop) - piece.start)
            if rows is None:
                rows = value.new_empty((stop - start, *shape[1:]))
            rows[max(start, piece.start) - start:min(stop, piece.stop) - start, piece.columns or slice(None)] = value
        return rows if rows is not None else torch.empty((0, *shape[1:]))


class FusedExperts(Layout):
    """A mixture-of-experts family: the dense layout, with each layer's fused experts split into
    one matrix per expert (gate_up_proj's rows are the gate's, then the up projection's)."""

    EXPERTS = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")

    def files(self, name: str, shape: tuple[int, ...]) -> list[FileTensor]:
        match = self.EXPERTS.match(name)
        if not match:
            return super().files(name, shape)
        prefix, experts = match["prefix"], shape[0]
        if match["kind"] == "down_proj":
            return [FileTensor(f"{prefix}.{e}.down_proj.weight", shape[1:], e, e + 1, per_row=True) for e in range(experts)]
        half = shape[1] // 2
        return [FileTensor(f"{prefix}.{e}.{kind}.weight", (half, shape[2]), e, e + 1, columns, per_row=True)
                for e in range(experts) for kind, columns in (("gate_proj", slice(0, half)), ("up_proj", slice(half, None)))]


    EXPERT_LORA = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<factor>lora_A|lora_B)\.(?P<projection>gate_proj|up_proj|down_proj)$")

    def adapter_files(self, name: str, shape: tuple[int, ...]) -> list[FileTensor] | None:
        """The experts' LoRA (expert_lora: experts.lora_A.<projection> [experts, r, in]) one matrix
        per expert, as peft names a checkpoint's per-expert Linear layers in its file:
        mlp.experts.<e>.gate_proj.lora_A.weight [r, in], lora_B [out, r]. vLLM's LoRA loader reads
        these for Qwen3-MoE (its packed "experts" module lists experts.<e>.gate_proj/up_proj/
        down_proj; is_3d_moe_weight is off), and peft's from_pretrained fuses them back."""
        match = self.EXPERT_LORA.match(name)
        if not match:
            return None
        prefix, factor, projection = match["prefix"], match["factor"], match["projection"]
        return [FileTensor(f"{prefix}.{e}.{projection}.{factor}.weight", shape[1:], e, e + 1, per_row=True) for e in range(shape[0])]


def of(config) -> Layout:
    """The layout of a transformers config's family; an unknown family is refused."""
    family = getattr(config, "model_type", None)
    if family in MOE_FAMILIES:
        return FusedExperts(family)
    if family in DENSE_FAMILIES:
        return Layout(family)
    raise ValueError(f"no checkpoint layout for the model family {family!r} (known: {', '.join(DENSE_FAMILIES + MOE_FAMILIES)})")
