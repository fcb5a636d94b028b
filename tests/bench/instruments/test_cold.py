"""Cold host operands: the copies or eviction a case is timed with, and the cache state each plan records."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from phasebench.bench.instruments import cold
from phasebench.bench.instruments.memory.host_cache import COLD_FACTOR
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.sweep.measure import CaseState
from phasebench.bench.sweep.suites import suite_cases

CPU = torch.device("cpu")


@pytest.fixture
def small_llc(monkeypatch):
    """A 1 MiB last-level cache, so that cases of a few MiB need a handful of copies."""
    monkeypatch.setattr(cold, "cold_bytes", lambda: 2 << 20)
    monkeypatch.setattr(cold, "last_level_cache", lambda: (1 << 20, "test"))


def test_a_linear_case_rotates_over_copies_of_its_weights_and_shares_its_activations(small_llc):
    case = LinearCase(m=3, n=251, k=1025, dtype="float32", phase="decode")  # w: 1.0 MB
    state = CaseState(case, CPU)
    call = state.op.prepare(case, state.inputs, "torch")
    timed = cold.plan(state, "torch", call, cold=True, mode="compiled")
    weight = state.inputs.w.numel() * 4
    assert len(timed.calls) == cold.copies_needed(weight, 2 << 20) >= 3 and timed.evict is None
    copies = state.cold_copies(("w",), len(timed.calls))
    assert all(c.x is state.inputs.x for c in copies)  # the activations stay the one warm tensor
    assert len({c.w.data_ptr() for c in copies} | {state.inputs.w.data_ptr()}) == len(timed.calls)
    assert all(torch.equal(c.w, state.inputs.w) for c in copies)
    assert (len(timed.calls) - 1) * weight >= 2 << 20  # what streams between two reads of one copy
    outs = [fn() for fn in timed.calls]
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert "w rotated over" in timed.how and timed.state == "rotated"


def test_a_window_rotates_over_the_keys_its_calls_read_not_the_whole_cache(small_llc):
    # 3000 keys of 2 x 2 heads x 64 fp32: 6.1 MB of K/V, of which a decode step in a window of 127 reads 128 keys
    case = AttentionCase(1, 4, 2, 1, 3000, 64, True, "float32", window_left=127)
    state = CaseState(case, CPU)
    whole = state.inputs.k.nbytes + state.inputs.v.nbytes
    read = cold.streamed_read_bytes(state.op, case, [state.inputs.k, state.inputs.v])
    assert read == 2 * 2 * 128 * 64 * 4 < whole / 20  # the window's K/V (q is not rotated: it is not counted)
    timed = cold.plan(state, "naive", state.op.prepare(case, state.inputs, "naive"), cold=True, mode="compiled")
    assert len(timed.calls) == cold.copies_needed(read, 2 << 20) > cold.copies_needed(whole, 2 << 20)
    full = dataclasses.replace(case, window_left=-1)  # without the window every key is read: its size counts
    assert cold.streamed_read_bytes(state.op, full, [state.inputs.k, state.inputs.v]) == whole


def test_a_window_chunk_counts_the_keys_and_values_it_streams_not_its_query():
    """gpt-oss-20b's window layer, a 512-token chunk behind 16k cached keys (the sink-prefill suite): a call reads
    1.25 MiB of K/V (639 keys of the window) beside 4 MiB of q. Counted together, 14 copies sat in rotation, 17.5 MiB
    of K/V inside a 32 MiB LLC, and the row was called cold; counting K/V alone, 2 x the LLC between two reads of one
    copy takes 53 copies, past MAX_COPIES: the row is evicted instead."""
    llc = 32 << 20
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cold, "cold_bytes", lambda: COLD_FACTOR * llc)
        patch.setattr(cold, "last_level_cache", lambda: (llc, "test"))
        case = next(c for c in suite_cases("sink-prefill", "cuda", "bfloat16")
                    if c.model == "gpt-oss-20b" and c.windowed and c.q_len == 512 and c.kv_len == 16 * 1024 + 512)
        state = CaseState(case, CPU)
        kv = 2 * case.kv_heads * (case.q_len + case.window_left) * case.head_dim * 2  # K and V of 639 keys, bf16
        assert cold.streamed_read_bytes(state.op, case, [state.inputs.k, state.inputs.v]) == kv
        timed = cold.plan(state, "naive", state.op.prepare(case, state.inputs, "naive"), cold=True, mode="compiled")
    rotated = (len(timed.calls) - 1) * kv if timed.state == "rotated" else math.inf
    assert rotated >= COLD_FACTOR * llc  # what streams between two reads of one copy: K/V bytes only
    assert timed.state == "evicted" and cold.copies_needed(kv, COLD_FACTOR * llc) > cold.MAX_COPIES


def test_small_streamed_operands_are_evicted_instead(small_llc):
    case = AttentionCase(1, 4, 2, 1, 17, 16, True, "float32")  # k/v: a few KB, past MAX_COPIES copies
    state = CaseState(case, CPU)
    call = state.op.prepare(case, state.inputs, "naive")
    timed = cold.plan(state, "naive", call, cold=True, mode="compiled")
    assert len(timed.calls) == 1 and timed.evict is not None and "read before each call" in timed.how
    assert timed.state == "evicted"
    timed.evict()


def test_a_mixture_is_charged_the_memory_its_copies_allocate_not_the_experts_it_reads(small_llc, monkeypatch):
    from phasebench.bench.ops.moe.cases import MoeCase
    case = MoeCase(2, 40, 96, 13, 2, "uniform", "float32", "decode")  # 2 tokens read at most 4 of 13 experts
    state = CaseState(case, CPU)
    experts = state.inputs.experts
    assert experts.nbytes < experts.clone_nbytes
    copy = experts.clone()
    assert copy.w_gate_up.nbytes + copy.w_down.nbytes == cold.clone_nbytes([experts])
    count = cold.copies_needed(experts.nbytes, 2 << 20)
    charged = (count - 1) * experts.clone_nbytes
    monkeypatch.setattr(cold, "free_bytes", lambda device: charged / cold.HEADROOM * 0.99)
    assert (count - 1) * experts.nbytes < charged * 0.99 and cold.rotation(experts.nbytes, CPU) == count
    assert cold.rotation(experts.nbytes, CPU, cold.clone_nbytes([experts])) == 0  # the real copies do not fit
    call = state.op.prepare(case, state.inputs, "naive")
    assert cold.plan(state, "naive", call, cold=True, mode="compiled").state == "evicted"


@pytest.mark.parametrize("why", ["warm", "interpreter", "streams nothing"])
def test_nothing_is_copied_where_nothing_needs_to_be_cold(small_llc, why):
    case = LinearCase(m=3, n=251, k=1025, dtype="float32", phase="decode")
    state = CaseState(case, CPU)
    if why == "streams nothing":
        state.op = dataclasses.replace(state.op, streamed=())
    call = state.op.prepare(case, state.inputs, "torch")
    timed = cold.plan(state, "torch", call, cold=why != "warm", mode="interpreter" if why == "interpreter" else
                      "compiled")
    assert timed.calls == (call.run,) and timed.evict is None and timed.how == "warm" and timed.state == "warm"


def test_a_gpu_plan_records_its_l2_flush():
    """What a GPU timer does to the caches is the plan's state too (a CPU case stands in for the device here)."""
    case = LinearCase(m=3, n=251, k=1025, dtype="float32", phase="decode")
    state = CaseState(case, CPU)
    state.device = torch.device("cuda")  # the plan reads only the device's type
    call = state.op.prepare(case, state.inputs, "torch")
    assert cold.plan(state, "torch", call, cold=False, mode="compiled", flush_l2=True).state == "flushed-l2"
    assert cold.plan(state, "torch", call, cold=True, mode="compiled", flush_l2=False).state == "warm"


def test_the_policy_names_what_is_cold():
    from phasebench.bench.instruments.timing import TimerConfig

    policy = cold.policy(CPU, TimerConfig(cold=True))
    assert policy["cold"] and policy["llc_bytes"] >= 1 << 20 and "linear w" in policy["rule"]
    assert not cold.policy(CPU, TimerConfig(cold=False))["cold"]
