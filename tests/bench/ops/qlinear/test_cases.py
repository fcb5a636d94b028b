"""Quantized linear cases: fields, bits per weight in the label, the cost model against the bytes quantize stores,
and the decode-quant and quick suites."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from phasebench.bench.ops import operators
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.ops.linear.cases import moved_bytes as linear_bytes
from phasebench.bench.ops.qlinear import inputs
from phasebench.bench.ops.qlinear.cases import QLinearCase, QLinearSweep, flops, min_bytes, moved_bytes
from phasebench.bench.spec.quant import QUANT_SCHEMES
from phasebench.bench.sweep.suites import suite_cases

CPU = torch.device("cpu")


@pytest.mark.parametrize("scheme", list(QUANT_SCHEMES))
@pytest.mark.parametrize("m, n, k, dtype", [(1, 37, 300, "float32"), (5, 64, 160, "bfloat16"), (3, 33, 128, "float16")])
def test_the_read_bytes_are_what_the_inputs_hold(scheme, m, n, k, dtype):
    case = QLinearCase(m, n, k, scheme, dtype, "decode")
    x = inputs.make_inputs(case, CPU, 1)
    read, written = moved_bytes(case)
    assert read == x.qweight.nbytes + x.x.nbytes and written == m * n * x.x.element_size()
    assert min_bytes(case) == read + written and flops(case) == 2 * m * n * k
    assert case.bits_per_weight == pytest.approx(x.qweight.bits_per_weight)
    assert f"{case.bits_per_weight:.3g}b" in case.shape_label and scheme in case.shape_label


def test_the_ideal_speedup_at_one_token_is_the_bytes_ratio():
    """int4-g128 in bf16 stores 4.25 bits a weight: at M = 1 the bytes of the unquantized bf16 GEMV over its own."""
    q = QLinearCase(1, 4096, 4096, "int4-g128", "bfloat16", "decode")
    dense = LinearCase(1, 4096, 4096, "bfloat16", "decode")
    assert q.bits_per_weight == 4.25
    ratio = sum(linear_bytes(dense)) / min_bytes(q)
    assert 3.7 < ratio < 16 / 4.25


@pytest.mark.parametrize("change, message", [
    (dict(scheme="int3"), "scheme: unknown scheme 'int3'"),
    (dict(k=100), "k: must be at least the group size 128"),
    (dict(dtype="float64"), "dtype: must be one of"),
    (dict(m=0), "m: must be a positive int"),
])
def test_bad_cases_are_one_line(change, message):
    args = dict(m=1, n=64, k=256, scheme="int4-g128", dtype="float32", phase="decode")
    with pytest.raises(ValueError, match=message):
        QLinearCase(**{**args, **change})


def test_decode_quant_pairs_each_scheme_with_the_unquantized_projection():
    cases = suite_cases("decode-quant", "cpu", "float32")
    dense = [c for c in cases if c.op == "linear"]
    quant = [c for c in cases if c.op == "qlinear"]
    assert len(quant) == len(QUANT_SCHEMES) * len(dense) and len(cases) <= 100  # a sane host sweep
    assert {(c.m, c.n, c.k) for c in quant} == {(c.m, c.n, c.k) for c in dense}
    assert sorted({c.m for c in dense}) == [1, 4, 16]
    gpu = suite_cases("decode-quant", "cuda", "bfloat16")
    assert sorted({c.m for c in gpu}) == [1, 2, 4, 8, 16, 32, 64] and {c.projection for c in gpu} >= {"lm_head"}
    assert {c.model for c in suite_cases("decode-quant", "cpu", "float32", ("mistral-7b",))} == {"mistral-7b"}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_quick_has_exactly_one_int4_gemv_row_in_bf16_beside_the_same_gemv_unquantized(device):
    cases = suite_cases("quick", device, "float32")  # whatever the run's dtype: the vendor path a server runs
    quant = [c for c in cases if c.op == "qlinear"]
    assert len(quant) == 1 and quant[0].scheme.startswith("int4") and quant[0].m == 1
    dense = [c for c in cases if c.op == "linear" and (c.m, c.n, c.k) == (quant[0].m, quant[0].n, quant[0].k)]
    assert quant[0].dtype == "bfloat16" and [c.dtype for c in dense] == ["bfloat16"]
    assert {c.dtype for c in cases if c.op == "attention"} == {"float32"}


def test_the_row_fields_carry_the_scheme_and_the_record_is_found():
    case = QLinearSweep(("llama-3-8b",), (2,), "decode", ("o",), ("int8",)).cases("bfloat16")[0]
    assert case.row_fields()["scheme"] == "int8" and case.row_fields()["op"] == "qlinear"
    assert "qlinear" in operators() and operators()["qlinear"].case_type is QLinearCase
    assert dataclasses.replace(case, m=3).m == 3
