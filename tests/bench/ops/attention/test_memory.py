"""The memory-fit check: a case charged once, each impl for what it allocates."""

from __future__ import annotations

import os

import pytest
import torch
from phasebench.bench.instruments.gate import relative_error
from phasebench.bench.instruments.memory import device_memory
from phasebench.bench.ops.attention import memory
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.attention.inputs import make_inputs
from phasebench.bench.ops.attention.reference import reference
from phasebench.bench.sweep.suites import suite_cases
from phasebench.kernels import buffers, prepare
from phasebench.kernels.attention.triton_decode import choose_splits

CUDA = torch.device("cuda")  # a device object only: with `free` given nothing may touch CUDA
CARDS = {"H100": 79e9, "H200": 140e9}  # free bytes on an idle 80 GB and 141 GB card
SUITES = [(name, None) for name in ("prefill", "chunked", "decode", "verify", "ragged", "paged")]
SUITES += [(name, ("llama-3-70b",)) for name in ("prefill", "decode", "verify")]


@pytest.fixture
def no_cuda_calls(monkeypatch):
    """Any CUDA query made by the fit check fails the test."""
    def touched(*args, **kwargs):
        raise AssertionError("the fit check touched CUDA although `free` was given")
    for name in ("mem_get_info", "get_device_properties", "memory_reserved", "memory_allocated", "is_available"):
        monkeypatch.setattr(torch.cuda, name, touched)


def fits(case, impl, free, resident=False) -> bool:
    return memory.does_not_fit(case, impl, CUDA, resident=resident, free=int(free)) is None


@pytest.mark.parametrize("suite,models", SUITES)
@pytest.mark.parametrize("card", CARDS)
def test_flash_and_triton_never_disagree(suite, models, card, no_cuda_calls):
    free = CARDS[card]
    for case in suite_cases(suite, "cuda", "bfloat16", models):
        first = {impl: fits(case, impl, free) for impl in ("flash", "triton")}
        assert first["flash"] == first["triton"], f"{case.shape_label}: {first} on {card}"
        # once the case is resident, the free figure already lacks its inputs and reference
        left = free - memory.input_bytes(case) - memory.reference_output_bytes(case, CUDA)
        later = {impl: fits(case, impl, left, resident=True) for impl in ("flash", "triton")}
        assert later["flash"] == later["triton"], f"{case.shape_label}: {later} resident on {card}"
        if first["flash"]:
            assert later["flash"], f"{case.shape_label}: fits for the first impl, not once resident"


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("models", [None, ("llama-3-70b",)])
def test_the_top_prefill_case_fits_for_tiled_kernels_and_not_for_naive(card, models, no_cuda_calls):
    top = max(suite_cases("prefill", "cuda", "bfloat16", models), key=lambda c: (c.q_len, not c.causal))
    assert top.q_len == 32768
    assert fits(top, "flash", CARDS[card]) and fits(top, "triton", CARDS[card])
    # the score matrices alone are B x Hq x Sq x Sk x 8 bytes (fp32 scores and softmax): 256 GiB and more
    assert not fits(top, "naive", CARDS[card])
    # its output and the check's two fp64 temporaries the size of the reference (4 GiB here), no score matrices
    assert memory.impl_bytes(top, "triton", CUDA) < 5 * 2**30


def test_a_long_decode_batch_fits_on_an_h200_for_every_impl(no_cuda_calls):
    case = next(c for c in suite_cases("decode", "cuda", "bfloat16") if c.batch == 64 and c.kv_len == 131072)
    free = CARDS["H200"]
    assert fits(case, "naive", free)
    left = free - memory.input_bytes(case) - memory.reference_output_bytes(case, CUDA)  # after naive built them
    for impl in ("flash", "triton"):
        assert fits(case, impl, free) and fits(case, impl, left, resident=True)


def test_resident_cases_charge_only_the_impl(no_cuda_calls):
    case = AttentionCase(64, 32, 8, 1, 131072, 128, True, "bfloat16")
    own = memory.impl_bytes(case, "triton", CUDA)
    free = int(own / device_memory.HEADROOM) + 1
    assert memory.does_not_fit(case, "triton", CUDA, resident=True, free=free) is None
    reason = memory.does_not_fit(case, "triton", CUDA, free=free)
    assert reason and "\n" not in reason and "needs about" in reason and "free on cuda" in reason
    assert f"{free / 2**30:.1f} GiB free" in reason


def test_an_unknown_impl_is_charged_twice_its_inputs_and_told_so(no_cuda_calls):
    case = AttentionCase(3, 12, 4, 5, 1000, 80, False, "float16")
    nbytes = memory.impl_bytes(case, "my_plugin", CUDA)
    expected = memory.output_bytes(case) + 2 * memory.input_bytes(case)
    assert nbytes == expected + memory.CHECK_COPIES * memory.reference_output_bytes(case, CUDA)
    reason = memory.does_not_fit(case, "my_plugin", CUDA, resident=True, free=1000)
    assert "my_plugin is charged its output plus 2x the inputs" in reason
    assert "2x the inputs" not in memory.does_not_fit(case, "triton", CUDA, resident=True, free=1000)


def test_the_measured_free_figure_is_used_when_none_is_given(monkeypatch):
    case = AttentionCase(1, 4, 2, 7, 33, 16, True, "float32")
    monkeypatch.setattr(device_memory, "free_bytes", lambda device: 10**15)
    assert memory.does_not_fit(case, "naive", torch.device("cpu")) is None
    monkeypatch.setattr(device_memory, "free_bytes", lambda device: 1000)
    assert "needs about" in memory.does_not_fit(case, "naive", torch.device("cpu"))


def test_triton_split_kv_is_charged_the_partials_its_kernel_uses(monkeypatch):
    """Every byte the decode kernels allocate through kernels.buffers is inside the charge, on this machine."""
    case = AttentionCase(3, 6, 2, 2, 700, 24, True, "float32")
    x = make_inputs(case, torch.device("cpu"), seed=7)
    allocated = []
    real_empty = buffers.empty

    def counting(shape, *, dtype, device):
        t = real_empty(shape, dtype=dtype, device=device)
        allocated.append(t.numel() * t.element_size())
        return t
    monkeypatch.setattr(buffers, "empty", counting)
    prepare(x.q, x.k, x.v, impl="triton", causal=True).run()
    used = choose_splits(case.batch, case.kv_heads, case.kv_len, os.cpu_count() or 1)
    assert memory.split_kv_count(case) >= used
    assert sum(allocated) > memory.output_bytes(case)  # the partials were allocated
    charged = memory.impl_bytes(case, "triton", torch.device("cpu"))
    assert sum(allocated) <= charged - memory.CHECK_COPIES * memory.reference_output_bytes(case, torch.device("cpu"))


@pytest.mark.cuda  # peak device memory is read from the CUDA allocator
@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("impl", ["naive", "flash", "triton"])
def test_the_charge_covers_what_an_impl_allocates_on_cuda(impl, page):
    device = torch.device("cuda")
    case = AttentionCase(2, 8, 2, 97, 1025, 128, True, "bfloat16", page_size=page)
    x = make_inputs(case, device, seed=3)
    ref = reference(case, x, device)
    call = prepare(x.q, x.k, x.v, impl=impl, causal=case.causal, cache_seqlens=x.cache_seqlens,
                   block_table=x.block_table)
    call.run()  # compiled, autotuned (a 256 MiB benchmark buffer while it tunes) and cuBLAS's workspace taken
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    relative_error(call.run(), ref)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base <= memory.impl_bytes(case, impl, device)
