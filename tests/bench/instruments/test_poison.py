"""Poisoned memory around the gate's calls: NaN allocations inside the block (torch's settings back after it), judged
outputs NaN-filled before release, inputs spared; on CUDA, a freed block handed back holds NaN, not the answer."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.utils.deterministic
from phasebench.bench.instruments.poison import poisoned_allocations, scrub, tensors_in


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", devices())
def test_allocations_come_back_poisoned_inside_the_block_only(device):
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the block itself says nothing
        with poisoned_allocations():
            floats = torch.empty((97, 33), dtype=torch.bfloat16, device=device)
            like = torch.empty_like(torch.ones(5, 7, device=device))
            ints = torch.empty(13, dtype=torch.int64, device=device)
            product = torch.randn(9, 17, device=device) @ torch.randn(17, 5, device=device)  # ops still run
    assert torch.isnan(floats).all() and torch.isnan(like).all()
    assert (ints == torch.iinfo(torch.int64).max).all() and torch.isfinite(product).all()
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before


def test_the_settings_come_back_after_an_error_and_nest():
    torch.use_deterministic_algorithms(True)  # a user's own setting, kept
    try:
        with pytest.raises(RuntimeError, match="kernel exploded"), poisoned_allocations():
            with poisoned_allocations():
                pass
            assert torch.is_deterministic_algorithms_warn_only_enabled()
            raise RuntimeError("kernel exploded")
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@dataclass(frozen=True)
class Inputs:
    cache: torch.Tensor
    rows: tuple
    note: str = ""


def test_scrub_poisons_each_output_tensor_and_spares_the_inputs():
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(1025, 2, 80, generator=gen)
    x = Inputs(cache, (torch.randn(3, 80, generator=gen), torch.arange(3)))
    assert len(tensors_in(x)) == 3
    out, ids = torch.randn(97, 13, generator=gen).to(torch.bfloat16), torch.arange(5)
    kept = cache.clone()
    scrub((out, ids, cache[7:9]), keep=x)  # a view of an input is the input's memory: left alone
    assert torch.isnan(out).all() and (ids == torch.iinfo(torch.int64).max).all()
    assert torch.equal(cache, kept) and torch.equal(x.rows[1], torch.arange(3))
    scrub(None)  # an output that holds no tensor: nothing to do


@pytest.mark.cuda  # the caching allocator hands the block of a freed tensor to the next request of its size
def test_a_freed_cuda_block_handed_back_holds_nan_not_the_answer():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no other free block of this size: a 24 MiB request gets a segment of its own
    shape = (6145, 2048)
    answer = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    where, kept = answer.data_ptr(), answer.clone()
    del answer
    again = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    assert again.data_ptr() == where and torch.equal(again, kept)  # unscrubbed, the answer is handed back
    scrub(again)
    del again
    last = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    assert last.data_ptr() == where and torch.isnan(last).all()
