"""The gate on sliding windows and sinks: the built-in impls pass on awkward shapes (a window past the sequence, its
edge inside a key block, Sq = 2, a ragged and a paged cache ending mid-page, heads not a power of two) in fp32 and
bf16; a window off by one and a dropped sink, registered here as plugins, come out incorrect; an impl that cannot
honour a window is a skip with the reason, in the sweep's row."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.sweep.measure import CaseState, gate
from phasebench.kernels import OPS, Unsupported, register
from phasebench.kernels.attention.naive import NAIVE
from phasebench.kernels.attention.request import validate

CPU = torch.device("cpu")


def _naive_with(window_shift: int = 0, drop_sink: bool = False):
    """Naive attention with one bug: the window moved by window_shift keys, or the sink left out."""
    def fn(q, k, v, *, causal, scale, cache_seqlens, block_table=None, window_left=-1, sinks=None):
        window = window_left + window_shift if window_left >= 0 else window_left
        req = validate(q, k, v, causal=causal, scale=scale, cache_seqlens=cache_seqlens, block_table=block_table,
                       window_left=window, sinks=None if drop_sink else sinks)
        return NAIVE.plan(req).run()
    return fn


BROKEN = {"window_off_by_one": _naive_with(window_shift=1), "window_one_short": _naive_with(window_shift=-1),
          "sink_ignored": _naive_with(drop_sink=True)}


@pytest.fixture(scope="module")
def broken():
    for name, fn in BROKEN.items():
        register("attention", name, fn, paged=True, window=True, sinks=True)
    yield list(BROKEN)
    for name in BROKEN:
        OPS["attention"].pop(name)


STATES: dict = {}  # one CaseState per case for every impl: its reference and baseline are built once


def verdict(case, impl):
    state = STATES.setdefault(case, CaseState(case, CPU))
    return gate(state, operator_of(case).prepare(case, state.inputs, impl), impl)


CASES = {
    # gpt-oss's window (127) over 300 keys: the edge at key 172, inside a 64-key block; 6 heads over 2 kv heads
    "decode": AttentionCase(2, 6, 2, 1, 300, 64, True, "bfloat16", window_left=127, sinks=True),
    "verify2-ragged": AttentionCase(3, 6, 2, 2, 200, 64, True, "bfloat16", seqlens=(200, 41, 2), window_left=37,
                                    sinks=True),
    "window-past-sequence": AttentionCase(1, 3, 1, 1, 90, 32, True, "float32", window_left=500, sinks=True),
    "prefill": AttentionCase(1, 3, 1, 97, 97, 64, True, "bfloat16", window_left=16, sinks=True),
    "paged-p16": AttentionCase(3, 4, 2, 1, 150, 64, True, "float32", seqlens=(150, 77, 5), page_size=16,
                               window_left=40, sinks=True),
}


# bf16 decode and prefill in the default tier (with fp32 of every shape on the kernels' own tests); the rest slow
PASSING = [pytest.param(name, impl, marks=[] if name in ("decode", "prefill") else [pytest.mark.slow])
           for name in CASES for impl in ("naive", "flash", "triton")]


@pytest.mark.parametrize("name, impl", PASSING)
def test_the_built_in_impls_pass(name, impl):
    found = verdict(CASES[name], impl)
    assert found.ok, f"{impl} failed the gate on {CASES[name].shape_label}: {found}"


@pytest.mark.parametrize("name", ["decode", pytest.param("verify2-ragged", marks=pytest.mark.slow), "prefill",
                                  pytest.param("paged-p16", marks=pytest.mark.slow)])
def test_a_window_off_by_one_and_a_dropped_sink_are_incorrect(broken, name):
    for impl in broken:
        found = verdict(CASES[name], impl)
        assert found.status == "incorrect", f"{impl} passed the gate on {CASES[name].shape_label}: {found}"
        assert found.error > found.limit


def test_a_window_an_impl_cannot_honour_is_a_skip_with_the_reason():
    register("attention", "no_window", lambda q, k, v, **kw: q.clone())
    try:
        case = CASES["decode"]
        state = CaseState(case, CPU)
        with pytest.raises(Unsupported, match="cannot honour a sliding window"):
            operator_of(case).prepare(case, state.inputs, "no_window")
    finally:
        OPS["attention"].pop("no_window")
