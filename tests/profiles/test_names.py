"""Case keys and stage prefixes of the NVTX range names."""

from types import SimpleNamespace

import pytest
from phasebench.profiles.names import (
    ALL_FIELDS,
    CHECK,
    SETUP,
    TIMING,
    case_key,
    case_key_for,
    is_timed_case,
    linear_key_for,
    mla_key_for,
    parse_case_key,
    stage_name,
    stage_of,
)

FIELDS = dict(impl="flash", phase="prefill", batch=1, q_heads=32, kv_heads=8, q_len=512, kv_len=512,
              head_dim=128, dtype="bfloat16", causal=True)


def test_case_key_matches_schema_example():
    assert case_key(**FIELDS) == "flash/prefill/b1-hq32-hkv8-q512-k512-d128-bfloat16-causal"
    assert case_key(**{**FIELDS, "causal": False}) == "flash/prefill/b1-hq32-hkv8-q512-k512-d128-bfloat16"


@pytest.mark.parametrize("fields", [
    FIELDS,
    {**FIELDS, "causal": False},
    dict(impl="sdpa_efficient", phase="chunked_prefill", batch=3, q_heads=40, kv_heads=40, q_len=97,
         kv_len=1025, head_dim=80, dtype="float16", causal=True),
    dict(impl="triton", phase="decode", batch=64, q_heads=32, kv_heads=1, q_len=1, kv_len=131072,
         head_dim=64, dtype="float32", causal=False),
])
def test_round_trip(fields):
    key = case_key(**fields)
    parsed = parse_case_key(key)
    assert {f: parsed[f] for f in fields} == fields and parsed["op"] == "attention"
    assert list(parsed) == list(ALL_FIELDS)  # fields come in the schema's order
    assert parsed["m"] is None and parsed["kv_tokens"] == fields["batch"] * fields["kv_len"]
    assert type(parsed["causal"]) is bool and all(type(parsed[f]) is int for f in ("batch", "head_dim"))
    assert case_key(**{f: parsed[f] for f in FIELDS}) == key


def test_ragged_and_linear_keys_round_trip():
    ragged = SimpleNamespace(**{k: v for k, v in FIELDS.items() if k != "impl"}, seqlens=(3, 97))
    key = case_key_for(ragged, "triton")
    assert key.endswith("-t100") and parse_case_key(key)["kv_tokens"] == 100
    paged = SimpleNamespace(**vars(ragged), page_size=16)
    key = case_key_for(paged, "triton")
    assert key.endswith("-t100-p16") and parse_case_key(key)["page_size"] == 16
    assert parse_case_key(case_key_for(ragged, "triton"))["page_size"] == 0  # contiguous
    lin = SimpleNamespace(m=8, n=28672, k=4096, phase="decode", dtype="bfloat16")
    key = linear_key_for(lin, "triton")
    assert key == "linear/triton/decode/m8-n28672-k4096-bfloat16"
    parsed = parse_case_key(key)
    assert (parsed["op"], parsed["impl"], parsed["m"], parsed["n"], parsed["k"], parsed["batch"]) == \
        ("linear", "triton", 8, 28672, 4096, None)


def test_window_sinks_and_mla_keys_round_trip():
    case = SimpleNamespace(**{k: v for k, v in FIELDS.items() if k != "impl"}, seqlens=None, page_size=16,
                           window_left=127, sinks=True)
    key = case_key_for(case, "triton")
    assert key.endswith("-p16-w127-sinks")
    parsed = parse_case_key(key)
    assert (parsed["window_left"], parsed["sinks"], parsed["page_size"]) == (127, True, 16)
    assert parse_case_key(case_key(**FIELDS))["window_left"] == -1  # no window: keys as before
    mla = SimpleNamespace(phase="decode", batch=8, q_heads=128, q_len=2, kv_len=4096, head_dim=576, head_dim_v=512,
                          dtype="bfloat16", seqlens=(4096,) * 7 + (100,), page_size=64)
    key = mla_key_for(mla, "triton")
    assert key == "mla/triton/decode/b8-hq128-q2-k4096-d576-v512-bfloat16-t28772-p64"
    parsed = parse_case_key(key)
    assert (parsed["op"], parsed["kv_heads"], parsed["head_dim"], parsed["head_dim_v"], parsed["kv_tokens"]) == \
        ("mla", 1, 576, 512, 28772)


def test_case_key_accepts_torch_dtype_names_and_case_objects():
    assert case_key(**{**FIELDS, "dtype": "torch.bfloat16"}) == case_key(**FIELDS)
    case = SimpleNamespace(**{k: v for k, v in FIELDS.items() if k != "impl"})
    assert case_key_for(case, "flash") == case_key(**FIELDS)


@pytest.mark.parametrize("bad, field", [
    ({"batch": -1}, "batch"), ({"q_len": 2.5}, "q_len"), ({"head_dim": True}, "head_dim"),
    ({"impl": "a/b"}, "impl"), ({"impl": ""}, "impl"), ({"dtype": "bfloat-16"}, "dtype"),
    ({"phase": "pre fill"}, "phase"),
])
def test_case_key_rejects_bad_fields_naming_them(bad, field):
    with pytest.raises(ValueError, match=field) as err:
        case_key(**{**FIELDS, **bad})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", [
    None, 3, "", "l2flush", "aten::mm", "flash/prefill", f"setup: {case_key(**FIELDS)}",
    "flash/prefill/b1-hq32-hkv8-q512-k512-d128", "flash/prefill/b1-hq32-hkv8-q512-k512-d128-bfloat16-causal-x",
    "flash/prefill/bX-hq32-hkv8-q512-k512-d128-bfloat16", " flash/prefill/b1-hq32-hkv8-q512-k512-d128-bfloat16",
])
def test_parse_rejects_other_names(name):
    assert parse_case_key(name) is None
    assert not is_timed_case(name)


def test_stages():
    key = case_key(**FIELDS)
    assert stage_of(key) == (TIMING, key)
    assert stage_of(f"setup: {key}") == (SETUP, key)
    assert stage_of(f"check: {key}") == (CHECK, key)
    assert stage_name(SETUP, key) == f"setup: {key}" and stage_name(TIMING, key) == key
    assert all(stage_of(stage_name(s, key)) == (s, key) for s in (SETUP, CHECK, TIMING))
    for other in ("l2flush", "setup: l2flush", f"setup:{key}", f"warmup: {key}", None):
        assert stage_of(other) is None
    assert is_timed_case(key) and not is_timed_case(f"check: {key}")
    with pytest.raises(ValueError, match="stage"):
        stage_name("warmup", key)


def test_moe_keys_round_trip():
    from phasebench.profiles.names import moe_key_for

    case = SimpleNamespace(m=8, n=768, k=2048, experts=128, top_k=8, routing="zipf-1.2", phase="decode",
                           dtype="bfloat16")
    key = moe_key_for(case, "triton")
    assert key == "moe/triton/decode/m8-n768-k2048-e128-top8-zipf-1.2-bfloat16"
    parsed = parse_case_key(key)
    assert (parsed["op"], parsed["experts"], parsed["top_k"], parsed["routing"], parsed["dtype"], parsed["m"]) == \
        ("moe", 128, 8, "zipf-1.2", "bfloat16", 8)
    with pytest.raises(ValueError, match="routing="):
        moe_key_for(SimpleNamespace(**{**vars(case), "routing": "zipf 1"}), "triton")
    packed = moe_key_for(SimpleNamespace(**{**vars(case), "scheme": "int4-g128"}), "triton")
    assert packed == key + "-int4-g128" and parse_case_key(packed)["scheme"] == "int4-g128"
    assert parse_case_key(key)["scheme"] is None and parse_case_key(packed)["dtype"] == "bfloat16"
