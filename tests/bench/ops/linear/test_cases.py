"""Linear cases: validation, cost model and shapes by hand."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops.linear.cases import (
    LinearCase,
    flops,
    min_bytes,
    moved_bytes,
    parse_linear_shape,
    weight_bytes,
)

CUDA = torch.device("cuda")


def test_cost_counts_two_flops_per_weight_and_token_and_reads_the_weights_once():
    c = LinearCase(17, 4097, 4095, "bfloat16", "decode")
    assert flops(c) == 2 * 17 * 4097 * 4095
    assert min_bytes(c) == 2 * (17 * 4095 + 4097 * 4095 + 17 * 4097)
    assert weight_bytes(c) == 2 * 4097 * 4095
    # decode is memory-bound: intensity about M FLOP/B in bf16, far below any GPU ridge
    gemv = LinearCase(1, 28672, 4096, "bfloat16", "decode")
    assert 0.99 < flops(gemv) / min_bytes(gemv) < 1.0


def test_x_and_the_weights_are_read_and_the_output_written():
    c = LinearCase(17, 4097, 4095, "bfloat16", "decode")
    assert moved_bytes(c) == (2 * (17 * 4095 + 4097 * 4095), 2 * 17 * 4097)
    assert sum(moved_bytes(c)) == min_bytes(c) and moved_bytes(c)[0] > weight_bytes(c)


def test_bad_linear_cases_are_one_line_errors():
    with pytest.raises(ValueError, match="m: must be a positive int"):
        LinearCase(0, 8, 8, "float32", "decode")
    with pytest.raises(ValueError, match="phase: must be one of decode, prefill"):
        LinearCase(1, 8, 8, "float32", "verify")
    with pytest.raises(ValueError, match="dtype"):
        LinearCase(1, 8, 8, "int8", "decode")


def test_linear_shapes_by_hand():
    c = parse_linear_shape("m=8,projection=gate_up", "bfloat16", "llama-3-70b")
    assert (c.m, c.n, c.k, c.phase, c.model, c.projection) == (8, 57344, 8192, "decode", "llama-3-70b", "gate_up")
    assert parse_linear_shape("m=1024,n=97,k=4095", "float32").phase == "prefill"
    with pytest.raises(ValueError, match="needs a model"):
        parse_linear_shape("m=8,projection=o", "float32")
    with pytest.raises(ValueError, match="unknown projection 'attn'"):
        parse_linear_shape("m=8,projection=attn,model=llama-3-8b", "float32")
    with pytest.raises(ValueError, match="lacks k"):
        parse_linear_shape("m=8,n=9", "float32")
