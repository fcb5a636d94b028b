"""Routed experts packed by a weight scheme: the case (scheme shown only where set), its cost (the touched experts'
packed bytes plus scales), its inputs (one stack per projection, the float case's draws packed), and the gate: the
built-in impls pass against the fp64 mixture of the unpacked experts, and wrong-format kernels registered here as
plugins are judged incorrect (an expert's scales swapped with another's; mxfp4's nibbles read high first; nvfp4's
tensor scales dropped)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.moe.cases import MoeCase, moved_bytes
from phasebench.bench.spec.quant import QUANT_SCHEMES
from phasebench.bench.sweep.measure import CaseState, gate
from phasebench.kernels import OPS, QuantizedWeight, moe, quantize, register

CPU = torch.device("cpu")
# K 200 and N 136: no multiple of 32; balanced routing gives every expert, 0 and 1 among them, several slots
AWKWARD = MoeCase(9, 136, 200, 5, 2, "balanced", "bfloat16", "decode")


def packed(scheme: str, dtype: str = "bfloat16") -> MoeCase:
    return dataclasses.replace(AWKWARD, scheme=scheme, dtype=dtype)


def test_a_float_case_keeps_its_repr_and_row_and_a_packed_one_says_its_scheme():
    case = packed("mxfp4")
    assert "scheme" not in repr(AWKWARD) and "scheme" not in AWKWARD.row_fields()
    assert "scheme='mxfp4'" in repr(case) and case.row_fields()["scheme"] == "mxfp4"
    assert " mxfp4 " in case.shape_label and "mxfp4" not in AWKWARD.shape_label
    with pytest.raises(ValueError, match="scheme: unknown scheme"):
        dataclasses.replace(AWKWARD, scheme="int3")
    with pytest.raises(ValueError, match="int4-g128 packs groups of 128 along K and N"):
        dataclasses.replace(AWKWARD, n=72, scheme="int4-g128")


@pytest.mark.parametrize("scheme", list(QUANT_SCHEMES))
def test_the_cost_reads_the_touched_experts_packed_bytes_plus_scales(scheme):
    case = packed(scheme)
    inputs = CaseState(case, CPU).inputs
    elem = 2
    per_expert = (inputs.w_gate_up.nbytes + inputs.w_down.nbytes) / case.experts
    rest = elem * case.m * case.k + 8 * case.m * case.top_k
    assert moved_bytes(case) == (case.touched_experts * per_expert + rest, elem * case.m * case.k)
    assert moved_bytes(case)[0] < moved_bytes(AWKWARD)[0]


def test_gpt_oss_experts_in_mxfp4_read_4_25_bits_a_weight():
    case = MoeCase(1, 2880, 2880, 32, 4, "uniform", "bfloat16", "decode", scheme="mxfp4")
    assert case.bits_per_weight == pytest.approx(4.25)
    assert moved_bytes(case)[0] - moved_bytes(dataclasses.replace(case, scheme=""))[0] == pytest.approx(
        -case.touched_experts * 3 * 2880 * 2880 * (2 - 4.25 / 8))


@pytest.mark.parametrize("scheme", ["nvfp4", "int4-g32"])
def test_the_inputs_pack_the_float_case_draws_as_one_stack(scheme):
    case = packed(scheme, "float32")
    floats, inputs = (operator_of(c).make_inputs(c, CPU) for c in (dataclasses.replace(case, scheme=""), case))
    for name in ("w_gate_up", "w_down"):
        ours, whole = getattr(inputs, name), quantize(getattr(floats, name), scheme)
        assert ours.shape == whole.shape and ours.scheme == scheme
        for got, want in zip(ours.tensors, whole.tensors, strict=True):
            assert torch.equal(got, want)
    assert torch.equal(inputs.x, floats.x) and torch.equal(inputs.topk_ids, floats.topk_ids)


def verdict(case, impl):
    state = CaseState(case, CPU)
    return gate(state, operator_of(case).prepare(case, state.inputs, impl), impl)


# the built-in impls on every scheme (tests/kernels/moe/test_qmoe.py has their peer matrix): the default tier one
# scheme each, the rest slow
QUICK = {("mxfp4", "naive"), ("nvfp4", "triton")}
BUILT_IN = [pytest.param(scheme, impl, marks=[] if (scheme, impl) in QUICK else [pytest.mark.slow])
            for scheme in QUANT_SCHEMES for impl in ("naive", "triton")]


@pytest.mark.parametrize("scheme, impl", BUILT_IN)
def test_the_built_in_impls_pass(scheme, impl):
    found = verdict(packed(scheme), impl)
    assert found.ok, f"{impl} failed the gate on {scheme}: {found}"


def _scales_swapped(w: QuantizedWeight) -> QuantizedWeight:
    """The stack with expert 0's scales and expert 1's exchanged (an expert offset into the scales gone wrong)."""
    raw = w.scales.view(torch.uint8) if w.scales.element_size() == 1 else w.scales  # e8m0 has no index_put
    scales = raw[[1, 0, *range(2, w.experts)]].contiguous().view(w.scales.dtype)
    return QuantizedWeight(w.qdata, scales, w.zeros, w.scheme, w.shape, w.tensor_scale)


def _nibbles_swapped(w: QuantizedWeight) -> QuantizedWeight:
    """The stack with each byte's two e2m1 codes exchanged (k = 2j read from the high nibble)."""
    return QuantizedWeight((w.qdata << 4) | (w.qdata >> 4), w.scales, w.zeros, w.scheme, w.shape, w.tensor_scale)


def _tensor_scale_dropped(w: QuantizedWeight) -> QuantizedWeight:
    """nvfp4's experts with their fp32 tensor scales read as 1 (the second level of scaling forgotten)."""
    return QuantizedWeight(w.qdata, w.scales, w.zeros, w.scheme, w.shape, torch.ones_like(w.tensor_scale))


BROKEN = {"swaps_expert_scales": _scales_swapped, "high_nibble_first": _nibbles_swapped,
          "drops_tensor_scale": _tensor_scale_dropped}


@pytest.fixture(scope="module")
def broken():
    for name, bug in BROKEN.items():
        register("moe", name, lambda x, wgu, wd, weights, ids, bug=bug: moe(x, bug(wgu), bug(wd), weights, ids,
                                                                             impl="naive"))
    yield list(BROKEN)
    for name in BROKEN:
        OPS["moe"].pop(name)


@pytest.mark.parametrize("scheme, bugs", [("mxfp4", ("swaps_expert_scales", "high_nibble_first")),
                                          ("int8", ("swaps_expert_scales",)),
                                          ("fp8-b128", ("swaps_expert_scales",)),
                                          ("nvfp4", ("swaps_expert_scales", "drops_tensor_scale"))])
def test_each_expert_format_bug_is_incorrect(broken, scheme, bugs):
    case = packed(scheme)
    for name in bugs:
        found = verdict(case, name)
        assert found.status == "incorrect", f"{name} passed the gate on {case.shape_label}: {found}"
        assert found.error > found.limit
