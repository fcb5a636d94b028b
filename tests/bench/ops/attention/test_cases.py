"""Cases, presets, suites as data and --shape parsing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from phasebench.bench.ops.attention.cases import MODELS, AttentionCase, parse_shape
from phasebench.bench.spec.models import model_config
from phasebench.bench.sweep.suites import SUITES, suite_cases

CPU = torch.device("cpu")


def case(q_len, kv_len, **over):
    args = dict(batch=1, q_heads=8, kv_heads=2, q_len=q_len, kv_len=kv_len, head_dim=64, causal=True,
                dtype="bfloat16")
    args.update(over)
    return AttentionCase(**args)


@pytest.mark.parametrize("q_len,kv_len,phase", [(512, 512, "prefill"), (1, 1, "prefill"), (1, 4096, "decode"),
                                                (256, 4096, "chunked_prefill"), (4, 1000, "chunked_prefill")])
def test_phase_follows_the_lengths(q_len, kv_len, phase):
    assert case(q_len, kv_len).phase == phase


def test_cases_are_frozen_and_validated():
    c = case(3, 9)
    with pytest.raises(AttributeError):
        c.q_len = 4
    with pytest.raises(ValueError, match="q_heads: must be a multiple of kv_heads"):
        case(3, 9, q_heads=5)
    with pytest.raises(ValueError, match="dtype"):
        case(3, 9, dtype="int8")
    with pytest.raises(ValueError, match="q_len: must not exceed kv_len"):
        case(10, 9)
    with pytest.raises(ValueError, match="batch: must be a positive int"):
        case(3, 9, batch=0)


def test_presets_hold_the_public_configurations():
    assert (MODELS["llama-3-8b"].q_heads, MODELS["llama-3-8b"].kv_heads, MODELS["llama-3-8b"].head_dim) == (32, 8, 128)
    assert MODELS["llama-3-70b"].q_heads == 64 and MODELS["qwen2.5-7b"].kv_heads == 4
    assert MODELS["gemma-2-9b"].head_dim == 256 and MODELS["llama-2-7b"].kv_heads == 32


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_quick_suite_has_every_phase(device):
    phases = {(c.op, c.phase) for c in suite_cases("quick", device, "bfloat16")}
    assert phases == {("attention", "prefill"), ("attention", "chunked_prefill"), ("attention", "decode"),
                      ("linear", "decode"), ("linear", "prefill"), ("qlinear", "decode")}


def test_gpu_sweeps_cover_the_ranges_the_issue_names():
    prefill = suite_cases("prefill", "cuda", "bfloat16")
    assert min(c.q_len for c in prefill) == 512 and max(c.q_len for c in prefill) == 32768
    assert {c.causal for c in prefill} == {True, False}
    decode = suite_cases("decode", "cuda", "bfloat16")
    assert {c.kv_len for c in decode} >= {1024, 131072} and {c.batch for c in decode} >= {1, 256}
    chunked = suite_cases("chunked", "cuda", "bfloat16")
    assert {c.q_len for c in chunked} == {256, 1024, 4096} and max(c.kv_len - c.q_len for c in chunked) <= 32768
    verify = suite_cases("verify", "cuda", "bfloat16")
    assert min(c.q_len for c in verify) == 2 and max(c.q_len for c in verify) == 16
    full = suite_cases("full", "cuda", "bfloat16")
    ragged = suite_cases("ragged", "cuda", "bfloat16")
    paged = suite_cases("paged", "cuda", "bfloat16")
    linear = suite_cases("decode-linear", "cuda", "bfloat16") + suite_cases("prefill-linear", "cuda", "bfloat16")
    assert set(prefill + decode + chunked + verify + ragged + paged + linear) == set(full)
    assert set(suite_cases("full", "cuda", "bfloat16", ops=("attention",))) == set(full) - set(linear)


def test_cpu_sizes_are_small_and_models_can_change():
    assert max(c.kv_len for s in SUITES for c in suite_cases(s, "cpu", "float32", ops=("attention",))) <= 1024
    cases = suite_cases("decode", "cpu", "float32", ("llama-3-70b", "gemma-2-9b"))
    assert all(c.op == "attention" for c in cases)
    assert {c.model for c in cases} == {"llama-3-70b", "gemma-2-9b"}
    assert {(c.q_heads, c.head_dim) for c in cases} == {(64, 128), (16, 256)}


def test_unknown_suite_or_model():
    with pytest.raises(ValueError, match="suite: unknown suite 'huge'"):
        suite_cases("huge", "cpu", "float32")
    with pytest.raises(ValueError, match="model: unknown model 'gpt-5'"):
        suite_cases("quick", "cpu", "float32", ("gpt-5",))


def test_parse_shape():
    c = parse_shape("batch=1,q_heads=32,kv_heads=8,q_len=1,kv_len=65536,head_dim=128", "bfloat16")
    assert (c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len, c.head_dim, c.causal) == (1, 32, 8, 1, 65536, 128, True)
    assert c.phase == "decode" and c.model == ""
    m = parse_shape("q_len=100,kv_len=300,causal=0", "float32", model="qwen2.5-7b")
    assert (m.q_heads, m.kv_heads, m.head_dim, m.causal, m.batch, m.model) == (28, 4, 128, False, 1, "qwen2.5-7b")
    f = parse_shape("q_len=1,kv_len=16384,kv=fp8", "bfloat16", model="llama-3-8b")
    assert f.kv_dtype == "fp8" and f.kv_len == 16384 and "kv-fp8" in f.shape_label
    with pytest.raises(ValueError, match="kv_dtype: must be"):
        parse_shape("q_len=1,kv_len=9,kv=fp4", "bfloat16", model="llama-3-8b")


@pytest.mark.parametrize("text,message", [
    ("batch=1,q_len", "shape: malformed 'q_len'"),
    ("speed=3", "shape: malformed 'speed=3'"),
    ("q_len=x,kv_len=3,q_heads=1,kv_heads=1,head_dim=8", "shape: q_len must be an integer"),
    ("q_len=1,kv_len=3", "lacks q_heads, kv_heads, head_dim"),
    ("model=nope,q_len=1,kv_len=3", "model: unknown model 'nope'"),
    ("q_len=1,kv_len=3,q_heads=1,kv_heads=1,head_dim=8,causal=maybe", "causal must be"),
])
def test_malformed_shapes(text, message):
    with pytest.raises(ValueError, match=message):
        parse_shape(text, "float32")


def test_ragged_suite_is_seeded_long_tailed_and_capped():
    for device in ("cpu", "cuda"):
        cases = suite_cases("ragged", device, "bfloat16")
        assert cases and cases == suite_cases("ragged", device, "bfloat16")  # the same lengths every time
        for c in cases:
            assert c.phase == "decode" and c.ragged and len(c.seqlens) == c.batch
            assert max(c.seqlens) == c.kv_len and min(c.seqlens) >= 1
            ordered = sorted(c.seqlens)
            assert ordered[len(ordered) // 2] < c.kv_len / 4  # most sequences are far shorter than the longest


def test_ragged_lengths_are_checked_and_parsed():
    with pytest.raises(ValueError, match="seqlens: must be a tuple of batch=2"):
        AttentionCase(2, 4, 2, 1, 10, 8, True, "float32", seqlens=(3,))
    with pytest.raises(ValueError, match=r"seqlens: each length must be an int in \[1, kv_len=10\]"):
        AttentionCase(2, 4, 2, 1, 10, 8, True, "float32", seqlens=(3, 11))
    c = parse_shape("model=llama-3-8b,q_len=1,seqlens=97/1025/3", "bfloat16")
    assert (c.batch, c.kv_len, c.seqlens, c.seqlens_text) == (3, 1025, (97, 1025, 3), "97,1025,3")
    assert c.row_fields()["kv_tokens"] == 1125 and "avg" in c.shape_label


def test_linear_suites_cover_every_projection_and_the_batch_range():
    decode = suite_cases("decode-linear", "cuda", "bfloat16")
    assert {c.m for c in decode} == {1, 2, 4, 8, 16, 32, 64, 128, 256} and {c.phase for c in decode} == {"decode"}
    assert {c.projection for c in decode} == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert {c.model for c in decode} == {"llama-3-8b", "llama-3-70b"}
    prefill = suite_cases("prefill-linear", "cuda", "bfloat16")
    assert min(c.m for c in prefill) == 512 and max(c.m for c in prefill) == 16384
    gate_up = next(c for c in decode if c.model == "llama-3-70b" and c.projection == "gate_up")
    assert (gate_up.n, gate_up.k) == (2 * 28672, 8192)
    assert all(c.m <= 1024 for c in suite_cases("full", "cpu", "float32", ops=("linear",)))


def test_model_presets_give_the_layer_projections_and_custom_models_parse():
    llama = MODELS["llama-3-8b"]
    assert llama.projections() == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                                   "down": (4096, 14336), "lm_head": (128256, 4096)}
    assert (MODELS["gemma-2-9b"].vocab, MODELS["qwen2.5-7b"].intermediate, MODELS["llama-3-70b"].layers) == \
        (256000, 18944, 80)
    custom = model_config("name=tiny,hidden=96,intermediate=200,layers=3,q_heads=6,kv_heads=2,head_dim=16,vocab=97")
    assert custom.projections()["qkv"] == ((6 + 4) * 16, 96) and MODELS["tiny"] is custom
    assert suite_cases("decode", "cpu", "float32", ("tiny",))[0].q_heads == 6
    with pytest.raises(ValueError, match="model: .* lacks vocab"):
        model_config("name=x,hidden=8,intermediate=8,layers=1,q_heads=2,kv_heads=1,head_dim=4")
    with pytest.raises(ValueError, match="q_heads: must be a multiple of kv_heads"):
        model_config("name=y,hidden=8,intermediate=8,layers=1,q_heads=3,kv_heads=2,head_dim=4,vocab=9")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_paged_suite_sets_each_page_size_beside_the_contiguous_case(device):
    cases = suite_cases("paged", device, "bfloat16")
    by_shape: dict = {}
    for c in cases:
        by_shape.setdefault(c.shape_label.replace(f" page{c.page_size}", ""), set()).add(c.page_size)
    assert all(sizes == {0, 16, 64, 256} for sizes in by_shape.values()), by_shape
    assert {c.phase for c in cases} == {"decode", "chunked_prefill"} and any(c.ragged for c in cases)


def test_paged_cases_count_their_pages_and_parse():
    c = AttentionCase(3, 8, 2, 1, 100, 64, True, "float32", seqlens=(100, 1, 33), page_size=16)
    assert c.paged and c.pages == (7, 1, 3) and c.max_pages == 7
    assert "page16" in c.shape_label and c.row_fields()["page_size"] == 16
    dense = AttentionCase(3, 8, 2, 1, 100, 64, True, "float32")
    assert not dense.paged and dense.pages == () and dense.row_fields()["page_size"] == 0
    # repr seeds the inputs and names a sweep: a contiguous case's is what it was before the field; a paged one's
    # differs
    assert "page_size" not in repr(dense) and repr(c).endswith("page_size=16)")
    assert c != dataclasses.replace(c, page_size=0)
    parsed = parse_shape("batch=8,q_heads=32,kv_heads=8,q_len=1,kv_len=8192,head_dim=128,page=16", "bfloat16")
    assert (parsed.page_size, parsed.max_pages, parsed.phase) == (16, 512, "decode")
    with pytest.raises(ValueError, match="page_size: must be a non-negative int"):
        AttentionCase(1, 2, 1, 1, 10, 8, True, "float32", page_size=-16)
    with pytest.raises(ValueError, match="shape: page must be an integer"):
        parse_shape("q_len=1,kv_len=3,q_heads=1,kv_heads=1,head_dim=8,page=big", "float32")


def test_window_and_sinks_leave_other_cases_seeds_and_show_when_set():
    plain = AttentionCase(1, 8, 2, 1, 300, 64, True, "bfloat16")
    assert "window_left" not in repr(plain) and "sinks" not in repr(plain)  # the seeds of earlier cases are kept
    gpt = AttentionCase(1, 8, 2, 1, 300, 64, True, "bfloat16", window_left=127, sinks=True)
    assert "window_left=127" in repr(gpt) and "sinks=True" in repr(gpt) and gpt.shape_label.endswith("w127 sinks")
    assert gpt.row_fields()["window_left"] == 127 and gpt.row_fields()["sinks"] is True
    parsed = parse_shape("q_len=1,kv_len=300,window=127,sinks=1", "bfloat16", model="llama-3-8b")
    assert (parsed.window_left, parsed.sinks) == (127, True)
    with pytest.raises(ValueError, match="window_left: must be an int >= -1"):
        AttentionCase(1, 8, 2, 1, 300, 64, True, "bfloat16", window_left=-3)


def test_window_suites_run_gpt_oss_window_and_full_layers_at_its_published_dims():
    from phasebench.bench.ops.attention.inputs import make_inputs

    decode = suite_cases("window-decode", "cuda", "bfloat16")
    assert {(c.q_heads, c.kv_heads, c.head_dim, c.sinks) for c in decode} == {(64, 8, 64, True)}
    assert {c.window_left for c in decode} == {127, -1} and {c.page_size for c in decode} == {0, 16, 64}
    prefill = suite_cases("sink-prefill", "cpu", "float32")
    assert {c.phase for c in prefill} == {"prefill", "chunked_prefill"} and all(c.sinks for c in prefill)
    kinds = suite_cases("decode-kinds", "cpu", "bfloat16")
    assert {c.op for c in kinds} == {"attention", "mla"} and {c.kv_len for c in kinds} == {512, 1024, 600}
    x = make_inputs(AttentionCase(2, 6, 2, 1, 40, 16, True, "bfloat16", window_left=7, sinks=True), CPU, 3)
    assert x.sinks.dtype == torch.float32 and x.sinks.shape == (6,)
    with pytest.raises(ValueError, match="has MLA attention, not WINDOW"):
        suite_cases("window-decode", "cpu", "float32", ("deepseek-v3",))
