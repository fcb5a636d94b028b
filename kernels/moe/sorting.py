"""The (token, expert) slots of a routed call sorted by expert, on the device and without a host sync: the grouped
GEMM's row order and per-expert ends, and, for the Triton kernels, the same order padded so that each block of
rows holds one expert (vLLM's moe_align_block_size, written in torch ops)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def expert_counts(topk_ids: torch.Tensor, experts: int) -> torch.Tensor:
    """Slots per expert (int64 [E]); a scatter-add, not bincount, which reads its maximum back to the host."""
    flat = topk_ids.reshape(-1).long()
    return torch.zeros(experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def sort_by_expert(topk_ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, ends): the slots (token * top_k + j) in expert order, stable (int64 [M * top_k]), and the end of
    each expert's rows in that order (int32 [E], the `offs` of torch._grouped_mm; an expert with no slot has an
    empty range)."""
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    return order, torch.cumsum(expert_counts(topk_ids, experts), 0).to(torch.int32)


@dataclass(frozen=True)
class Blocks:
    """Slots sorted by expert and padded per expert to a multiple of `block` rows: `slots` (int32, the padding
    holds M * top_k, a slot that does not exist), the expert of each block (`block_expert`, int32) and how many of
    the padded rows are used (`used`, an int32 tensor of one element: blocks past it are left alone)."""

    slots: torch.Tensor
    block_expert: torch.Tensor
    used: torch.Tensor
    block: int

    @property
    def blocks(self) -> int:
        """Blocks launched: an upper bound known without reading the counts back."""
        return self.slots.shape[0] // self.block


def max_padded(slots: int, experts: int, block: int) -> int:
    """The most rows the padding can take: every touched expert (at most min(E, slots)) wastes under a block."""
    rows = slots + min(experts, slots) * (block - 1)
    return -(-rows // block) * block


def align_blocks(topk_ids: torch.Tensor, experts: int, block: int) -> Blocks:
    """The slots of each expert in `block`-row blocks, experts in order, each block one expert's (see Blocks)."""
    order, _ = sort_by_expert(topk_ids, experts)
    counts = expert_counts(topk_ids, experts)
    padded = (counts + block - 1) // block * block
    padded_end = torch.cumsum(padded, 0)
    padded_start, count_start = padded_end - padded, torch.cumsum(counts, 0) - counts
    total = order.numel()
    expert_of = topk_ids.reshape(-1).long()[order]  # the expert of each sorted slot
    position = padded_start[expert_of] + torch.arange(total, device=order.device) - count_start[expert_of]
    rows = max_padded(total, experts, block)
    slots = torch.full((rows,), total, dtype=torch.int32, device=order.device)
    slots[position] = order.to(torch.int32)
    starts = torch.arange(0, rows, block, device=order.device)
    block_expert = torch.searchsorted(padded_end, starts, right=True).clamp_(max=experts - 1).to(torch.int32)
    return Blocks(slots, block_expert, padded_end[-1:].to(torch.int32), block)
