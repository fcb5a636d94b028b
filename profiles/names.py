"""NVTX range names for phasebench cases: build and parse the case key and its stage prefixes."""

from __future__ import annotations

import operator
import re

SETUP = "setup"
CHECK = "check"
TIMING = "timing"
L2FLUSH = "l2flush"  # nested range around the L2 flush between timed calls
STAGES = (SETUP, CHECK, TIMING)
FIELDS = ("impl", "phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype", "causal")
LINEAR_FIELDS = ("m", "n", "k")
ELEMENTWISE_FIELDS = ("kind", "cache_len")  # beside m, n and the attention fields kv_heads, head_dim
MOE_FIELDS = ("experts", "top_k", "routing")  # beside m, n, k
# parse_case_key's (None where n/a)
ALL_FIELDS = ("op", *FIELDS, "kv_tokens", "page_size", *LINEAR_FIELDS, *ELEMENTWISE_FIELDS, "scheme", "window_left",
              "sinks", "head_dim_v", *MOE_FIELDS, "kv_dtype")

_INT_FIELDS = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim")
_IMPL = re.compile(r"[A-Za-z0-9_.-]+")  # delimited by '/', so '-' and '.' are safe here
_WORD = re.compile(r"[A-Za-z0-9_]+")
_KEY = re.compile(
    r"(?P<impl>[A-Za-z0-9_.-]+)/(?P<phase>[A-Za-z0-9_]+)/"
    r"b(?P<batch>\d+)-hq(?P<q_heads>\d+)-hkv(?P<kv_heads>\d+)-q(?P<q_len>\d+)-k(?P<kv_len>\d+)"
    r"-d(?P<head_dim>\d+)-(?P<dtype>[A-Za-z0-9_]+?)(?P<causal>-causal)?(?:-t(?P<kv_tokens>\d+))?"
    r"(?:-p(?P<page_size>\d+))?(?:-kv(?P<kv_dtype>fp8))?(?:-w(?P<window_left>\d+))?(?P<sinks>-sinks)?"
)
_MLA_KEY = re.compile(
    r"mla/(?P<impl>[A-Za-z0-9_.-]+)/(?P<phase>[A-Za-z0-9_]+)/"
    r"b(?P<batch>\d+)-hq(?P<q_heads>\d+)-q(?P<q_len>\d+)-k(?P<kv_len>\d+)-d(?P<head_dim>\d+)-v(?P<head_dim_v>\d+)"
    r"-(?P<dtype>[A-Za-z0-9_]+?)(?:-t(?P<kv_tokens>\d+))?(?:-p(?P<page_size>\d+))?(?:-kv(?P<kv_dtype>fp8))?"
)
_LINEAR_KEY = re.compile(
    r"linear/(?P<impl>[A-Za-z0-9_.-]+)/(?P<phase>[A-Za-z0-9_]+)/m(?P<m>\d+)-n(?P<n>\d+)-k(?P<k>\d+)"
    r"-(?P<dtype>[A-Za-z0-9_]+)"
)
_QLINEAR_KEY = re.compile(
    r"qlinear/(?P<impl>[A-Za-z0-9_.-]+)/(?P<phase>[A-Za-z0-9_]+)/m(?P<m>\d+)-n(?P<n>\d+)-k(?P<k>\d+)"
    r"-(?P<dtype>[A-Za-z0-9_]+)-(?P<scheme>[A-Za-z0-9-]+)"
)
_ELEMENTWISE_KEY = re.compile(
    r"elementwise/(?P<impl>[A-Za-z0-9_.-]+)/(?P<phase>[A-Za-z0-9_]+)/(?P<kind>[A-Za-z0-9_]+)-m(?P<m>\d+)-n(?P<n>\d+)"
    r"(?:-hkv(?P<kv_heads>\d+))?(?:-d(?P<head_dim>\d+))?(?:-c(?P<cache_len>\d+))?-(?P<dtype>[A-Za-z0-9_]+)"
)
_MOE_KEY = re.compile(
    r"moe/(?P<impl>[A-Za-z0-9_.-]+)/(?P<phase>[A-Za-z0-9_]+)/m(?P<m>\d+)-n(?P<n>\d+)-k(?P<k>\d+)"
    r"-e(?P<experts>\d+)-top(?P<top_k>\d+)-(?P<routing>[a-z]+(?:-\d+(?:\.\d+)?)?)-(?P<dtype>[A-Za-z0-9_]+)"
    r"(?:-(?P<scheme>[A-Za-z0-9][A-Za-z0-9-]*))?"
)
# (tag, field) of the dimensions an elementwise key carries after m and n, where the case has them
_ELEMENTWISE_DIMS = (("hkv", "kv_heads"), ("d", "head_dim"), ("c", "cache_len"))


def _word(field: str, value, pattern=_WORD) -> str:
    text = str(value)
    if not pattern.fullmatch(text):
        allowed = "letters, digits, '_', '-' or '.'" if pattern is _IMPL else "letters, digits or '_'"
        raise ValueError(f"{field}={value!r}: must be {allowed}, and not empty")
    return text


def case_key(impl, phase, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, causal) -> str:
    """The NVTX name of the timed region of one (case, impl), e.g. 'flash/prefill/b1-hq32-...-bfloat16-causal'."""
    ints = {}
    for field, value in zip(_INT_FIELDS, (batch, q_heads, kv_heads, q_len, kv_len, head_dim), strict=True):
        if isinstance(value, bool):
            raise ValueError(f"{field}={value!r}: must be a non-negative int")
        try:
            ints[field] = operator.index(value)
        except TypeError:
            raise ValueError(f"{field}={value!r}: must be a non-negative int") from None
        if ints[field] < 0:
            raise ValueError(f"{field}={value!r}: must be a non-negative int")
    dtype = str(dtype).removeprefix("torch.")  # accept a torch.dtype without importing torch
    key = "{}/{}/b{batch}-hq{q_heads}-hkv{kv_heads}-q{q_len}-k{kv_len}-d{head_dim}-{}".format(
        _word("impl", impl, _IMPL), _word("phase", phase), _word("dtype", dtype), **ints
    )
    return key + ("-causal" if causal else "")


def _cache_suffix(case) -> str:
    """'-t1125' for a ragged batch (the KV positions it uses: told apart from the dense case of its length),
    '-p16' for a paged cache and '-kvfp8' for an fp8 one."""
    seqlens = getattr(case, "seqlens", None)
    page = getattr(case, "page_size", 0)
    kv_dtype = getattr(case, "kv_dtype", "")
    return ((f"-t{sum(seqlens)}" if seqlens is not None else "") + (f"-p{int(page)}" if page else "")
            + (f"-kv{_word('kv_dtype', kv_dtype)}" if kv_dtype else ""))


def case_key_for(case, impl: str) -> str:
    """case_key() from an object with the AttentionCase fields (batch, ..., causal, dtype, phase), then the cache's
    suffix (_cache_suffix), a sliding window ('-w127') and sinks ('-sinks')."""
    key = case_key(
        impl, case.phase, case.batch, case.q_heads, case.kv_heads, case.q_len, case.kv_len,
        case.head_dim, case.dtype, case.causal,
    )
    window = getattr(case, "window_left", -1)
    return (key + _cache_suffix(case) + (f"-w{int(window)}" if window >= 0 else "")
            + ("-sinks" if getattr(case, "sinks", False) else ""))


def mla_key_for(case, impl: str) -> str:
    """The NVTX name of an MLA decode case: 'mla/<impl>/decode/b8-hq128-q1-k4096-d576-v512-bfloat16', then the
    cache's suffix."""
    dims = {}
    for field in ("batch", "q_heads", "q_len", "kv_len", "head_dim", "head_dim_v"):
        value = getattr(case, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r}: must be a positive int")
        dims[field] = value
    return "mla/{}/{}/b{batch}-hq{q_heads}-q{q_len}-k{kv_len}-d{head_dim}-v{head_dim_v}-{}".format(
        _word("impl", impl, _IMPL), _word("phase", case.phase), _word("dtype", case.dtype), **dims
    ) + _cache_suffix(case)


def linear_key_for(case, impl: str) -> str:
    """The NVTX name of a linear case: 'linear/<impl>/<phase>/m8-n28672-k4096-bfloat16'."""
    dims = {}
    for field in LINEAR_FIELDS:
        value = getattr(case, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r}: must be a positive int")
        dims[field] = value
    return "linear/{}/{}/m{m}-n{n}-k{k}-{}".format(
        _word("impl", impl, _IMPL), _word("phase", case.phase), _word("dtype", case.dtype), **dims)


def qlinear_key_for(case, impl: str) -> str:
    """The NVTX name of a quantized linear case: 'qlinear/<impl>/<phase>/m1-n28672-k4096-bfloat16-int4-g128'."""
    scheme = str(case.scheme)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", scheme):
        raise ValueError(f"scheme={case.scheme!r}: must be letters, digits or '-', and not empty")
    return f"q{linear_key_for(case, impl)}-{scheme}"


def moe_key_for(case, impl: str) -> str:
    """The NVTX name of a routed-experts case: 'moe/<impl>/<phase>/m8-n768-k2048-e128-top8-uniform-bfloat16', its
    experts' scheme after the dtype where they are packed ('...-bfloat16-mxfp4')."""
    for field in ("experts", "top_k"):
        value = getattr(case, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r}: must be a positive int")
    routing = str(case.routing)
    if not re.fullmatch(r"[a-z]+(?:-\d+(?:\.\d+)?)?", routing):
        raise ValueError(f"routing={case.routing!r}: must be a name such as uniform or zipf-1.2")
    dense = linear_key_for(case, impl).removeprefix("linear/")
    head, _, dtype = dense.rpartition("-")
    scheme = str(getattr(case, "scheme", "") or "")
    if scheme and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", scheme):
        raise ValueError(f"scheme={case.scheme!r}: must be letters, digits or '-'")
    return f"moe/{head}-e{case.experts}-top{case.top_k}-{routing}-{dtype}{'-' + scheme if scheme else ''}"


def elementwise_key_for(case, impl: str) -> str:
    """The NVTX name of an elementwise case: 'elementwise/<impl>/<phase>/rmsnorm-m8-n4096-bfloat16', with
    '-hkv8', '-d128' and '-c4096' after n where the case has kv_heads, head_dim and cache_len."""
    dims = []
    for tag, field in (("m", "m"), ("n", "n"), *_ELEMENTWISE_DIMS):
        value, needed = getattr(case, field, 0), field in ("m", "n")
        if isinstance(value, bool) or not isinstance(value, int) or value < int(needed):
            raise ValueError(f"{field}={value!r}: must be a {'positive' if needed else 'non-negative'} int")
        if value or needed:
            dims.append(f"{tag}{value}")
    return "elementwise/{}/{}/{}-{}-{}".format(_word("impl", impl, _IMPL), _word("phase", case.phase),
                                               _word("kind", case.kind), "-".join(dims), _word("dtype", case.dtype))


def parse_case_key(name) -> dict | None:
    """The fields of a case key (ints as int, causal as bool), or None when `name` is not exactly one."""
    if not isinstance(name, str):
        return None
    out = dict.fromkeys(ALL_FIELDS)
    m = _KEY.fullmatch(name)
    if m is not None:
        out.update(m.groupdict(), op="attention")
        for field in _INT_FIELDS:
            out[field] = int(out[field])
        out["causal"] = out["causal"] is not None
        out["kv_tokens"] = int(out["kv_tokens"]) if out["kv_tokens"] else out["batch"] * out["kv_len"]
        out["page_size"] = int(out["page_size"] or 0)
        out["window_left"] = int(out["window_left"]) if out["window_left"] else -1
        out["sinks"] = out["sinks"] is not None
        out["kv_dtype"] = out["kv_dtype"] or ""
        return out
    m = _MLA_KEY.fullmatch(name)
    if m is not None:
        out.update(m.groupdict(), op="mla", kv_heads=1, causal=True)
        for field in ("batch", "q_heads", "q_len", "kv_len", "head_dim", "head_dim_v"):
            out[field] = int(out[field])
        out["kv_tokens"] = int(out["kv_tokens"]) if out["kv_tokens"] else out["batch"] * out["kv_len"]
        out["page_size"] = int(out["page_size"] or 0)
        out["kv_dtype"] = out["kv_dtype"] or ""
        return out
    m = _LINEAR_KEY.fullmatch(name)
    if m is not None:
        out.update(m.groupdict(), op="linear")
        for field in LINEAR_FIELDS:
            out[field] = int(out[field])
        return out
    m = _QLINEAR_KEY.fullmatch(name)
    if m is not None:
        out.update(m.groupdict(), op="qlinear")
        for field in LINEAR_FIELDS:
            out[field] = int(out[field])
        return out
    m = _MOE_KEY.fullmatch(name)
    if m is not None:
        out.update(m.groupdict(), op="moe")
        for field in (*LINEAR_FIELDS, "experts", "top_k"):
            out[field] = int(out[field])
        return out
    m = _ELEMENTWISE_KEY.fullmatch(name)
    if m is not None:
        out.update(m.groupdict(), op="elementwise")
        for field in ("m", "n", "kv_heads", "head_dim", "cache_len"):
            out[field] = int(out[field]) if out[field] is not None else None
        return out
    return None


def stage_name(stage: str, key: str) -> str:
    """The range name of `key` in a stage: 'setup: <key>', 'check: <key>', or the bare key for timing."""
    if stage == TIMING:
        return key
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: must be one of {', '.join(STAGES)}")
    return f"{stage}: {key}"


def stage_of(name) -> tuple[str, str] | None:
    """(stage, key) for a case range name ('timing' for the bare key), None when it names no case."""
    if not isinstance(name, str):
        return None
    stage, key = TIMING, name
    for prefix in (SETUP, CHECK):
        if name.startswith(prefix + ": "):
            stage, key = prefix, name[len(prefix) + 2:]
            break
    return (stage, key) if parse_case_key(key) is not None else None


def is_timed_case(name) -> bool:
    """True for a bare case key (the timed region), False for stage ranges and other names."""
    return parse_case_key(name) is not None
