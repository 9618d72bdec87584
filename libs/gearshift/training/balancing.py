"""The routers' load-balancing loss of a mixture-of-experts model (Switch Transformer's, the one
transformers adds with router_aux_loss_coef), and the per-expert token counts that show a
collapse.

Per layer and per sequence, as DeepSeek-V3's sequence-wise balance loss and Megatron's
seq_aux_loss: E * sum_e f_e * P_e, where f_e is the share of the sequence's top-k assignments that
went to expert e (times k, as transformers counts it) and P_e its mean router probability; then
the mean over the layers, and over the step's sequences. A sum over sequences splits over ranks
and micro-batches like the other losses (each part over the global count of sequences), so the
same config makes the same update on 1 rank or N; a loss over a micro-batch's pooled tokens would
depend on how the batch was cut."""

from __future__ import annotations

import torch


def routers(model: torch.nn.Module) -> int:
    """How many routers the model's decoder reports the logits of (output_router_logits): 0 but
    for an MoE, whose dense layers (mlp_only_layers) have none."""
    recorder = (getattr(model.get_decoder(), "_can_record_outputs", None) or {}).get("router_logits")
    return sum(isinstance(module, recorder.target_class) for module in model.modules()) if recorder is not None else 0


class RouterLoad:
    """What the routers did in one forward, summed per layer, sequence and expert over the
    decoder calls that made it (a shared prefix counts in every sequence that shares it)."""

    def __init__(self, experts: int, top_k: int, context=None):
        self.experts, self.top_k = experts, top_k
        self.context = context  # context_parallel.Context: the sequences' tokens are split over its ranks
        self.assigned = self.probabilities = None  # [layers, sequences, experts]
        self.tokens = None  # [sequences]

    def add(self, router_logits: tuple[torch.Tensor, ...], members: torch.Tensor) -> None:
        """One decoder call's router logits (a [tokens, experts] tensor per layer) and members:
        [tokens, sequences], 1 where a token belongs to a sequence (0 for padding)."""
        members = members.float()
        probabilities = torch.softmax(torch.stack(router_logits).float(), dim=-1)  # [layers, tokens, experts]
        chosen = torch.zeros_like(probabilities).scatter_(-1, probabilities.topk(self.top_k, dim=-1).indices, 1.0)
        assigned, summed = torch.einsum("lte,ts->lse", chosen, members), torch.einsum("lte,ts->lse", probabilities, members)
        tokens = members.sum(dim=0)
        if self.assigned is None:
            self.assigned, self.probabilities, self.tokens = assigned, summed, tokens
        else:
            self.assigned, self.probabilities, self.tokens = self.assigned + assigned, self.probabilities + summed, self.tokens + tokens

    def loss_sum(self) -> torch.Tensor:
        """The balancing loss summed over this forward's sequences (each a mean over layers). Under
        context parallelism each rank saw a slice of every sequence: the counts are summed over the
        group first, and each rank takes 1/size of the loss, so the group's shares add up to it."""
        assigned, probabilities, tokens, share = self.assigned, self.probabilities, self.tokens, 1.0
        if self.context is not None:
            assigned, tokens = (self.context.all_reduce(counts.detach()) for counts in (assigned, tokens))
            probabilities, share = self.context.all_reduce(probabilities), 1.0 / self.context.size
        tokens = tokens.clamp(min=1.0)[None, :, None]
        per_layer = self.experts * ((assigned / tokens) * (probabilities / tokens)).sum(dim=-1)  # [layers, sequences]
        return per_layer.mean(dim=0).sum() * share

    def expert_tokens(self) -> torch.Tensor:
        """[layers, experts]: the top-k assignments each expert took (a token counts k times)."""
        return self.assigned.sum(dim=1)

