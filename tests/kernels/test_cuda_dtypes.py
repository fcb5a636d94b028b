"""On CUDA, each attention and linear kernel in fp16 and bf16: compiled, correct, in the input's dtype, and run on
the half-precision inputs themselves, never on an fp32 copy of them; flash_attn's routes where it is installed."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import Unsupported, prepare, prepare_linear
from phasebench.kernels.attention.flash import flash_attn_module

from .reference import assert_matches_reference, make_qkv

pytestmark = pytest.mark.cuda
HALF = [torch.float16, torch.bfloat16]
# (batch, q heads, kv heads, q_len, kv_len, head dim, causal, per-sequence lengths); the long caches make an fp32
# copy of K far larger than anything the kernels need beyond their output
ATTENTION = {
    "decode-gqa": (2, 8, 2, 1, 8191, 128, True, None),
    "verify-5": (1, 8, 2, 5, 4099, 128, True, None),
    "decode-ragged": (3, 8, 1, 1, 6000, 64, False, (6000, 17, 3001)),
    "prefill-causal": (1, 8, 2, 1025, 1025, 128, True, None),
    "chunk-d80": (2, 4, 4, 97, 1500, 80, True, None),
}
LONG_CACHE = ("decode-gqa", "verify-5", "decode-ragged")
LINEAR = {"gemv": (1, 8192, 4096), "skinny": (16, 8192, 4095), "gemm": (300, 1000, 4096)}
WIDE_WEIGHTS = ("gemv", "skinny")
LINEAR_BOUND = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}  # relative error against float64


def _peak_extra_bytes(run) -> tuple[torch.Tensor, int]:
    """The output of run() and the most device memory it held beyond what was allocated before, in a call after a
    first one: that one compiles and autotunes (Triton's benchmark takes a 256 MiB cache-flush buffer) and makes
    cuBLAS take its workspace, none of which the kernel holds once warm."""
    run()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = run()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - base


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(ATTENTION))
@pytest.mark.parametrize("impl", ["naive", "flash", "triton"])
def test_attention_kernels_run_in_half_precision(impl, name, dtype):
    b, hq, hkv, sq, sk, d, causal, seqlens = ATTENTION[name]
    q, k, v = make_qkv(b, hq, hkv, sq, sk, d, dtype=dtype, device="cuda", seed=len(name) * 7 + sq)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    try:
        call = prepare(q, k, v, impl=impl, causal=causal, cache_seqlens=lens)
    except Unsupported as err:
        pytest.skip(f"{impl}: {err}")
    if impl == "triton":
        assert call.backend.endswith(":compiled")
    out, extra = _peak_extra_bytes(call.run)
    assert out.dtype == dtype and out.device.type == "cuda"
    if name in LONG_CACHE:  # an fp32 copy of K alone would exceed this
        assert extra < k.numel() * 4, f"{impl} held {extra} B beyond its inputs: an fp32 copy of K is {k.numel() * 4}"
    assert_matches_reference(out.cpu(), q.cpu(), k.cpu(), v.cpu(), causal=causal, seqlens=seqlens)


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(LINEAR))
@pytest.mark.parametrize("impl", ["naive", "torch", "triton"])
def test_linear_kernels_run_in_half_precision(impl, name, dtype):
    m, n, k = LINEAR[name]
    gen = torch.Generator().manual_seed(m * 31 + n)
    x = torch.randn(m, k, generator=gen).to(dtype=dtype, device="cuda")
    w = torch.randn(n, k, generator=gen).div_(k ** 0.5).to(dtype=dtype, device="cuda")
    call = prepare_linear(x, w, impl=impl)
    if impl == "triton":
        assert call.backend.endswith(":compiled")
    out, extra = _peak_extra_bytes(call.run)
    assert out.dtype == dtype and out.shape == (m, n)
    if name in WIDE_WEIGHTS:
        assert extra < w.numel() * 4, f"{impl} held {extra} B: an fp32 copy of the weights is {w.numel() * 4}"
    ref = x.double() @ w.double().T
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert err <= LINEAR_BOUND[dtype], err


@pytest.mark.skipif(flash_attn_module() is None, reason="flash_attn is not installed (flash is SDPA's backend)")
@pytest.mark.parametrize("name,route", [("prefill-causal", ":func"), ("chunk-d80", ":func"),
                                        ("decode-gqa", ":with_kvcache"), ("decode-ragged", ":with_kvcache")])
def test_flash_attn_routes(name, route):
    b, hq, hkv, sq, sk, d, causal, seqlens = ATTENTION[name]
    q, k, v = make_qkv(b, hq, hkv, sq, sk, d, dtype=torch.bfloat16, device="cuda", seed=sk)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    call = prepare(q, k, v, impl="flash", causal=causal, cache_seqlens=lens)
    assert call.backend.startswith("flash_attn-") and call.backend.endswith(route)
    assert_matches_reference(call.run().cpu(), q.cpu(), k.cpu(), v.cpu(), causal=causal, seqlens=seqlens)
