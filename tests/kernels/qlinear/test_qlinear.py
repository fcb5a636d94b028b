"""qlinear's impls (naive, torch, triton) against a float64 matmul of the dequantized weights at awkward sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from phasebench.kernels import SCHEMES, Unsupported, available_impls, prepare_qlinear, qlinear, quantize, triton_mode
from phasebench.kernels.qlinear.triton_qlinear import triton_qlinear

from ...markers import TRITON_DEVICE, TRITON_MARKS, on_triton_device, tiered

F32, BF16 = torch.float32, torch.bfloat16


def draw(m, n, k, dtype, scheme, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype=dtype, device=device)
    w = torch.randn(n, k, generator=gen).div_(k ** 0.5).to(dtype)
    return x, quantize(w, scheme).clone() if device == "cpu" else _to(quantize(w, scheme), device)


def _to(qw, device):
    def moved(t):
        return None if t is None else t.to(device)
    return dataclasses.replace(qw, qdata=qw.qdata.to(device), scales=qw.scales.to(device), zeros=moved(qw.zeros),
                               tensor_scale=moved(qw.tensor_scale))


def rel_err(out, x, qw) -> float:
    ref = x.double().cpu() @ qw.dequantize(torch.float64).cpu().T
    return ((out.double().cpu() - ref).abs().max() / ref.abs().max()).item()


def check(out, x, qw):
    assert out.shape == (x.shape[0], qw.shape[0]) and out.dtype == x.dtype and out.device == x.device
    assert torch.isfinite(out).all()
    limit = 1e-5 if x.dtype == F32 else 2e-2  # the dequantized weights' error is not the kernel's: none is allowed
    err = rel_err(out, x, qw)
    assert err <= limit, f"relative error {err:.3g} > {limit}"


CASES = [(1, 33, 300, F32), (5, 64, 160, BF16), (70, 48, 200, F32)]  # N odd, K no multiple of 32 or 128, M > 64
NO_VENDOR = ("fp8-e4m3", "fp8-b128", "mxfp4", "nvfp4")  # torch has no weight-only GEMM of these (vendor.py)


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("m, n, k, dtype", CASES)
@pytest.mark.parametrize("impl", tiered(["naive", "torch", "compiled"]))
def test_naive_and_torch(impl, scheme, m, n, k, dtype):
    x, qw = draw(m, n, k, dtype, scheme)
    try:
        call = prepare_qlinear(x, qw, impl=impl)
    except Unsupported as why:  # the vendor's limits, said in one line
        assert impl == "torch" and (scheme in NO_VENDOR or n % 16), str(why)
        return
    check(call.run(), x, qw)


@pytest.mark.parametrize("m, k", [(1, 200), (4, 72), (3, 257)])
def test_torch_int8_bfloat16_on_the_host_when_k_is_no_multiple_of_16(m, k):
    # torch 2.13's host kernel reads past K there (garbage, or a segfault): the weight and x are padded with zeros
    for seed in range(4):
        x, qw = draw(m, 64, k, BF16, "int8", seed=seed)
        call = prepare_qlinear(x, qw, impl="torch")
        check(call.run(), x, qw)
        check(call.run(), x, qw)  # the padded weight is made once and kept


def test_the_vendor_backends_name_the_op():
    x, qw = draw(2, 64, 256, F32, "int4-g128")
    assert prepare_qlinear(x, qw, impl="torch").backend == "torch._weight_int4pack_mm_for_cpu"
    int8 = quantize(torch.randn(64, 256), "int8")
    assert prepare_qlinear(x, int8, impl="torch").backend == "torch._weight_int8pack_mm"


@on_triton_device
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("m, n, k, dtype", CASES)
def test_triton_picks_its_path(scheme, m, n, k, dtype):
    x, qw = draw(m, n, k, dtype, scheme, TRITON_DEVICE)
    check(qlinear(x, qw, impl="triton"), x, qw)
    assert prepare_qlinear(x, qw, impl="triton").backend.startswith("triton-qgemm" if m > 64 else "triton-splitk-qgemv")


@on_triton_device
@pytest.mark.parametrize("scheme", ["int4-g32", "int4-g128", "int8", "fp8-e4m3", "mxfp4", "nvfp4", "fp8-b128"])
@pytest.mark.parametrize("path, split_k, tiles", [
    ("gemv", 3, {"BLOCK_N": 16, "BLOCK_K": 64}),  # a K block holds two g32 groups, half a g128; three partials
    ("gemm", None, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256}),  # two g128 groups a block
])
@pytest.mark.parametrize("m", [1, 19])  # one token multiplies and reduces; more go through tl.dot
def test_triton_small_tiles_cross_the_group_edges(scheme, path, split_k, tiles, m):
    x, qw = draw(m, 37, 290, F32, scheme, TRITON_DEVICE, seed=3)
    check(triton_qlinear(x, qw, path=path, split_k=split_k, tiles=tiles), x, qw)


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8-b128"])
@pytest.mark.parametrize("impl", ["naive", pytest.param("triton", marks=TRITON_MARKS)])
def test_served_formats_across_blocks_of_rows(scheme, impl):
    # N = 300: three 128-row blocks of fp8-b128 scales, the last partial; K = 290: a partial last group and block
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    for m in (1, 16):
        x, qw = draw(m, 300, 290, BF16, scheme, device, seed=5)
        check(qlinear(x, qw, impl=impl), x, qw)


# row factors: a zero row, rows 1e-5 and 1e-7 of the tensor's amax (nvfp4's e4m3 block scales subnormal, then zero),
# and rows near 2^-125 (mxfp4's e8m0 at its floor, byte 0 = 2^-127: fp32 subnormals, which a GPU flushes, so host only)
EDGE_ROWS = (1.0, 0.0, 1e-3, 1e-5, 1e-7) + ((2e-38,) if TRITON_DEVICE == "cpu" else ())


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8-b128"])
@pytest.mark.parametrize("impl", ["naive", pytest.param("triton", marks=TRITON_MARKS)])
def test_edge_scale_codes_decode_as_their_bits_say(scheme, impl):
    """Each output channel against its own magnitude (a whole-output error would hide a tiny row's), the reference
    from the gate's unpack of the bits, never from dequantize(): zero blocks, subnormal and zero e4m3 scales, e8m0's
    smallest power of two."""
    from phasebench.bench.ops.qlinear.unpack import unpack

    device = TRITON_DEVICE if impl == "triton" else "cpu"
    gen = torch.Generator().manual_seed(11)
    factors = torch.tensor(EDGE_ROWS).repeat(7)[:37]
    w = torch.randn(37, 290, generator=gen) * factors[:, None]
    qw = quantize(w, scheme)
    raw = qw.scales.view(torch.uint8) if qw.scales.element_size() == 1 else None
    if scheme == "mxfp4" and device == "cpu":
        assert raw.eq(0).any()  # e8m0's floor is reached
    if scheme == "nvfp4":
        assert raw.eq(0).any() and ((raw & 0x78).eq(0) & (raw & 7).ne(0)).any()  # zero and subnormal block scales
    x = torch.randn(3, 290, generator=gen)
    ref = x.double() @ unpack(qw).T
    out = qlinear(x.to(device), _to(qw, device), impl=impl).double().cpu()
    zero = ref.abs().amax(0) == 0
    assert zero[factors == 0].all() and out[:, zero].eq(0).all()
    err = (out - ref).abs().amax(0)[~zero] / ref.abs().amax(0)[~zero]
    assert err.max().item() <= 1e-5, f"worst channel relative error {err.max().item():.3g}"


@pytest.mark.parametrize("scheme", ["fp8-e4m3", "nvfp4", "fp8-b128"])
def test_triton_refuses_e4m3_bytes_before_sm_89(scheme, monkeypatch):
    from phasebench.kernels.qlinear import triton_qlinear as module

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(Unsupported, match=f"sm_89 or newer, this GPU is sm_80: naive dequantizes {scheme}"):
        module.refuse_e4m3(scheme, torch.device("cuda"))
    module.refuse_e4m3("mxfp4", torch.device("cuda"))  # e2m1 and e8m0 decode from integer bits anywhere
    module.refuse_e4m3(scheme, torch.device("cpu"))  # the interpreter decodes e4m3 on the host
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    module.refuse_e4m3(scheme, torch.device("cuda"))


def test_impls_are_listed():
    names = available_impls("cpu", op="qlinear")
    assert {"naive", "torch"} <= set(names)
    assert ("triton" in names) == triton_mode.interpreted()


@pytest.mark.parametrize("make, message", [
    (lambda x, qw: (x.double(), qw), "x: must be float16, bfloat16 or float32"),
    (lambda x, qw: (x[:, :100], qw), r"qweight: must be \[N, K\] with K = x.s 100"),
    (lambda x, qw: (x, qw.qdata), "qweight: must be a QuantizedWeight"),
    (lambda x, qw: (x, dataclasses.replace(qw, qdata=qw.qdata.to(torch.int32))), "qweight: int4-g128 packs"),
    (lambda x, qw: (x, dataclasses.replace(qw, zeros=None)), "qweight: int4-g128 of shape"),
    (lambda x, qw: (x, dataclasses.replace(qw, scheme="int2")), "qweight: unknown scheme 'int2'"),
    (lambda x, qw: (x.T.contiguous().T, qw), "x: its last dimension must be contiguous"),
])
def test_bad_input_is_one_line(make, message):
    x, qw = draw(3, 16, 256, F32, "int4-g128")
    with pytest.raises(ValueError, match=message) as err:
        qlinear(*make(x, qw), impl="naive")
    assert "\n" not in str(err.value)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch's CUDA int4/int8 ops")
@pytest.mark.parametrize("scheme", ["int8", "int4-g128", "int4-g32"])
def test_torch_on_cuda(scheme):
    x, qw = draw(4, 256, 512, BF16, scheme, "cuda")
    try:
        out = qlinear(x, qw, impl="torch")
    except Unsupported as why:  # int8 has no CUDA kernel in some torch builds: said, not hidden
        pytest.skip(str(why))
    check(out, x, qw)
