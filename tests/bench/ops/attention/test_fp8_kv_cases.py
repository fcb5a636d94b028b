"""FP8 KV cases: the field shown only where set (the seeds of other cases kept), the cost model's one byte an element
plus scales, e4m3 inputs with a scale per KV head (MLA: one), the reference from the codes decoded from their bits,
the gate passing naive and triton and failing a kernel that drops the scale, and the fp8-kv-decode suite's pairs."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.attention import cost, inputs, memory, reference
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.mla import inputs as mla_inputs
from phasebench.bench.ops.mla.cases import MLACase, latent_read_bytes
from phasebench.bench.ops.qlinear.unpack import e4m3_values
from phasebench.bench.sweep.measure import CaseState, gate
from phasebench.bench.sweep.suites import suite_cases
from phasebench.kernels import OPS, register
from phasebench.profiles.names import case_key_for, mla_key_for, parse_case_key

CPU = torch.device("cpu")
DECODE = AttentionCase(2, 6, 3, 1, 97, 40, True, "bfloat16", seqlens=(97, 30), kv_dtype="fp8")
PAGED = AttentionCase(2, 4, 2, 3, 70, 24, True, "bfloat16", seqlens=(70, 9), page_size=7, kv_dtype="fp8")
LATENT = MLACase(2, 5, 2, 45, "bfloat16", seqlens=(45, 6), page_size=11, head_dim=48, head_dim_v=32, kv_dtype="fp8")


def test_the_field_is_shown_only_where_set():
    plain = AttentionCase(1, 4, 2, 1, 64, 16, True, "bfloat16")
    assert "kv_dtype" not in repr(plain) and "kv_dtype" not in plain.row_fields() and "kv-" not in plain.shape_label
    assert "kv_dtype='fp8'" in repr(DECODE) and DECODE.row_fields()["kv_dtype"] == "fp8"
    assert DECODE.shape_label.endswith("kv-fp8") and LATENT.shape_label.endswith("kv-fp8")
    latent = MLACase(1, 4, 1, 64, "bfloat16")
    assert "kv_dtype" not in repr(latent) and "kv_dtype" not in latent.row_fields()
    with pytest.raises(ValueError, match="kv_dtype: must be '' .* or 'fp8'"):
        AttentionCase(1, 4, 2, 1, 64, 16, True, "bfloat16", kv_dtype="int8")


def test_nvtx_keys_tell_fp8_cases_apart_and_parse_back():
    key = case_key_for(DECODE, "triton")
    assert key.endswith("-kvfp8") and parse_case_key(key)["kv_dtype"] == "fp8"
    assert parse_case_key(case_key_for(AttentionCase(1, 4, 2, 1, 64, 16, True, "bfloat16"), "naive"))["kv_dtype"] == ""
    assert parse_case_key(mla_key_for(LATENT, "naive"))["kv_dtype"] == "fp8"


def test_the_cost_reads_one_byte_an_element_and_the_scales():
    plain = AttentionCase(2, 6, 3, 1, 97, 40, True, "bfloat16", seqlens=(97, 30))
    keys = 2 * 3 * (97 + 30) * 40  # K and V elements the call reads, by kv heads
    assert cost.kv_read_bytes(plain) == 2 * keys
    assert cost.kv_read_bytes(DECODE) == keys + 2 * 4 * 3  # a float32 scale per kv head, for K and for V
    assert cost.flops(DECODE) == cost.flops(plain)
    queries = 2 * 6 * 1 * 40 * 2  # q in the case's dtype, o out
    assert cost.moved_bytes(DECODE) == (queries + keys + 24, queries)
    assert latent_read_bytes(LATENT) == (45 + 6) * 48 + 4
    assert memory.input_bytes(DECODE) < memory.input_bytes(plain)


def test_inputs_are_e4m3_codes_with_a_scale_per_kv_head_that_uses_the_range():
    x = inputs.make_inputs(PAGED, CPU, 3)
    assert x.k.dtype == x.v.dtype == torch.float8_e4m3fn and x.k_scale.shape == x.v_scale.shape == (2,)
    for codes in (x.k, x.v):
        top = e4m3_values(codes).abs().amax(dim=(0, 1, 3))
        torch.testing.assert_close(top, torch.full((2,), 448.0, dtype=torch.float64))  # amax / scale = 448 a head
    m = mla_inputs.make_inputs(LATENT, CPU, 3)
    assert m.latent.dtype == torch.float8_e4m3fn and m.latent_scale.shape == ()


def test_the_reference_decodes_the_codes_from_their_bits():
    x = inputs.make_inputs(DECODE, CPU, 1)
    k, v = reference.kv_values(x, DECODE, 0, 97, torch.float64)
    assert torch.equal(k, e4m3_values(x.k) * x.k_scale.double().view(1, -1, 1, 1))
    assert torch.equal(v, e4m3_values(x.v) * x.v_scale.double().view(1, -1, 1, 1))
    key, value = reference.kv_values(x, DECODE, 0, 97, torch.float32, rounding=torch.bfloat16)
    assert torch.equal(key, k.float()) and torch.equal(value, v.to(torch.bfloat16).float())  # the baseline's P.V


@pytest.mark.parametrize("case", [DECODE, PAGED, LATENT], ids=["ragged", "paged-verify", "mla-paged"])
@pytest.mark.parametrize("impl", ["naive", "triton"])
def test_naive_and_triton_pass_the_gate(case, impl):
    state = CaseState(case, CPU)
    found = gate(state, operator_of(case).prepare(case, state.inputs, impl), impl)
    assert found.ok, f"{impl} on {case.shape_label}: {found}"


def test_a_kernel_that_drops_v_scale_fails_the_gate():
    from phasebench.kernels import attention

    def no_v_scale(q, k, v, *, causal, scale, cache_seqlens, k_scale, v_scale):
        return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens,
                         k_scale=k_scale, v_scale=torch.ones_like(v_scale))

    impl = register("attention", "fp8_no_v_scale", no_v_scale)
    object.__setattr__(impl, "fp8_kv", True)  # a plugin that says it reads fp8 (register has no flag for it)
    try:
        state = CaseState(DECODE, CPU)
        found = gate(state, operator_of(DECODE).prepare(DECODE, state.inputs, "fp8_no_v_scale"), "fp8_no_v_scale")
    finally:
        OPS["attention"].pop("fp8_no_v_scale")
    assert found.status == "incorrect" and found.error > found.limit, found  # judged wrong, not merely failed


def test_the_suite_pairs_each_fp8_case_with_its_cache_in_the_dtype():
    for device in ("cpu", "cuda"):
        cases = suite_cases("fp8-kv-decode", device, "bfloat16")
        fp8 = [c for c in cases if c.kv_dtype == "fp8"]
        assert fp8 and {c.op for c in fp8} == {"attention", "mla"}
        for c in fp8:
            assert type(c)(**{**{f: getattr(c, f) for f in c.__dataclass_fields__}, "kv_dtype": ""}) in cases
    assert any(c.kv_len == 16 * 1024 for c in suite_cases("fp8-kv-decode", "cuda", "bfloat16"))
