"""The Triton linear kernels (split-K skinny GEMM, tiled GEMM) against a float64 reference at awkward sizes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from phasebench.kernels import Unsupported, available_impls, buffers, linear, prepare_linear, triton_mode
from phasebench.kernels.linear import triton_linear as tlin
from phasebench.kernels.linear.triton_linear import GEMV_MAX_M, MAX_SPLIT_K, choose_path, choose_split_k, triton_linear

from ...markers import TRITON_DEVICE, on_triton_device

# Triton takes host tensors in its interpreter and CUDA tensors when compiled: each device runs where it can.
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not triton_mode.interpreted(),
                                                 reason="compiled Triton takes CUDA tensors (no interpreter)")),
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(triton_mode.interpreted(), reason="Triton is in its interpreter")]),
]
HERE = TRITON_DEVICE
SANITY = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}  # loose absolute bounds on the relative error


def draw(m, n, k, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype=dtype, device=device)
    w = torch.randn(n, k, generator=gen).div_(k ** 0.5).to(dtype=dtype, device=device)
    return x, w


def rel_err(out, ref) -> float:
    return ((out.double().cpu() - ref).abs().max() / ref.abs().max()).item()


def assert_matches(out, x, w):
    m, n = x.shape[0], w.shape[0]
    assert out.shape == (m, n) and out.dtype == x.dtype and out.device == x.device
    assert torch.isfinite(out).all(), "NaN/inf in the output: unwritten (poisoned) elements"
    ref = x.double().cpu() @ w.double().cpu().T
    err = rel_err(out, ref)
    if x.dtype == torch.float32:
        assert err <= 1e-4, f"relative error {err:.3g} > 1e-4"
    else:  # the output's rounding dominates: at most twice the vendor's error in the same dtype
        budget = 2 * rel_err(torch.nn.functional.linear(x, w), ref) + 1e-5
        assert err <= budget, f"relative error {err:.3g} > 2 x F.linear's + 1e-5 = {budget:.3g}"
        assert err <= SANITY[x.dtype], f"relative error {err:.3g} > {SANITY[x.dtype]}"


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
AUTO_CASES = [  # (m, n, k, dtype): K 4095 and 200 are no multiple of any K block
    (1, 4097, 4095, F32), (3, 97, 4095, BF16), (17, 97, 200, F16), (GEMV_MAX_M, 130, 200, BF16),
    (GEMV_MAX_M + 1, 97, 200, F32), (70, 4097, 200, F32), (70, 130, 1000, F16),
]
FORCED_CASES = [  # (path, m, n, k, dtype)
    ("gemm", 1, 97, 4095, F32), ("gemm", 3, 130, 200, BF16), ("gemm", 17, 97, 1000, F16),
    ("gemv", 70, 97, 200, F32), ("gemv", 70, 97, 1000, BF16),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,k,dtype", AUTO_CASES)
def test_public_linear_matches_float64_and_picks_the_path_by_m(device, m, n, k, dtype):
    x, w = draw(m, n, k, dtype, device, seed=m * 131 + n)
    call = prepare_linear(x, w, impl="triton")
    path = "triton-splitk-gemv" if m <= GEMV_MAX_M else "triton-gemm"
    assert call.impl == "triton" and call.backend == f"{path}:{triton_mode.mode()}"
    with buffers.poisoned():
        out = linear(x, w, impl="triton")
    assert_matches(out, x, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path,m,n,k,dtype", FORCED_CASES)
def test_each_path_forced_on_the_other_paths_sizes(device, path, m, n, k, dtype):
    x, w = draw(m, n, k, dtype, device, seed=m + n + k)
    assert choose_path(m) != path  # each case runs the path the automatic choice would not take
    with buffers.poisoned():
        out = triton_linear(x, w, path=path)
    assert_matches(out, x, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split_k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("m,n,k,dtype", [(3, 97, 200, F32), (17, 130, 1000, BF16)])
def test_forced_split_counts_including_empty_chunks(device, split_k, m, n, k, dtype):
    # K 200 is two 128-wide blocks in the interpreter: 3, 5 and 8 splits leave chunks with no K at all,
    # whose partials must still be written (the poisoned scratch would turn the sum into NaN)
    x, w = draw(m, n, k, dtype, device, seed=split_k * 7 + m)
    with buffers.poisoned():
        out = triton_linear(x, w, path="gemv", split_k=split_k)
    assert_matches(out, x, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_strided_rows_are_read_through_their_strides(device, path):
    # column slices of wider tensors: row strides exceed K, the last dimension stays contiguous
    gen = torch.Generator().manual_seed(5)
    x_wide = torch.randn(70, 260, generator=gen).to(device)
    w_wide = torch.randn(97, 301, generator=gen).div_(15).to(device)
    x, w = x_wide[:, 3:203], w_wide[:, 50:250]
    assert x.stride(0) != x.shape[1] and w.stride(0) != w.shape[1]
    with buffers.poisoned():
        out = triton_linear(x, w, path=path, split_k=3 if path == "gemv" else None)
    assert_matches(out, x, w)


@pytest.mark.skipif(not triton_mode.interpreted(), reason="the fixed tiles are the interpreter's")
def test_grouped_order_with_small_tiles_covers_every_tile(monkeypatch):
    # 16-wide tiles: M 70 is five tile rows in bands of two (the last band is short), N 97 seven columns
    monkeypatch.setattr(tlin, "INTERPRETER_GEMM", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2})
    x, w = draw(70, 97, 200, F32, "cpu", seed=11)
    with buffers.poisoned():
        out = triton_linear(x, w, path="gemm")
    assert_matches(out, x, w)


def test_split_count_follows_multiprocessors_columns_and_k():
    assert choose_split_k(m=1, n=4096, k=4096, multiprocessors=132) == 5  # 64 column blocks -> 320 programs
    assert choose_split_k(m=1, n=32768, k=4096, multiprocessors=132) == 1  # 512 column blocks fill it
    assert choose_split_k(m=70, n=4096, k=4096, multiprocessors=132) == 3  # two row blocks of 64
    assert choose_split_k(m=1, n=64, k=200, multiprocessors=132) == 2  # no split under 128 K elements
    assert choose_split_k(m=1, n=64, k=1 << 20, multiprocessors=1000) == MAX_SPLIT_K


def test_path_threshold_and_backend_names():
    assert choose_path(1) == choose_path(GEMV_MAX_M) == "gemv"
    assert choose_path(GEMV_MAX_M + 1) == "gemm"
    mode = triton_mode.mode()
    assert mode == ("interpreter" if triton_mode.interpreted() else "compiled")
    assert tlin.backend_name("gemv") == f"triton-splitk-gemv:{mode}"
    assert tlin.backend_name("gemm") == f"triton-gemm:{mode}"


def test_availability_follows_the_triton_mode():
    impl = tlin.TRITON_LINEAR
    if triton_mode.interpreted():
        assert "triton" in available_impls("cpu", op="linear")
        assert "interpreter" in impl.why_not("cuda")
    else:
        assert "CUDA tensors" in impl.why_not("cpu")
    assert "triton-splitk-gemv" in impl.backends(HERE) and "triton-gemm" in impl.backends(HERE)


@on_triton_device
def test_bad_input_raises_one_line_errors():
    x, w = draw(3, 97, 200, F32, HERE, seed=2)
    with pytest.raises(ValueError, match="x: its last dimension must be contiguous") as err:
        linear(torch.randn(200, 3, device=HERE).T, w, impl="triton")  # a transposed view
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="path: must be one of gemv, gemm"):
        triton_linear(x, w, path="fast")
    for bad in (0, MAX_SPLIT_K + 1, 2.0, True):
        with pytest.raises(ValueError, match="split_k: must be an int"):
            triton_linear(x, w, path="gemv", split_k=bad)
    with pytest.raises(ValueError, match="split_k: only the gemv path"):
        triton_linear(x, w, path="gemm", split_k=2)
    with pytest.raises(ValueError, match="split_k: only the gemv path"):
        triton_linear(torch.randn(GEMV_MAX_M + 1, 200, device=HERE), w, split_k=2)  # automatic choice is gemm
    with pytest.raises(Unsupported, match="dtype torch.float64"):
        linear(x.double(), w.double(), impl="triton")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path,split_k", [("gemv", 1), ("gemv", 4), ("gemm", None)])
def test_a_nan_input_row_stays_nan_and_spares_the_others(device, path, split_k):
    x, w = draw(5, 97, 1000, BF16, device, seed=3)
    x[1, 700] = float("nan")
    with buffers.poisoned(0.0):  # a zero poison, so NaN in the output comes from the input alone
        out = triton_linear(x, w, path=path, split_k=split_k)
    assert torch.isnan(out[1]).all()
    keep = [0, 2, 3, 4]
    assert_matches(out[keep], x[keep], w)


def test_importing_the_package_alone_registers_the_triton_linear():
    # a fresh interpreter: this test module imports triton_linear itself, which would hide a missing import
    code = ("import phasebench.kernels as k; "
            "assert k.TRITON_IMPORT_ERROR or 'triton' in k.OPS['linear'], sorted(k.OPS['linear'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
