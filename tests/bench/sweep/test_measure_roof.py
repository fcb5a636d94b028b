"""A row's roof on the measuring path: every operator's read and write bytes, its floor at the read, write and copy
ceilings against a hand formula, its % of roof, and the fallback for an operator without the split."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from phasebench.bench.instruments.roofline import Ceilings
from phasebench.bench.instruments.timing import TimerConfig
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.elementwise.cases import ElementwiseCase
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.sweep import measure as measure_mod
from phasebench.bench.sweep.measure import base_row, speed_figures

E = {"float32": 4, "float16": 2, "bfloat16": 2}
# Two machines: one whose copy moves a read-and-write pair faster than a read plus a write (the host: read
# 34.6, fill 17.7, copy 28.1 GB/s), one whose copy is slower than the two apart.
COPY_FASTER = dict(read_gbps=34.6, write_gbps=17.7, peak_gbps=28.1)
COPY_SLOWER = dict(read_gbps=41.3, write_gbps=29.9, peak_gbps=19.7)


def pages(length: int, size: int) -> int:
    return -(-length // size)


# (case, bytes read, bytes written), each by hand from the shapes: q read and o written ([B, Hq, Sq, D]), K and V
# read by kv heads and by the keys each sequence uses, 4 bytes per block-table entry of a paged cache; x and w read
# and y written; each elementwise kind's inputs read and outputs written, int64 positions read, int64 ids written.
HAND = [
    ("gqa decode", AttentionCase(3, 12, 4, 1, 1025, 80, True, "bfloat16"),
     2 * (3 * 12 * 1 * 80 + 2 * 3 * 4 * 1025 * 80), 2 * 3 * 12 * 80),
    ("causal chunk", AttentionCase(2, 6, 2, 97, 1031, 72, True, "float32"),
     4 * (2 * 6 * 97 * 72 + 2 * 2 * 2 * 1031 * 72), 4 * 2 * 6 * 97 * 72),
    ("mha prefill", AttentionCase(1, 5, 5, 333, 333, 48, True, "float16"),
     2 * (5 * 333 * 48 + 2 * 5 * 333 * 48), 2 * 5 * 333 * 48),
    ("paged ragged decode", AttentionCase(3, 8, 2, 1, 1000, 64, True, "bfloat16", seqlens=(97, 1000, 3), page_size=16),
     2 * (3 * 8 * 64 + 2 * 2 * (97 + 1000 + 3) * 64) + 4 * (pages(97, 16) + pages(1000, 16) + pages(3, 16)),
     2 * 3 * 8 * 64),
    ("gemv", LinearCase(7, 4099, 1031, "bfloat16", "decode"), 2 * (7 * 1031 + 4099 * 1031), 2 * 7 * 4099),
    ("gemm", LinearCase(513, 257, 1029, "float32", "prefill"), 4 * (513 * 1029 + 257 * 1029), 4 * 513 * 257),
    ("rmsnorm", ElementwiseCase("rmsnorm", 3, 4097, "bfloat16", "decode"), 2 * (3 * 4097 + 4097), 2 * 3 * 4097),
    ("residual_add", ElementwiseCase("residual_add", 37, 1001, "float32", "prefill"), 4 * 2 * 37 * 1001,
     4 * 37 * 1001),
    ("silu_mul", ElementwiseCase("silu_mul", 5, 2731, "float16", "decode"), 2 * 2 * 5 * 2731, 2 * 5 * 2731),
    ("rotary", ElementwiseCase("rotary", 97, 12, "bfloat16", "prefill", head_dim=80, kv_heads=4, cache_len=200),
     2 * 97 * (12 + 4) * 80 + 8 * 97, 2 * 97 * (12 + 4) * 80),
    ("kv_append", ElementwiseCase("kv_append", 3, 2, "float32", "decode", head_dim=72, cache_len=1031),
     4 * 2 * 3 * 2 * 72 + 8 * 3, 4 * 2 * 3 * 2 * 72),
    ("greedy_pick", ElementwiseCase("greedy_pick", 3, 32003, "bfloat16", "decode"), 2 * 3 * 32003, 8 * 3),
]


def ceilings(machine: dict, dtype: str, tflops: float = 0.731) -> Ceilings:
    return Ceilings(device="host", kind="cpu", peak_tflops={dtype: tflops}, **machine)


def hand_floor(r: float, w: float, machine: dict) -> float:
    """read/R + write/W, or the pairs at the copy's rate where that is faster (seconds)."""
    read, write, copy = (machine[k] * 1e9 for k in ("read_gbps", "write_gbps", "peak_gbps"))
    pairs = min(r, w)
    return min(r / read + w / write, 2 * pairs / copy + (r - pairs) / read + (w - pairs) / write)


@pytest.mark.parametrize("machine", [COPY_FASTER, COPY_SLOWER], ids=["copy-faster", "copy-slower"])
@pytest.mark.parametrize("name,case,read,written", HAND, ids=[h[0] for h in HAND])
def test_every_operators_floor_is_its_reads_and_writes_at_the_ceilings(name, case, read, written, machine):
    op = operator_of(case)
    assert op.moved_bytes(case) == (read, written) and op.min_bytes(case) == read + written
    ceil = ceilings(machine, case.dtype)
    row = base_row(case, "any", "run", "suite", ceil, "clock")
    assert (row["read_bytes"], row["write_bytes"], row["bytes"]) == (read, written, read + written)
    assert (row["read_gbps"], row["write_gbps"], row["peak_gbps"]) == tuple(
        machine[k] for k in ("read_gbps", "write_gbps", "peak_gbps"))
    floor, flops, peak = hand_floor(read, written, machine), op.flops(case), 0.731e12
    assert row["roof_model"] == "read+write"
    assert row["roof_tflops"] == pytest.approx(0.0 if flops == 0 else min(peak, flops / floor) / 1e12, rel=1e-12)
    assert row["bound"] == ("memory" if floor > flops / peak else "compute")
    latency_ms = 1e3 * max(floor, flops / peak) * 1.37  # a time 1.37x the roof's: 1/1.37 of it, whatever the op
    figures = speed_figures(row, latency_ms)
    assert figures["pct_roofline"] == pytest.approx(100 / 1.37, rel=1e-12)
    assert figures["gbps"] == pytest.approx((read + written) / (latency_ms / 1e3) / 1e9, rel=1e-12)


def test_a_copy_at_the_copy_ceiling_is_at_its_roof_never_above():
    """The pairs of a kv_append (a copy) count at the copy's rate where the fill writes slower than the copy: a copy
    that streams at the measured copy bandwidth sits at 100% of its roof, not at read + write apart (120% here)."""
    case = ElementwiseCase("kv_append", 128, 8, "float32", "prefill", head_dim=128, cache_len=4096)
    row = base_row(case, "torch", "run", "suite", ceilings(COPY_FASTER, "float32"), "clock")
    pairs = row["write_bytes"]  # positions are read too: a few more bytes read than written
    at_copy_rate_ms = 1e3 * (2 * pairs / 28.1e9 + (row["read_bytes"] - pairs) / 34.6e9)
    assert speed_figures(row, at_copy_rate_ms)["pct_roofline"] == pytest.approx(100.0, rel=1e-12)
    apart_ms = 1e3 * (row["read_bytes"] / 34.6e9 + row["write_bytes"] / 17.7e9)
    assert apart_ms > at_copy_rate_ms  # what the floor would have been with the fill's rate alone


@pytest.fixture
def no_split(monkeypatch):
    """The linear operator as a plugin would register it without a read/write split."""
    import phasebench.bench.sweep.measure as measure

    case = LinearCase(7, 4099, 1031, "bfloat16", "decode")
    stripped = replace(operator_of(case), moved_bytes=None)
    monkeypatch.setattr(measure, "operator_of", lambda c: stripped)
    return case


def test_without_the_split_all_bytes_go_at_the_copy_bandwidth(no_split):
    row = base_row(no_split, "torch", "r", "s", ceilings(COPY_FASTER, "bfloat16"), "clock")
    nbytes = 2 * (7 * 1031 + 4099 * 1031 + 7 * 4099)
    assert row["roof_model"] == "copy" and row["bytes"] == nbytes
    assert math.isnan(row["read_bytes"]) and math.isnan(row["write_bytes"])
    assert row["roof_tflops"] == pytest.approx(min(0.731, 2 * 7 * 4099 * 1031 / (nbytes / 28.1e9) / 1e12))
    latency_ms = 1e3 * nbytes / 28.1e9 * 2.0
    assert speed_figures(row, latency_ms)["pct_roofline"] == pytest.approx(50.0)


# Levels of the host in the issue (an EPYC slice, 2 x 1 MiB L2, a 32 MiB L3), with resident ceilings of its order.
CACHES = {"l2_bytes": 2 << 20, "llc_bytes": 32 << 20, "source": "test"}
LEVELS = {"l2": {"bytes": 2 << 20, "read_gbps": 151.0, "write_gbps": 97.0, "copy_gbps": 183.0},
          "llc": {"bytes": 32 << 20, "read_gbps": 118.0, "write_gbps": 61.0, "copy_gbps": 104.0}}


def host(machine=COPY_FASTER, dtype="float32") -> Ceilings:
    return replace(ceilings(machine, dtype), levels=LEVELS, caches=CACHES)


@pytest.mark.parametrize("m,state,level", [(8, "warm", "l2"), (64, "warm", "llc"), (1031, "warm", "memory"),
                                           (36, "rotated", "memory"), (36, "evicted", "memory")])
def test_the_roof_a_row_is_judged_against_follows_its_state(m, state, level):
    """residual_add rows of the issue's sample: warm ones that fit the L2 or the LLC take that level's ceilings, a
    larger one and every cold one memory's; the roof is the hand floor at those ceilings."""
    case = ElementwiseCase("residual_add", m, 4096, "float32", "decode")
    base = base_row(case, "torch", "run", "suite", host(), "clock")
    assert base["_levels"]["llc"] == {**{k: v for k, v in LEVELS["llc"].items() if k != "bytes"}, "level_note": ""}
    assert (base["l2_bytes"], base["llc_bytes"]) == (2 << 20, 32 << 20)
    row = measure_mod.with_state({k: v for k, v in base.items() if k != "_levels"}, state, LEVELS)
    assert row["cache_state"] == state and row["roof_level"] == level
    found = LEVELS.get(level, {"read_gbps": 34.6, "write_gbps": 17.7, "copy_gbps": 28.1})
    assert (row["level_read_gbps"] == found["read_gbps"]) == (level != "memory")
    at = dict(read_gbps=found["read_gbps"], write_gbps=found["write_gbps"], peak_gbps=found["copy_gbps"])
    roof_ms = 1e3 * hand_floor(row["read_bytes"], row["write_bytes"], at)
    assert speed_figures(row, roof_ms)["pct_roofline"] == pytest.approx(100.0, rel=1e-12)


def test_a_warm_row_judged_at_a_farther_levels_figure_says_which_and_its_levels_own():
    """The issue's host: the L2's own read (82.4 GB/s, measured on one pass a call) under the LLC's (118): a warm row
    in the L2 is judged at the LLC's read and its own write and copy, and its level_note says so (so does its finding
    above the roof); a row in the LLC, judged at the LLC's own, and a cold row have a blank note."""
    low = {**LEVELS, "l2": {**LEVELS["l2"], "read_gbps": 82.4}}
    ceil = replace(host(), levels=low)
    case = ElementwiseCase("residual_add", 8, 4096, "float32", "decode")  # 384 KiB: the L2
    base = base_row(case, "torch", "run", "suite", ceil, "clock")
    note = "read at the llc's 118.0 GB/s (the l2's own 82.4)"
    assert base["level_note"] == "" and base["_levels"]["l2"]["level_note"] == note
    plain = {k: v for k, v in base.items() if k != "_levels"}
    row = measure_mod.with_state(plain, "warm", base["_levels"])
    assert (row["roof_level"], row["level_read_gbps"], row["level_write_gbps"]) == ("l2", 118.0, 97.0)
    assert row["level_note"] == note
    above = measure_mod.judged({**row, **speed_figures(row, 1e3 * float(measure_mod.roof_of_row(row)[1]) / 1.2),
                                "mode": "compiled"})
    assert above["above_roof"] and f"({note})" in above["reason"]
    bigger = ElementwiseCase("residual_add", 64, 4096, "float32", "decode")  # 3 MiB: the LLC
    in_llc = measure_mod.with_state({k: v for k, v in base_row(bigger, "torch", "run", "suite", ceil, "clock").items()
                                     if k != "_levels"}, "warm", base["_levels"])
    assert in_llc["roof_level"] == "llc" and in_llc["level_note"] == ""
    assert measure_mod.with_state(plain, "rotated", base["_levels"])["level_note"] == ""
    assert measure_mod.with_state(row, "evicted", base["_levels"])["level_note"] == ""  # judged anew: no stale note


def test_a_level_without_measured_ceilings_leaves_a_warm_row_at_memory():
    case = ElementwiseCase("residual_add", 64, 4096, "float32", "decode")  # 3 MiB: past the L2, in the LLC
    row = measure_mod.with_state(base_row(case, "torch", "r", "s", host(), "clock"), "warm", {"l2": LEVELS["l2"]})
    assert row["roof_level"] == "memory" and math.isnan(row["level_read_gbps"])


def test_above_the_roof_starts_at_100_percent_and_the_finding_names_the_state():
    row = {"pct_roofline": 100.4, "bytes": 1.5 * 2**20, "roof_model": "read+write", "above_roof": False,
           "mode": "compiled", "reason": "", "l2_bytes": 2 << 20, "llc_bytes": 32 << 20}
    warm_l2 = measure_mod.judged({**row, "cache_state": "warm", "roof_level": "l2"})
    assert warm_l2["above_roof"] and warm_l2["reason"].startswith("above roof: 100% of its measured roof")
    assert "fit the 2 MiB L2" in warm_l2["reason"] and "resident there" in warm_l2["reason"]
    rotated = measure_mod.judged({**row, "cache_state": "rotated", "roof_level": "memory"})
    assert "rotated over copies" in rotated["reason"] and "ceiling measured low" in rotated["reason"]
    assert "2x the LLC read" in measure_mod.judged({**row, "cache_state": "evicted"})["reason"]
    assert "L2 flushed" in measure_mod.judged({**row, "cache_state": "flushed-l2"})["reason"]
    assert "(no interval)" in rotated["reason"]
    assert "may read from cache" in measure_mod.judged({**row, "cache_state": "warm", "roof_level": "memory"})[
        "reason"]
    below = measure_mod.judged({**row, "pct_roofline": 99.9, "cache_state": "warm"})
    assert not below["above_roof"] and below["reason"] == ""
    assert not measure_mod.judged({**row, "mode": "interpreter", "cache_state": "warm"})["above_roof"]
    cleared = measure_mod.judged({**warm_l2, "pct_roofline": 93.0})  # judged again against a higher ceiling
    assert not cleared["above_roof"] and cleared["reason"] == ""


@pytest.mark.parametrize("slow, said, verdict", [(1.02, "above beyond the noise", "above"),
                                                (1.07, "unresolved: its intervals", "unresolved")])
def test_a_finding_says_whether_its_interval_stands_above_the_roof_too(slow, said, verdict):
    """Judged at its own ceilings alone (no moments: pytest bench, a row as measure() returns it), a row's % of roof
    spans its own interval: above when even the slow end is, unresolved when only the median is."""
    row = {"pct_roofline": 106.0, "bytes": 9 * 2**20, "roof_model": "read+write", "above_roof": False,
           "mode": "compiled", "reason": "", "cache_state": "rotated", "roof_level": "memory",
           "latency_ms": 0.5, "latency_ci_low_ms": 0.49, "latency_ci_high_ms": 0.5 * slow}
    found = measure_mod.judged(row)
    assert found["above_roof"] and said in found["reason"] and found["roof_verdict"] == verdict
    assert found["pct_roof_low"] == pytest.approx(106 / slow) and found["pct_roof_high"] == pytest.approx(106 / 0.98)
    assert f"{106 / slow:.0f}-{106 / 0.98:.0f}% over its intervals and moments" in found["reason"]
    below = measure_mod.judged({**row, "pct_roofline": 90.0})
    assert not below["above_roof"] and below["roof_verdict"] == "within"
    interpreter = measure_mod.judged({**row, "mode": "interpreter"})
    assert interpreter["roof_verdict"] == "" and not interpreter["above_roof"]


def test_an_above_roof_finding_names_a_busy_ceiling():
    from types import SimpleNamespace

    from phasebench.bench.sweep.measure import roof_finding, with_ceiling_load

    row = {"pct_roofline": 187.3, "bytes": 64 << 20, "roof_model": "read+write", "above_roof": True,
           "cache_state": "rotated", "roof_level": "memory"}
    cold = roof_finding(row)
    busy = SimpleNamespace(warnings=["ceilings measured under load: other processes used 51% of the host CPU"])
    found = with_ceiling_load({**row, "reason": cold}, busy)
    assert found["reason"].startswith(cold) and "under load: other processes used 51%" in found["reason"]
    assert with_ceiling_load({**row, "reason": cold}, SimpleNamespace(warnings=[]))["reason"] == cold
    assert with_ceiling_load({**row, "above_roof": False, "reason": ""}, busy)["reason"] == ""


def test_an_elementwise_row_is_timed_warm_and_judged_at_the_level_it_fits():
    """The measuring path itself: an elementwise op streams nothing, so its row is warm, and its roof is the cache
    level its footprint fits (the figures depend on this host; the state and the level do not)."""
    case = ElementwiseCase("silu_mul", 9, 1031, "float32", "decode")  # 111 KB: the 2 MiB L2 of `host()`
    sampler = measure_mod.HarnessSampler(TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=3, max_samples=3,
                                                     flush_l2=False, cold=True), "cpu")
    base = base_row(case, "torch", "run", "suite", host(), sampler.label)
    row = measure_mod.measure(measure_mod.CaseState(case, torch.device("cpu")), "torch", dict(base), sampler)
    assert row["status"] == "ok" and (row["cache_state"], row["roof_level"]) == ("warm", "l2")
    assert "_levels" not in row and row["level_read_gbps"] == 151.0
    assert row["above_roof"] == (row["pct_roofline"] > 100.0)


def moment_of(ceil: Ceilings, name: str, at: float) -> dict:
    from phasebench.bench.instruments.ceiling_drift import moment

    return moment(ceil, name, at)


def test_a_stored_warm_row_is_judged_at_the_levels_of_its_moment():
    """A row as results.csv holds it (text), warm in the L2 and above the roof of the ceilings measured before the
    run; measured again after it, the L2 read 50% higher, and the row ran nearer that measurement: it is judged there,
    falls under its roof and loses its finding, its roof_moment names it, its drift is its roof's move; a probe between
    them measured no cache level, so it judges no warm row."""
    before = host()
    after = replace(before, levels={**LEVELS, "l2": {**LEVELS["l2"], "read_gbps": 226.5}})
    probe = {**moment_of(before, "round 2", 150.0), "levels": {}, "read_gbps": 1.0}
    moments = [moment_of(before, "before", 100.0), probe, moment_of(after, "after", 200.0)]
    case = ElementwiseCase("residual_add", 8, 4096, "float32", "decode")
    base = base_row(case, "torch", "run", "suite", before, "clock")
    row = measure_mod.with_state({k: v for k, v in base.items() if k != "_levels"}, "warm", base["_levels"])
    roof_ms = 1e3 * float(measure_mod.roof_of_row(row)[1])
    stored = measure_mod.judged({**row, **speed_figures(row, roof_ms / 1.1), "mode": "compiled",
                                 "latency_ci_low_ms": roof_ms / 1.12, "latency_ci_high_ms": roof_ms / 1.08})
    assert stored["above_roof"] and stored["pct_roofline"] == pytest.approx(110.0)
    text = {k: "" if isinstance(v, float) and math.isnan(v) else str(v) for k, v in stored.items()}
    span = (1, roof_ms / 1.1, roof_ms / 1.12, roof_ms / 1.08, 190.0)  # ran in round 2, near `after`
    again = measure_mod.judged_at_moments(text, [span], moments)
    assert again["level_read_gbps"] == pytest.approx(226.5) and again["level_write_gbps"] == 97.0
    assert again["roof_moment"].startswith("after ") and not again["above_roof"] and again["reason"] == ""
    assert again["pct_roofline"] < 100 and again["roof_verdict"] == "within"
    assert again["ceiling_drift_pct"] == pytest.approx(0.0)  # only `after` measured its level: one roof
    early = measure_mod.judged_at_moments(text, [(0, *span[1:4], 110.0)], moments)  # round 1: before and the probe
    assert early["roof_moment"].startswith("before ") and early["above_roof"] and early["roof_verdict"] == "above"


def test_a_stored_rows_level_note_follows_the_moment_it_is_judged_at():
    """Before the run the L2's own read (82.4) sat under the LLC's (118): the row was judged at the LLC's and said so;
    measured again after it, the L2 read 226.5: a row judged at that moment takes the L2's own, its note cleared; at a
    moment whose L2 still reads under the LLC's (90.1), the note names both."""
    before = replace(host(), levels={**LEVELS, "l2": {**LEVELS["l2"], "read_gbps": 82.4}})
    after = replace(before, levels={**LEVELS, "l2": {**LEVELS["l2"], "read_gbps": 226.5}})
    case = ElementwiseCase("residual_add", 8, 4096, "float32", "decode")
    base = base_row(case, "torch", "run", "suite", before, "clock")
    row = measure_mod.with_state({k: v for k, v in base.items() if k != "_levels"}, "warm", base["_levels"])
    latency = 1e3 * float(measure_mod.roof_of_row(row)[1]) / 0.9
    stored = measure_mod.judged({**row, **speed_figures(row, latency), "mode": "compiled"})
    assert stored["level_note"] and stored["level_read_gbps"] == 118.0
    text = {k: "" if isinstance(v, float) and math.isnan(v) else str(v) for k, v in stored.items()}
    span = (0, latency, latency * 0.99, latency * 1.01, 9.0)
    again = measure_mod.judged_at_moments(text, [span], [moment_of(before, "before", 0.0),
                                                         moment_of(after, "after", 10.0)])
    assert again["level_read_gbps"] == pytest.approx(226.5) and again["level_note"] == ""
    lower = replace(before, levels={**LEVELS, "l2": {**LEVELS["l2"], "read_gbps": 90.1}})  # still under the LLC's
    again = measure_mod.judged_at_moments(text, [span], [moment_of(before, "before", 0.0),
                                                         moment_of(lower, "after", 10.0)])
    assert again["level_read_gbps"] == 118.0
    assert again["level_note"] == "read at the llc's 118.0 GB/s (the l2's own 90.1)"


def test_a_compute_bound_row_of_two_dtypes_takes_the_matmul_ceilings_of_its_moment():
    """Naive attention multiplies in fp32 and bf16 (its peak the harmonic mean of the two): measured again after the
    run, the bf16 matmul reads 40% higher: a row that ran nearer that measurement takes both matmuls from it (never one
    from each), and its drift is its roof's move between the two measurements around it."""
    from phasebench.bench.spec.roof import compute_peak

    before = replace(host(), peak_tflops={"float32": 0.2, "bfloat16": 0.05})
    after = replace(before, peak_tflops={"float32": 0.2, "bfloat16": 0.07}, read_gbps=before.read_gbps * 1.2)
    moments = [moment_of(before, "before", 0.0), moment_of(after, "after", 10.0)]
    case = AttentionCase(1, 8, 8, 509, 509, 64, True, "bfloat16")
    base = base_row(case, "naive", "run", "suite", before, "clock")
    assert base["compute_dtype"] == "float32+bfloat16"
    assert base["peak_tflops"] == pytest.approx(compute_peak(before.peak_tflops, "float32+bfloat16"))
    row = measure_mod.with_state({k: v for k, v in base.items() if k != "_levels"}, "rotated", base["_levels"])
    assert row["bound"] == "compute"
    latency = 1e3 * float(measure_mod.roof_of_row(row)[1]) / 0.8
    stored = measure_mod.judged({**row, **speed_figures(row, latency), "mode": "compiled", "status": "ok",
                                 "latency_ci_low_ms": latency * 0.99, "latency_ci_high_ms": latency * 1.01})
    text = {k: "" if isinstance(v, float) and math.isnan(v) else str(v) for k, v in stored.items()}
    again = measure_mod.judged_at_moments(text, [(0, latency, latency * 0.99, latency * 1.01, 8.0)], moments)
    assert again["peak_tflops"] == pytest.approx(compute_peak(after.peak_tflops, "float32+bfloat16"))
    assert again["read_gbps"] == pytest.approx(after.read_gbps) and again["bound"] == "compute"
    peaks = [compute_peak(c.peak_tflops, "float32+bfloat16") for c in (before, after)]
    assert again["ceiling_drift_pct"] == pytest.approx(100 * (peaks[1] / peaks[0] - 1))
    assert again["pct_roofline"] < stored["pct_roofline"] and again["roof_moment"].startswith("after ")
    assert again["pct_roof_low"] < again["pct_roofline"] < again["pct_roof_high"]


def test_a_rows_compute_roof_is_the_ceiling_of_what_its_kernel_multiplies_in():
    from phasebench.bench.ops.qlinear.cases import QLinearCase

    # the host: bf16 matmuls emulated by oneDNN at 0.039 TF/s, fp32 at 0.26
    ceil = Ceilings(device="host", kind="cpu", peak_tflops={"float32": 0.263, "bfloat16": 0.0391}, **COPY_FASTER)
    down = QLinearCase(16, 2048, 5632, "int8", "bfloat16", "decode")
    attn = AttentionCase(1, 8, 2, 512, 512, 64, True, "bfloat16")
    gemm = LinearCase(512, 2048, 2048, "bfloat16", "prefill")
    pairs = [(down, "torch"), (down, "naive"), (attn, "naive"), (attn, "flash"), (gemm, "torch"), (gemm, "naive")]
    found = {(c.op, i): base_row(c, i, "r", "s", ceil, "clock") for c, i in pairs}
    held = {key: (row["compute_dtype"], row["peak_tflops"]) for key, row in found.items()}
    assert held[("qlinear", "torch")] == ("float32", 0.263)  # torch's host int8 kernel: fp32 FMAs on bf16 x
    assert held[("qlinear", "naive")] == ("bfloat16", 0.0391)  # dequantized to bf16, then F.linear in bf16
    assert held[("attention", "flash")] == ("bfloat16", 0.0391) and held[("linear", "torch")][0] == "bfloat16"
    assert held[("linear", "naive")] == ("float32", 0.263)  # products and sums upcast to fp32
    assert held[("attention", "naive")] == ("float32+bfloat16", pytest.approx(2 / (1 / 0.263 + 1 / 0.0391)))
    row = found[("qlinear", "torch")]
    assert row["roof_tflops"] == pytest.approx(min(0.263, row["flops"] / hand_floor(
        row["read_bytes"], row["write_bytes"], COPY_FASTER) / 1e12))
    # the run measures exactly the matmul ceilings its rows are held to
    assert measure_mod.ceiling_dtypes(pairs, "cpu") == ("bfloat16", "float32")
    assert measure_mod.ceiling_dtypes([(down, "torch")], "cpu") == ("float32",)
    assert measure_mod.ceiling_dtypes([(down, "torch")], "cuda") == ("float32",)  # int8 on CUDA: fp32 CUDA cores
    int4 = replace(down, scheme="int4-g128")
    assert measure_mod.ceiling_dtypes([(int4, "torch")], "cuda") == ("bfloat16",)  # tinygemm: bf16 tensor cores
    with pytest.raises(KeyError):
        base_row(down, "torch", "r", "s", ceilings(COPY_FASTER, "bfloat16"), "clock")  # never a guessed ceiling
