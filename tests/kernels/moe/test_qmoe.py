"""moe with packed experts (every qlinear scheme) through the facade: naive and triton (the interpreter on the host)
against a float64 mixture of the experts unpacked by the gate's own unpack, at awkward sizes (K and N no multiple of
32 or 128, E = 5, top_k = 2, M 1, 7 and 64); torch and compiled refuse with their reason; bad stacks are one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.ops.qlinear.unpack import unpack
from phasebench.kernels import SCHEMES, QuantizedWeight, Unsupported, moe, prepare_moe, quantize, route
from phasebench.kernels.moe.triton_moe import triton_moe

from ...markers import TRITON_DEVICE, on_triton_device

F32, BF16 = torch.float32, torch.bfloat16
E, TOP_K, K, N = 5, 2, 200, 136  # K, N: no multiple of 32 (N is of 8, for the int4 and fp8-b128 groups' sake)


def draw(m, scheme, dtype, seed=0, device="cpu"):
    """x, the packed experts (seeded normal weights) and a routing from `route` that leaves the last expert idle."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, K, generator=gen).to(dtype)
    w_gate_up = quantize((torch.randn(E, 2 * N, K, generator=gen) * K ** -0.5).to(dtype), scheme)
    w_down = quantize((torch.randn(E, K, N, generator=gen) * N ** -0.5).to(dtype), scheme)
    logits = torch.randn(m, E, generator=gen)
    logits[:, E - 1] = -1e4
    weights, ids = route(logits, TOP_K)
    move = (lambda t: t.to(device)) if device != "cpu" else (lambda t: t)
    if device != "cpu":
        w_gate_up, w_down = (w._map(move, w.shape) for w in (w_gate_up, w_down))
    return move(x), w_gate_up, w_down, move(weights), move(ids)


def reference(x, w_gate_up, w_down, weights, ids):
    """Slot by slot in float64, each expert unpacked from its documented layout (never the kernels' dequantize)."""
    x, weights, ids = x.double().cpu(), weights.double().cpu(), ids.cpu()
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        gate_up, down = unpack(w_gate_up.expert(e)).cpu(), unpack(w_down.expert(e)).cpu()
        tokens, slot = torch.where(ids == e)
        h = x[tokens] @ gate_up.T
        y = (F.silu(h[:, :N]) * h[:, N:]) @ down.T
        out.index_add_(0, tokens, y * weights[tokens, slot, None])
    return out


def check(out, args):
    x = args[0]
    assert out.shape == x.shape and out.dtype == x.dtype and torch.isfinite(out).all()
    ref = reference(*args)
    err = ((out.double().cpu() - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()  # per token, as the gate
    limit = 1e-5 if x.dtype == F32 else 2e-2
    assert err <= limit, f"relative error {err:.3g} > {limit}"


SCHEME_NAMES = tuple(SCHEMES)
# the default tier: every scheme at M = 7 in bf16 by naive, two by triton (the interpreter's second a call); the slow
# tier: every scheme at every M in both dtypes
QUICK = [(7, BF16)]
FULL = [pytest.param(m, dtype, marks=pytest.mark.slow) for m in (1, 7, 64) for dtype in (F32, BF16)
        if (m, dtype) not in QUICK]
TRITON_QUICK = ("int4-g128", "mxfp4")  # zeros and float group scales; e8m0 group scales
TRITON_MATRIX = [pytest.param(scheme, m, dtype, marks=[] if scheme in TRITON_QUICK else [pytest.mark.slow])
                 for scheme in SCHEME_NAMES for m, dtype in QUICK] + [
                 pytest.param(scheme, *p.values, marks=p.marks) for scheme in SCHEME_NAMES for p in FULL]


@pytest.mark.parametrize("m, dtype", QUICK + FULL)
@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_naive_dequantizes_the_touched_experts(scheme, m, dtype):
    args = draw(m, scheme, dtype)
    check(moe(*args, impl="naive"), args)
    assert prepare_moe(*args, impl="naive").backend == "expert-loop+dequantize+F.linear"


@on_triton_device
@pytest.mark.parametrize("scheme, m, dtype", TRITON_MATRIX)
def test_triton_decodes_in_the_k_loop(scheme, m, dtype):
    args = draw(m, scheme, dtype, device=TRITON_DEVICE)
    check(moe(*args, impl="triton"), args)


@pytest.mark.slow
@on_triton_device
@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_triton_small_tiles_inside_and_across_groups(scheme):
    # BLOCK_K 16 lies inside every group (a group's scale per K step), BLOCK_N 32 ends mid-row-block; 16-row blocks
    args = draw(23, scheme, F32, seed=3, device=TRITON_DEVICE)
    check(triton_moe(*args, block_m=16, tiles={"BLOCK_N": 32, "BLOCK_K": 16}), args)
    check(triton_moe(*args, block_m=16, tiles={"BLOCK_N": 64, "BLOCK_K": 256}), args)


@pytest.mark.parametrize("impl, reason", [("torch", "no grouped weight-only GEMM"),
                                          ("compiled", "dequantized whole on every call")])
def test_torch_and_compiled_refuse_packed_experts(impl, reason):
    args = draw(3, "mxfp4", BF16)
    with pytest.raises(Unsupported, match=reason):
        prepare_moe(*args, impl=impl)


def test_bad_stacks_are_one_line():
    x, w_gate_up, w_down, weights, ids = draw(3, "int8", F32)
    float_down = torch.randn(E, K, N)
    other = quantize(float_down, "int4-g32")
    single = quantize(float_down[0], "int8")
    broken = QuantizedWeight(w_down.qdata, w_down.scales[:, :-1].contiguous(), None, "int8", w_down.shape)
    for wgu, wd, match in [(w_gate_up, float_down, "w_down: must be a QuantizedWeight stack"),
                           (w_gate_up, other, r"w_down: must be packed as w_gate_up is \(int8\), got int4-g32"),
                           (w_gate_up, single, "w_down: must be \\[E, N, K\\] experts"),
                           (w_gate_up, broken, "w_down: int8 of shape .* must have scales"),
                           (w_down, w_gate_up, "w_gate_up: must be \\[5, 400, 200\\]")]:
        with pytest.raises(ValueError, match=match) as err:
            moe(x, wgu, wd, weights, ids, impl="naive")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("scheme", ["fp8-e4m3", "nvfp4", "fp8-b128"])
def test_triton_refuses_e4m3_experts_where_it_cannot_decode_them(scheme, monkeypatch):
    """The fused kernels decode e4m3 bytes only on sm_89 and newer: on an older GPU the plan says so (made to look
    older here by its reason), never a compile error."""
    from phasebench.kernels.qlinear import triton_qlinear

    monkeypatch.setattr(triton_qlinear, "fp8_refusal", lambda device, instead: f"an old GPU: {instead}")
    x, w_gate_up, w_down, weights, ids = draw(3, scheme, BF16, device=TRITON_DEVICE)
    with pytest.raises(Unsupported, match=f"an old GPU: naive dequantizes {scheme} here"):
        prepare_moe(x, w_gate_up, w_down, weights, ids, impl="triton")
    x, w_gate_up, w_down, weights, ids = draw(3, "mxfp4", BF16, device=TRITON_DEVICE)
    assert prepare_moe(x, w_gate_up, w_down, weights, ids, impl="triton").impl == "triton"
