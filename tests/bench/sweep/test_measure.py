"""The measuring path's gate calls, each proven by a wrong plugin that the earlier gate recorded `ok`: a limit widened
by a broken impl, NaN against an overflowing baseline, no max subtraction hidden by a baseline with bf16 scores, a
kv_append whose timed calls skip rows, a kernel that leaves its last block to a recycled buffer; and the right
kernels, which pass in every dtype."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from phasebench.bench.instruments.gate import relative_error
from phasebench.bench.instruments.timing import TimerConfig
from phasebench.bench.ops import operators
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.elementwise.cases import ElementwiseCase
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.ops.mla.cases import MLACase
from phasebench.bench.ops.records import OPERATORS
from phasebench.bench.sweep import runner
from phasebench.bench.sweep.measure import case_seed
from phasebench.kernels import PlannedCall, attention, register
from phasebench.kernels.elementwise.eager import EAGER
from phasebench.kernels.registry import OPS

# the gate is what these tests are about: a warm-up call and two samples are all the timing they need
FAST = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=2, max_samples=2, flush_l2=False)
CPU = torch.device("cpu")
DTYPES = ("bfloat16", "float16", "float32")


@pytest.fixture
def plugins():
    added = []

    def add(op, name, fn):
        register(op, name, fn, devices=("cpu", "cuda"), dtypes=DTYPES)
        added.append((op, name))
    yield add
    for op, name in added:
        OPS[op].pop(name, None)


def rows_of(tmp_path, cases, impls, device=CPU) -> dict:
    df = runner.run(runner.RunConfig(cases, impls, device, tmp_path, suite="test", detect_contention=False,
                                     timer=FAST))
    return {r.impl: r for r in df.itertuples()}


def scaled(impl, factor: float):
    """A registered impl whose every output is `factor` times the right one (a scale bug)."""
    def plan(req):
        call = impl.plan(req)
        return PlannedCall(call.impl, call.backend, lambda: call.run() * factor)
    return dataclasses.replace(impl, plan=plan)


# ---- the baseline is independent of every registered impl ------------------------------------------------------


def broken_and_wrong(op, monkeypatch):
    """Break, by 3%, the impl (or library call) main's baseline was computed with; return its name, a case, and a
    plugin 2% off that the limit main widened from it let through."""
    if op == "attention":
        monkeypatch.setitem(OPS["attention"], "naive", scaled(OPS["attention"]["naive"], 1.03))
        return "naive", AttentionCase(2, 8, 2, 1, 1025, 64, True, "bfloat16"), \
            lambda q, k, v, *, causal, scale, cache_seqlens: attention(q, k, v, impl="flash", causal=causal) * 1.02
    if op == "linear":
        real = torch.nn.functional.linear
        monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: real(x, w, b) * 1.03)
        return "torch", LinearCase(m=3, n=97, k=1025, dtype="bfloat16", phase="decode"), \
            lambda x, w: (x.float() @ w.float().T * 1.02).to(x.dtype)
    monkeypatch.setitem(OPS["elementwise"], "torch", scaled(OPS["elementwise"]["torch"], 1.03))
    return "torch", ElementwiseCase("rmsnorm", 3, 4097, "bfloat16", "decode"), \
        lambda kind, x, w, *, eps: EAGER["rmsnorm"](x, w, eps=eps) * 1.02


@pytest.mark.parametrize("op", [pytest.param("attention", marks=pytest.mark.slow), "linear", "elementwise"])
def test_a_broken_impl_never_widens_the_limit(tmp_path, plugins, monkeypatch, op):
    broken, case, wrong = broken_and_wrong(op, monkeypatch)
    plugins(op, "two_percent_off", wrong)
    rows = rows_of(tmp_path, [case], [broken, "two_percent_off"])
    for impl in (broken, "two_percent_off"):
        r = rows[impl]
        assert r.status == "incorrect" and "above the bfloat16 limit" in r.reason, (impl, r.status, r.reason)
        assert 0.015 < r.max_rel_err < 0.05 and math.isnan(r.latency_ms)


# ---- a non-finite baseline never gives an infinite limit -------------------------------------------------------


def test_a_nan_kernel_is_incorrect_where_the_baseline_overflows(tmp_path, plugins, monkeypatch):
    linear = operators()["linear"]

    def huge(case, device, seed):
        """Inputs of about 200 (fine in fp16) whose products overflow fp16 (outputs of about 1e6)."""
        x = linear.make_inputs(case, device, seed)
        return dataclasses.replace(x, x=x.x * 200, w=x.w * (200 * case.k ** 0.5))

    monkeypatch.setitem(OPERATORS, "linear", dataclasses.replace(linear, make_inputs=huge))
    plugins("linear", "nan_out", lambda x, w: torch.full((x.shape[0], w.shape[0]), math.nan, dtype=x.dtype))
    plugins("linear", "zeros_out", lambda x, w: torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype))
    rows = rows_of(tmp_path, [LinearCase(m=3, n=97, k=1025, dtype="float16", phase="decode")],
                   ["nan_out", "zeros_out", "torch"])
    assert rows["nan_out"].status == "incorrect" and "NaN" in rows["nan_out"].reason, rows["nan_out"].reason
    assert rows["torch"].status == "incorrect" and "inf" in rows["torch"].reason  # the answer overflows fp16
    # a finite output against a baseline that overflowed cannot be judged: the row fails with the reason
    zeros = rows["zeros_out"]
    assert zeros.status == "failed" and "float16 baseline errs inf: not finite" in zeros.reason, zeros.reason
    assert all(math.isnan(r.latency_ms) for r in rows.values())


# ---- the stress call's baseline keeps fp32 scores --------------------------------------------------------------


def no_max_subtraction_in_dtype(q, k, v, *, causal, scale, cache_seqlens):
    """Softmax as exp(scores) / sum with scores, exp and sum in the input dtype, without the row maximum."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    weights = torch.exp(torch.matmul(q, k.transpose(-1, -2)) * scale)
    return torch.matmul(weights / weights.sum(-1, keepdim=True), v)


def test_a_bf16_kernel_without_max_subtraction_fails_on_large_logits_at_decode(tmp_path, plugins):
    # 49 keys: logits reach about 75, under exp's bf16 range, so nothing overflows; rounded to bf16 they move by up
    # to 0.25, which a baseline with bf16 scores (error 0.02 here, limit 0.04) forgave and an fp32-score one does not
    plugins("attention", "no_max", no_max_subtraction_in_dtype)
    case = AttentionCase(1, 8, 2, 1, 49, 128, True, "bfloat16")
    rows = rows_of(tmp_path, [case], ["naive", "flash", "no_max"])
    assert rows["naive"].status == "ok" and rows["flash"].status == "ok", (rows["naive"].reason, rows["flash"].reason)
    # on standard inputs its bf16 scores cost it about as much as the limit allows (0.85 of it here): the stress
    # call is what it cannot pass
    bad = rows["no_max"]
    assert bad.status == "incorrect" and 0.005 < bad.max_rel_err < 0.1, bad.reason  # wrong, and finite
    op = operators()["attention"]
    x = op.stress(case, op.make_inputs(case, CPU, case_seed(case)))  # the runner's inputs
    ref = op.reference(case, x, CPU)
    out = no_max_subtraction_in_dtype(x.q, x.k, x.v, causal=True, scale=128 ** -0.5, cache_seqlens=None)
    err, fp32_scores = relative_error(out, ref), op.baseline_error(case, x, ref)
    g = case.q_heads // case.kv_heads
    k, v = x.k.repeat_interleave(g, 1), x.v.repeat_interleave(g, 1)
    bf16_scores = relative_error(torch.softmax((x.q @ k.transpose(-1, -2)).float() * 128 ** -0.5, -1).to(v.dtype) @ v,
                                 ref)  # the old baseline: scores rounded to bf16 before an fp32 softmax
    assert 2 * fp32_scores < err < 2 * bf16_scores  # caught by the fp32-score limit, forgiven by the old one


# ---- the call after the samples rewrites what an in-place op writes ----------------------------------------------


def skips_last_rows_after_its_first_call():
    calls = []

    def kv_append(kind, cache_k, cache_v, k, v, positions):
        """Appends every row on its first call, all but the last two afterwards (a stale launch size)."""
        calls.append(1)
        rows = slice(None) if len(calls) == 1 else slice(0, -2)
        cache_k.index_copy_(0, positions[rows], k[rows])
        cache_v.index_copy_(0, positions[rows], v[rows])
        return cache_k, cache_v
    return kv_append


def test_a_kv_append_whose_timed_calls_skip_rows_is_incorrect(tmp_path, plugins):
    plugins("elementwise", "stale_append", skips_last_rows_after_its_first_call())
    case = ElementwiseCase("kv_append", 5, 2, "bfloat16", "decode", head_dim=80, cache_len=1025)
    rows = rows_of(tmp_path, [case], ["torch", "stale_append"])
    assert rows["torch"].status == "ok", rows["torch"].reason
    bad = rows["stale_append"]
    assert bad.status == "incorrect", bad.reason
    assert bad.reason.startswith("the call after the samples: output holds NaN"), bad.reason


# ---- no right answer lingers in recycled memory ----------------------------------------------------------------


def leaves_last_block_to_the_allocator(x, w):
    """Writes every 64-column block of the output but the last into a fresh torch.empty (which may hold the previous
    impl's answer: glibc hands a freed 32 KiB chunk back, CUDA's caching allocator a freed block)."""
    out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    out[:, :-64] = x @ w[:-64].T
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_kernel_that_skips_its_last_block_on_a_recycled_buffer_is_incorrect(tmp_path, plugins, device):
    # the previous impl's judged outputs are NaN-filled before they are freed, and the gate's calls allocate NaN: the
    # block the plugin never writes holds NaN, whichever block the allocator gives it
    plugins("linear", "skips_block", leaves_last_block_to_the_allocator)
    case = LinearCase(m=16, n=1024, k=257, dtype="bfloat16", phase="decode")  # a 32 KiB output
    rows = rows_of(tmp_path, [case], ["torch", "skips_block"], torch.device(device))
    assert rows["torch"].status == "ok", rows["torch"].reason
    bad = rows["skips_block"]
    assert bad.status == "incorrect" and "NaN" in bad.reason, (bad.status, bad.reason)


def right_twice_then_skips_its_last_block():
    calls = []

    def kernel(x, w):
        """Right on its first two calls (the gate's and the first timed one); afterwards it leaves its last 64
        columns unwritten in a fresh torch.empty, which the allocator fills with the block the previous call freed:
        its right answer."""
        calls.append(1)
        out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
        cols = w.shape[0] if len(calls) <= 2 else w.shape[0] - 64
        out[:, :cols] = x @ w[:cols].T
        return out
    return kernel


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_kernel_whose_timed_calls_skip_a_block_is_incorrect_though_its_buffer_holds_the_answer(tmp_path, plugins,
                                                                                                   device):
    # the old gate judged the last timed call, whose torch.empty got the previous call's right answer back: it passed.
    # The call after the samples allocates poisoned memory, so the block it never writes holds NaN.
    plugins("linear", "stale_tail", right_twice_then_skips_its_last_block())
    case = LinearCase(m=16, n=1024, k=257, dtype="bfloat16", phase="decode")  # a 32 KiB output
    bad = rows_of(tmp_path, [case], ["stale_tail"], torch.device(device))["stale_tail"]
    assert bad.status == "incorrect", (bad.status, bad.reason)
    assert bad.reason.startswith("the call after the samples: output holds NaN"), bad.reason
    assert math.isnan(bad.latency_ms)


# ---- what lies past a sequence's end holds NaN ---------------------------------------------------------------------


def reads_one_key_past_each_end(q, k, v, *, causal, scale, cache_seqlens):
    """Decode attention over keys [0, length] of each sequence, the last one (past its end) masked in the scores: its
    value still multiplies a probability of 0, which is right on a finite cache and NaN on NaN."""
    out, group = torch.empty_like(q), q.shape[1] // k.shape[1]
    for b, n in enumerate(cache_seqlens.tolist()):
        keys, values = (t[b, :, :n + 1].repeat_interleave(group, 0).float() for t in (k, v))
        scores = q[b].float() @ keys.transpose(-1, -2) * scale
        scores[..., n] = float("-inf")
        out[b] = (torch.softmax(scores, dim=-1) @ values).to(q.dtype)
    return out


def test_a_kernel_that_reads_one_key_past_each_end_is_incorrect(tmp_path, plugins):
    # the earlier gate left standard-normal keys past each length: masked, they changed nothing and the plugin passed
    plugins("attention", "one_past", reads_one_key_past_each_end)
    case = AttentionCase(3, 8, 2, 1, 64, 64, True, "bfloat16", seqlens=(37, 5, 60))
    rows = rows_of(tmp_path, [case], ["naive", "flash", "one_past"])
    assert rows["naive"].status == "ok" and rows["flash"].status == "ok", (rows["naive"].reason, rows["flash"].reason)
    bad = rows["one_past"]
    assert bad.status == "incorrect" and bad.reason == "output holds NaN or inf", (bad.status, bad.reason)
    x = operators()["attention"].make_inputs(case, CPU, case_seed(case))  # on a clean cache it is right
    out = reads_one_key_past_each_end(x.q, x.k, x.v, causal=True, scale=64 ** -0.5, cache_seqlens=x.cache_seqlens)
    assert relative_error(out, operators()["attention"].reference(case, x, CPU)) < 0.01


def test_the_builtin_kernels_pass_with_nan_past_each_end(tmp_path):
    lengths = (37, 5, 60)
    cases = [AttentionCase(3, 8, 2, 1, 64, 64, True, "bfloat16", seqlens=lengths, page_size=16),
             AttentionCase(3, 8, 2, 1, 64, 64, True, "bfloat16", seqlens=lengths, window_left=20, sinks=True),
             AttentionCase(3, 8, 2, 1, 64, 64, True, "bfloat16", seqlens=lengths, page_size=16, window_left=20,
                           sinks=True),
             MLACase(3, 16, 1, 64, "bfloat16", seqlens=lengths),
             MLACase(3, 16, 1, 64, "bfloat16", seqlens=lengths, page_size=16)]
    df = runner.run(runner.RunConfig(cases, ["naive", "flash", "triton", "torch"], CPU, tmp_path, suite="test",
                                     detect_contention=False, timer=FAST))
    ran = df[df.status != "skipped"]
    assert len(ran) >= 12 and (ran.status == "ok").all(), ran[["op", "impl", "shape", "status", "reason"]].to_string()


# ---- the kernels the timed loop runs are judged too ----------------------------------------------------------------


def right_only_under_deterministic_algorithms(x, w):
    """Right while torch's deterministic algorithms are on (the poisoned calls' mode), 2% off otherwise: an op whose
    deterministic kernel differs from the one the timed loop runs."""
    out = torch.nn.functional.linear(x, w)
    return out if torch.are_deterministic_algorithms_enabled() else out * 1.02


def test_a_kernel_wrong_outside_the_deterministic_mode_is_incorrect(tmp_path, plugins):
    # every call the earlier gate judged ran under use_deterministic_algorithms (the allocation poison's switch)
    plugins("linear", "det_only", right_only_under_deterministic_algorithms)
    case = LinearCase(m=3, n=97, k=1025, dtype="bfloat16", phase="decode")
    rows = rows_of(tmp_path, [case], ["torch", "det_only"])
    assert rows["torch"].status == "ok", rows["torch"].reason
    bad = rows["det_only"]
    assert bad.status == "incorrect" and math.isnan(bad.latency_ms), (bad.status, bad.reason)
    assert bad.reason.startswith("the plain call after the samples (no deterministic algorithms): worst row"), \
        bad.reason
    assert not torch.are_deterministic_algorithms_enabled()  # the mode was the judged calls' only


# ---- the right kernels pass ------------------------------------------------------------------------------------


RIGHT_CASES = [
    lambda dt: AttentionCase(2, 8, 2, 1, 1025, 64, True, dt),
    lambda dt: AttentionCase(1, 4, 4, 97, 97, 80, True, dt),
    lambda dt: AttentionCase(1, 8, 2, 16, 529, 64, True, dt),
    lambda dt: AttentionCase(3, 4, 1, 1, 300, 64, True, dt, seqlens=(300, 17, 1)),
    lambda dt: LinearCase(m=3, n=97, k=1025, dtype=dt, phase="decode"),
    lambda dt: LinearCase(m=97, n=80, k=257, dtype=dt, phase="prefill"),
    lambda dt: ElementwiseCase("rmsnorm", 3, 4097, dt, "decode"),
    lambda dt: ElementwiseCase("residual_add", 5, 1000, dt, "decode"),
    lambda dt: ElementwiseCase("silu_mul", 3, 200, dt, "decode"),
    lambda dt: ElementwiseCase("rotary", 97, 6, dt, "chunked_prefill", head_dim=80, kv_heads=2, cache_len=1025),
    lambda dt: ElementwiseCase("kv_append", 3, 2, dt, "decode", head_dim=80, cache_len=1025),
    lambda dt: ElementwiseCase("greedy_pick", 3, 4097, dt, "decode"),
    lambda dt: ElementwiseCase("add_rmsnorm", 3, 4097, dt, "decode"),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_right_kernels_pass_in_every_dtype(tmp_path, dtype):
    cases = [make(dtype) for make in RIGHT_CASES]
    df = runner.run(runner.RunConfig(cases, ["naive", "flash", "triton", "torch"], CPU, tmp_path, suite="test",
                                     detect_contention=False, timer=FAST))
    ran = df[df.status != "skipped"]
    assert (ran.status == "ok").all(), ran[["op", "impl", "shape", "status", "reason"]].to_string()
    expected = {("attention", "naive"), ("attention", "flash"), ("attention", "triton"), ("linear", "naive"),
                ("linear", "torch"), ("linear", "triton"), ("elementwise", "torch")}
    assert set(zip(ran.op, ran.impl, strict=True)) == expected


def test_an_interpreter_rows_one_timed_call_is_the_gates_own_and_a_later_round_skips_the_gate(monkeypatch):
    """Triton's interpreter takes seconds a call and its time is not speed: its row times the gate's first call (one
    sample, judged there) and makes no other call of the case; a compiled row in a later round of a run makes no gate
    call: its warm-up, timed and checked calls are all it runs."""
    from phasebench.bench.instruments.roofline import Ceilings
    from phasebench.bench.sweep import measure as measure_mod

    case = AttentionCase(1, 2, 1, 1, 37, 16, True, "float32")
    calls = {"standard": 0}
    record = operators()["attention"]
    prepare = record.prepare

    def counted(case_, inputs, impl):
        planned = prepare(case_, inputs, impl)
        if inputs is state.standard.inputs:
            return dataclasses.replace(planned, run=lambda: (calls.__setitem__("standard", calls["standard"] + 1),
                                                             planned.run())[1])
        return planned

    monkeypatch.setitem(OPERATORS, "attention", dataclasses.replace(record, prepare=counted))
    state = measure_mod.CaseState(case, torch.device("cpu"))
    ceil = Ceilings("host", "cpu", 20.0, {"float32": 0.2}, read_gbps=30.0, write_gbps=15.0)
    sampler = measure_mod.HarnessSampler(FAST, "cpu")
    row = measure_mod.measure(state, "triton", measure_mod.base_row(case, "triton", "r", "s", ceil, "t"), sampler)
    assert row["status"] == "ok" and row["mode"] == "interpreter" and calls["standard"] == 1
    assert row["samples"] == 1 and row["stop_reason"] == "fixed count" and row["roof_verdict"] == ""
    calls["standard"] = 0
    again = {**measure_mod.base_row(case, "naive", "r", "s", ceil, "t"), "_again": True}
    row = measure_mod.measure(state, "naive", again, sampler)
    assert row["status"] == "ok" and "_again" not in row and math.isfinite(row["max_rel_err"])
    # the warm-up, the samples (a later round's fewest: LATER_ROUND_SAMPLES) and the checked call: no gate call, and no
    # plain call (the first round's judged the kernels this code takes outside deterministic mode)
    later = min(FAST.min_samples, measure_mod.LATER_ROUND_SAMPLES)
    assert calls["standard"] == FAST.warmup_calls + later + 1
