"""The bounded reference: full-matrix attention in float64 whatever the KV length, per-sequence lengths honoured,
its scratch within its bound."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from phasebench.bench.ops.attention import memory
from phasebench.bench.ops.attention import reference as correctness
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.attention.inputs import CaseInputs, make_inputs
from phasebench.bench.ops.attention.reference import reference, reference_scratch_bytes

from ....kernels.reference import reference as textbook

CUDA = torch.device("cuda")  # a device object only


@pytest.mark.cuda  # peak device memory is read from the CUDA allocator
def test_the_reference_stays_within_its_scratch_bound_on_cuda(monkeypatch):
    monkeypatch.setattr(correctness, "REFERENCE_SCORE_BYTES", 1 << 22)
    device = torch.device("cuda")
    case = AttentionCase(2, 8, 2, 97, 20000, 128, True, "bfloat16")
    x = make_inputs(case, device, seed=5)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    reference(case, x, device)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= memory.reference_output_bytes(case, device) + reference_scratch_bytes(case, device)


def test_the_reference_scratch_does_not_grow_with_the_kv_length():
    cpu = torch.device("cpu")
    for kv in (1 << 12, 1 << 17, 1 << 22):
        case = AttentionCase(64, 32, 8, 1, kv, 128, True, "bfloat16")
        assert reference_scratch_bytes(case, cpu) <= correctness.REFERENCE_SCORE_BYTES
    assert reference_scratch_bytes(AttentionCase(1, 32, 8, 32768, 32768, 128, True, "bfloat16"), CUDA) \
        <= correctness.REFERENCE_SCORE_BYTES


SIZES = [(1, 97), (17, 97), (97, 97), (1, 1025), (17, 1025), (97, 1025)]


@pytest.mark.parametrize("q_len,kv_len", SIZES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(6, 2), (3, 3)])
def test_the_bounded_reference_equals_full_matrix_attention(q_len, kv_len, causal, heads, monkeypatch):
    monkeypatch.setattr(correctness, "REFERENCE_SCORE_BYTES", 1 << 18)  # several key and query chunks
    case = AttentionCase(2, heads[0], heads[1], q_len, kv_len, 40, causal, "float32")
    rows, keys = correctness._reference_chunks(case, 8)
    assert keys < kv_len and (rows < q_len or q_len == 1)
    x = make_inputs(case, torch.device("cpu"), seed=q_len * kv_len + causal)
    out = reference(case, x, torch.device("cpu"))
    exact = textbook(x.q, x.k, x.v, causal=causal)
    assert out.dtype == torch.float64 and out.shape == x.q.shape
    assert (out - exact).abs().max().item() <= 1e-12 * exact.abs().max().item()


@pytest.mark.parametrize("causal,q_len", [(False, 1), (True, 1), (True, 5), (False, 17)])
def test_the_bounded_reference_honours_per_sequence_lengths(causal, q_len, monkeypatch):
    monkeypatch.setattr(correctness, "REFERENCE_SCORE_BYTES", 1 << 18)
    if "seqlens" not in {f.name for f in dataclasses.fields(AttentionCase)}:
        pytest.skip("AttentionCase has no seqlens field yet")
    lens = (1025, 97, 333) if not causal or q_len == 1 else (1025, 97, q_len)
    case = AttentionCase(3, 4, 2, q_len, 1025, 24, causal, "float32", seqlens=lens)
    x = make_inputs(case, torch.device("cpu"), seed=11)
    for b, n in enumerate(lens):  # loud values past each length: used by mistake, they move the result
        x.k[b, :, n:] = 30.0
        x.v[b, :, n:] = 1e3
    out = reference(case, x, torch.device("cpu"))
    exact = textbook(x.q, x.k, x.v, causal=causal, seqlens=list(lens))
    assert (out - exact).abs().max().item() <= 1e-12 * exact.abs().max().item()
    # lengths read from the case alone, or from the inputs' cache_seqlens when the case carries none
    assert torch.equal(out, reference(case, CaseInputs(x.q, x.k, x.v), torch.device("cpu")))
    assert torch.equal(out, reference(dataclasses.replace(case, seqlens=None), x, torch.device("cpu")))


@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_reference_and_the_baseline_ignore_nan_past_each_length(page, dtype, monkeypatch):
    """The gate puts NaN past each length (Operator.poison_unread); the reference and the baseline mask those keys
    before they multiply (0 x NaN is NaN): the same figures as on the clean cache."""
    from phasebench.bench.ops.attention import baseline
    from phasebench.bench.ops.attention.inputs import poison_unread

    monkeypatch.setattr(correctness, "REFERENCE_SCORE_BYTES", 1 << 17)  # several key chunks, some past a length
    case = AttentionCase(3, 8, 2, 1, 300, 32, True, dtype, seqlens=(37, 5, 300), page_size=page, window_left=40,
                         sinks=True)
    x = make_inputs(case, torch.device("cpu"), seed=13)
    clean = reference(case, x, torch.device("cpu"))
    low = baseline.attention_in_dtype(case, x, torch.device("cpu"))
    poison_unread(case, x)
    assert torch.isnan(x.k).any() and torch.isnan(x.v).any()
    assert torch.equal(reference(case, x, torch.device("cpu")), clean)
    assert torch.equal(baseline.attention_in_dtype(case, x, torch.device("cpu")), low)
