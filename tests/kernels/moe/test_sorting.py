"""The slots sorted by expert and padded into one-expert blocks, against a loop over the slots."""

from __future__ import annotations

import torch
from phasebench.kernels.moe.sorting import align_blocks, max_padded, sort_by_expert


def test_sort_by_expert_is_stable_and_ends_each_group():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], dtype=torch.int32)
    order, ends = sort_by_expert(ids, 5)
    assert order.tolist() == [1, 4, 3, 0, 2, 5] and ends.tolist() == [2, 3, 3, 6, 6]  # experts 2 and 4: empty


def test_blocks_hold_one_expert_each_and_every_slot_once():
    gen = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(9, generator=gen)[:3] for _ in range(23)]).to(torch.int32)
    ids[ids == 4] = 5  # expert 4 idle; a few tokens route twice to 5, which the blocks must still carry
    blocks = align_blocks(ids, 9, 4)
    slots, experts, used = blocks.slots.tolist(), blocks.block_expert.tolist(), int(blocks.used)
    flat = ids.reshape(-1).tolist()
    assert len(slots) == max_padded(69, 9, 4) and used % 4 == 0 and used <= len(slots)
    assert sorted(s for s in slots[:used] if s < 69) == list(range(69)) and all(s == 69 for s in slots[used:])
    for b in range(used // 4):
        rows = [s for s in slots[4 * b:4 * b + 4] if s < 69]
        assert rows and all(flat[s] == experts[b] for s in rows)
    assert 4 not in experts[:used // 4]
