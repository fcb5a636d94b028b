"""moe's impls (naive, torch, triton) against a float64 mixture of experts written here, token by token, at awkward
sizes: M no multiple of the block, E no power of two, a block holding one expert's single slot, an expert with no
token; and the router (softmax or sigmoid scores, top k, renormalized, scaled) against a float64 one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.spec import models
from phasebench.kernels import Unsupported, available_impls, moe, prepare_moe, route, triton_mode
from phasebench.kernels.moe.request import ROUTER_SCORINGS
from phasebench.kernels.moe.triton_moe import choose_block_m, triton_moe

from ...markers import TRITON_DEVICE, on_triton_device, tiered

F32, BF16 = torch.float32, torch.bfloat16


def draw(m, k, n, experts, top_k, dtype, device="cpu", seed=0, idle=()):
    """x, the experts' weights and a routing from `route` in which the experts in `idle` get no token."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * n, k, generator=gen) * k ** -0.5).to(dtype)
    w_down = (torch.randn(experts, k, n, generator=gen) * n ** -0.5).to(dtype)
    logits = torch.randn(m, experts, generator=gen)
    logits[:, list(idle)] = -1e4
    weights, ids = route(logits, top_k)
    return tuple(t.to(device) for t in (x, w_gate_up, w_down, weights, ids))


def reference(x, w_gate_up, w_down, weights, ids):
    """Token by token, slot by slot, in float64."""
    x, w_gate_up, w_down, weights = (t.double().cpu() for t in (x, w_gate_up, w_down, weights))
    n = w_down.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            h = w_gate_up[e] @ x[t]
            out[t] += weights[t, j] * (w_down[e] @ (F.silu(h[:n]) * h[n:]))
    return out


def check(out, args):
    x = args[0]
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device and torch.isfinite(out).all()
    ref = reference(*args)
    err = ((out.double().cpu() - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()  # per token, as the gate
    limit = {F32: 1e-5, torch.float64: 1e-12}.get(x.dtype, 2e-2)
    assert err <= limit, f"relative error {err:.3g} > {limit}"


# (m, k, n, experts, top_k): M odd and past one block, E = 5, 6 and 12, an idle expert, a single token, top_k = E
CASES = [(37, 72, 40, 6, 2, F32), (1, 64, 24, 12, 3, BF16), (70, 40, 56, 5, 5, BF16)]


@pytest.mark.parametrize("m, k, n, experts, top_k, dtype", CASES)
@pytest.mark.parametrize("impl", tiered(["naive", "torch", "compiled"]))
def test_naive_and_torch(impl, m, k, n, experts, top_k, dtype):
    args = draw(m, k, n, experts, top_k, dtype, idle=(experts - 1,) if top_k < experts else ())
    check(moe(*args, impl=impl), args)


@on_triton_device
@pytest.mark.parametrize("m, k, n, experts, top_k, dtype", CASES)
def test_triton(m, k, n, experts, top_k, dtype):
    args = draw(m, k, n, experts, top_k, dtype, TRITON_DEVICE, idle=(0,) if top_k < experts else ())
    check(moe(*args, impl="triton"), args)
    assert prepare_moe(*args, impl="triton").backend.startswith("triton-fused-moe")


@on_triton_device
def test_triton_small_tiles_cross_every_edge():
    # K = 72 and N = 40 end mid-tile, experts hold 1 to 15 slots in 16-row blocks: whole, part-filled, one slot alone
    args = draw(23, 72, 40, 7, 3, F32, TRITON_DEVICE, seed=4, idle=(6,))
    check(triton_moe(*args, block_m=16, tiles={"BLOCK_N": 32, "BLOCK_K": 16}), args)


def test_block_rows_follow_the_slots_per_expert():
    assert choose_block_m(1, 8, 128) == 16 and choose_block_m(256, 2, 8) == 64 and choose_block_m(40, 4, 5) == 32


def test_torch_unsupported_where_the_grouped_gemm_cannot_take_the_strides():
    args = draw(3, 70, 24, 4, 2, BF16)  # K = 70: a row of 140 bytes
    with pytest.raises(Unsupported, match="multiples of 8 in bfloat16, got K = 70"):
        prepare_moe(*args, impl="torch")
    assert prepare_moe(*draw(3, 72, 24, 4, 2, F32), impl="torch").backend == "torch._grouped_mm:mm-per-group"


def route_reference(logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool, scale: float):
    """A router in float64: every expert's score, the top k, their weights summed to 1 where asked, then scaled."""
    scores = torch.softmax(logits.double(), -1) if scoring == "softmax" else torch.sigmoid(logits.double())
    weights, ids = scores.topk(top_k)
    weights = weights / weights.sum(-1, keepdim=True) if renormalize else weights
    return weights * scale, ids


@pytest.mark.parametrize("scoring, renormalize, scale", [
    ("softmax", False, 1.0),  # route's default; DeepSeek-V2-Lite
    ("softmax", True, 1.0),  # Mixtral, Qwen3-MoE, gpt-oss
    ("softmax", False, 16.0),  # DeepSeek-V2's routed_scaling_factor
    ("sigmoid", True, 2.5),  # DeepSeek-V3 (its group limit aside)
    ("sigmoid", False, 1.0),
])
def test_route_scores_takes_the_top_k_renormalizes_and_scales(scoring, renormalize, scale):
    logits = torch.randn(9, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(BF16)
    weights, ids = route(logits, 3, renormalize=renormalize, scoring=scoring, scale=scale)
    expected, expected_ids = route_reference(logits, 3, scoring, renormalize, scale)
    assert weights.dtype == F32 and ids.dtype == torch.int32 and weights.shape == ids.shape == (9, 3)
    assert torch.equal(ids.long(), expected_ids)
    torch.testing.assert_close(weights.double(), expected, rtol=1e-6, atol=1e-6)


def test_gpt_oss_softmax_over_the_top_k_logits_is_the_top_k_of_a_softmax_renormalized():
    logits = torch.randn(11, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    top = logits.topk(2)
    weights, ids = route(logits, 2, renormalize=True)
    assert torch.equal(ids.long(), top.indices)
    torch.testing.assert_close(weights.double(), torch.softmax(top.values, -1), rtol=1e-6, atol=1e-6)


def test_route_defaults_to_a_plain_softmax_top_k_and_the_spec_names_its_scorings():
    logits = torch.randn(6, 13, generator=torch.Generator().manual_seed(5))
    weights, ids = route(logits, 4)
    expected, expected_ids = route_reference(logits, 4, "softmax", False, 1.0)
    assert torch.equal(ids.long(), expected_ids)
    torch.testing.assert_close(weights.double(), expected, rtol=1e-6, atol=1e-6)
    assert ROUTER_SCORINGS == models.ROUTER_SCORINGS


def test_naive_serves_float64_and_the_others_say_they_do_not():
    args = draw(9, 24, 16, 5, 2, torch.float64)
    check(moe(*args, impl="naive"), args)
    with pytest.raises(Unsupported, match="does not support dtype torch.float64"):
        prepare_moe(*args, impl="torch")


def test_impls_are_listed():
    names = available_impls("cpu", op="moe")
    assert {"naive", "torch"} <= set(names)
    assert ("triton" in names) == triton_mode.interpreted()


@pytest.mark.parametrize("make, message", [
    (lambda a: (a[0], a[1], a[2], a[3], a[4] * 0 + 6), r"topk_ids: ids must be in 0..5, got 6"),
    (lambda a: (a[0], a[1], a[2], a[3], a[4] - 1), r"topk_ids: ids must be in 0..5, got -1"),
    (lambda a: (a[0], a[1][:, :-2], a[2], a[3], a[4]), r"w_gate_up: must be \[6, 16, 24\]"),
    (lambda a: (a[0], a[1], a[2].to(F32), a[3], a[4]), "w_down: dtype must match x"),
    (lambda a: (a[0], a[1], a[2], a[3], a[4].long()), "topk_ids: must be int32"),
    (lambda a: (a[0], a[1], a[2], a[3][:2], a[4]), "topk_weights: must have M = 5 rows"),
    (lambda a: (a[0].int(), a[1], a[2], a[3], a[4]), "x: must be float16, bfloat16, float32 or float64"),
    (lambda a: (a[0], a[1], a[2], a[3].repeat(1, 4), a[4].repeat(1, 4)), r"topk_ids: top_k \(8\) must be at most"),
])
def test_bad_input_is_one_line(make, message):
    args = draw(5, 24, 8, 6, 2, BF16)
    with pytest.raises(ValueError, match=message) as err:
        moe(*make(args), impl="naive")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=5), r"top_k: must be an int in 1..4 \(the experts\), got 5"),
    (dict(top_k=2, scoring="relu"), r"scoring: must be one of softmax, sigmoid, got 'relu'"),
    (dict(top_k=2, scale=0.0), r"scale: must be a positive finite number, got 0.0"),
    (dict(top_k=2, scale=float("nan")), r"scale: must be a positive finite number, got nan"),
])
def test_route_bad_input_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        route(torch.randn(3, 4), **kwargs)
    assert "\n" not in str(err.value)
