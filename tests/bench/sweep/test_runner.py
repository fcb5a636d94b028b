"""Runner resilience: failures become rows, the sweep goes on, a killed run resumes without losing rows."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
from phasebench.bench.instruments.memory import device_memory
from phasebench.bench.ops.attention import cost
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.records import operators
from phasebench.bench.sweep import measure as measure_mod
from phasebench.bench.sweep import runner
from phasebench.bench.sweep.results import COLUMNS, ResumeError, row_key
from phasebench.kernels import IMPLS, Impl, PlannedCall, Unsupported, available_impls
from phasebench.kernels.attention.naive import naive_attention

CASES = [AttentionCase(1, 4, 2, 16, 16, 32, True, "float32"), AttentionCase(2, 4, 1, 1, 40, 32, True, "float32")]
FLOAT32 = frozenset({torch.float32})


def fake(name, plan):
    return Impl(name=name, summary="test double", devices=frozenset({"cpu"}), dtypes=FLOAT32, plan=plan)


def raising_plan(req):
    def boom():
        raise RuntimeError("kernel exploded\nsecond line")
    return PlannedCall("raises", "fake", boom)


def wrong_plan(req):
    return PlannedCall("wrong", "fake", lambda: naive_attention(req) + 0.5)


def unsupported_plan(req):
    raise Unsupported("this fake serves nothing")


@pytest.fixture
def fakes(monkeypatch):
    for impl in (fake("raises", raising_plan), fake("wrong", wrong_plan), fake("unsupported", unsupported_plan)):
        monkeypatch.setitem(IMPLS, impl.name, impl)


def run(tmp_path, impls, cases=CASES, **kw):
    return runner.run(runner.RunConfig(cases, impls, torch.device("cpu"), tmp_path, suite="test", **kw))


def test_failures_become_rows_and_the_sweep_goes_on(tmp_path, fakes):
    df = run(tmp_path, ["raises", "wrong", "unsupported", "naive"])
    assert list(df.columns) == COLUMNS and len(df) == 8
    by = {(r.impl, r.phase): r for r in df.itertuples()}
    failed = by[("raises", "prefill")]
    assert failed.status == "failed" and failed.reason == "RuntimeError: kernel exploded"
    wrong = by[("wrong", "decode")]
    assert wrong.status == "incorrect" and wrong.max_rel_err > 0.01 and "above the float32 limit" in wrong.reason
    skipped = by[("unsupported", "prefill")]
    assert skipped.status == "skipped" and skipped.reason == "this fake serves nothing"
    for r in (failed, wrong, skipped):
        assert all(math.isnan(getattr(r, c)) for c in ("latency_ms", "tflops", "gbps", "pct_roofline"))
    ok = df[df.impl == "naive"]
    assert (ok.status == "ok").all() and (ok.tflops > 0).all() and (ok.samples >= 5).all()
    assert (ok.max_rel_err < 1e-5).all() and set(ok.backend) == {"torch-matmul"}
    assert (tmp_path / "results.parquet").exists() and (tmp_path / "run.json").exists()


def _raising_fit_check(op, impl_name):
    """The operator's fit check, raising for one impl as a broken memory query would."""
    def does_not_fit(case, impl, device, **kw):
        if impl == impl_name:
            raise RuntimeError("free memory unreadable\nsecond line")
        return op.does_not_fit(case, impl, device, **kw)
    return dataclasses.replace(op, does_not_fit=does_not_fit)


def test_an_exception_outside_the_kernel_call_costs_one_row(tmp_path, monkeypatch, fakes):
    attention_op = operators()["attention"]
    monkeypatch.setitem(operators(), "attention", _raising_fit_check(attention_op, "flash"))

    def oom_plan(req):
        def call():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return PlannedCall("oom", "fake", call)

    def lost_context():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(IMPLS, "oom", fake("oom", oom_plan))
    monkeypatch.setattr(torch.cuda, "empty_cache", lost_context)  # freeing the cache after the OOM raises too
    made = measure_mod.CaseState

    def case_state(case, device):  # building the second case's inputs raises, outside measure()
        if case == CASES[1]:
            raise MemoryError("cannot allocate the inputs")
        return made(case, device)

    monkeypatch.setattr(measure_mod, "CaseState", case_state)
    df = run(tmp_path, ["flash", "oom", "naive"], detect_contention=False)
    assert len(df) == 6 and len(pd.read_csv(tmp_path / "results.csv")) == 6
    by = {(r.impl, r.phase): r for r in df.itertuples()}
    assert by[("naive", "prefill")].status == "ok"
    fit = by[("flash", "prefill")]
    assert fit.status == "failed" and fit.reason == "RuntimeError: free memory unreadable"
    oom = by[("oom", "prefill")]
    assert oom.status == "failed" and oom.reason.startswith("out of memory: OutOfMemoryError: CUDA out of memory")
    assert "then freeing the cache: RuntimeError: CUDA error: an illegal memory access" in oom.reason
    decode = df[df.phase == "decode"]
    assert (decode.status == "failed").all() and (decode.reason == "MemoryError: cannot allocate the inputs").all()


def test_rows_carry_consistent_figures(tmp_path):
    df = run(tmp_path, ["naive", "flash"])
    r = df.iloc[0]
    assert r.flops / (r.latency_ms / 1e3) / 1e12 == pytest.approx(r.tflops)
    assert r.bytes / (r.latency_ms / 1e3) / 1e9 == pytest.approx(r.gbps)
    assert r.read_bytes + r.write_bytes == r.bytes and r.roof_model == "read+write"
    floor = min(r.read_bytes / (r.read_gbps * 1e9) + r.write_bytes / (r.write_gbps * 1e9),  # or pairs at the copy's
                2 * r.write_bytes / (r.peak_gbps * 1e9) + (r.read_bytes - r.write_bytes) / (r.read_gbps * 1e9))
    assert r.roof_tflops == pytest.approx(min(r.peak_tflops, r.flops / floor / 1e12))
    assert r.pct_roofline == pytest.approx(100 * r.tflops / r.roof_tflops)
    assert r.latency_p20_ms <= r.latency_ms <= r.latency_p80_ms
    assert set(df.bound) <= {"compute", "memory"} and set(df.phase) == {"prefill", "decode"}
    target = runner.CPU_TIMER.target
    for row in df.itertuples():  # every timed row has its interval, why sampling stopped, its halves and warm-up
        assert row.samples >= runner.CPU_TIMER.min_samples
        assert row.latency_ci_low_ms <= row.latency_ms <= row.latency_ci_high_ms
        assert row.latency_ci_rel == pytest.approx((row.latency_ci_high_ms - row.latency_ci_low_ms) / 2
                                                   / row.latency_ms)
        assert row.stop_reason in ("target", "time limit", "sample limit", "drifting") and 0 <= row.outliers
        assert bool(row.converged) == (row.stop_reason == "target") and bool(row.drifting) == (row.stop_reason ==
                                                                                               "drifting")
        assert row.latency_ci_rel <= target or not row.converged
        assert math.isfinite(row.first_half_ms) and math.isfinite(row.second_half_ms) and math.isfinite(row.warmup_s)
    sampling = json.loads((tmp_path / "run.json").read_text())["sampling"]
    assert sampling["target_rel_half_width"] == target and sampling["time_limit_s"] == runner.CPU_TIMER.budget_s
    assert sampling["min_warmup_s"] == runner.CPU_TIMER.warmup_s < sampling["max_warmup_s"]
    assert "drifting" in sampling["stop_reasons"] and "halves" in sampling


def test_an_interpreter_row_is_one_call_without_warm_up():
    calls = []
    sampler = measure_mod.HarnessSampler(runner.CPU_TIMER, "cpu")
    timing = sampler([lambda: calls.append(1) or len(calls)], torch.device("cpu"), range_name=None, payload=0.0,
                     interpreter=True)
    assert calls == [1] and timing.count == 1 and timing.last is None  # nothing asked for a checked call
    assert math.isnan(timing.interval.low) and not timing.converged and timing.stop_reason == "fixed count"
    assert timing.warmup.calls == 0 and timing.warmup.steady is None  # no warm-up: nothing to look at
    checked = sampler([lambda: calls.append(1) or len(calls)], torch.device("cpu"), range_name=None, payload=0.0,
                      interpreter=True, guard_last=contextlib.nullcontext)
    assert calls == [1, 1, 1] and checked.count == 1 and checked.last == 3  # one sample, then the checked call


def test_cases_that_do_not_fit_are_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(device_memory, "free_bytes", lambda device: 1000)
    df = run(tmp_path, ["naive"])
    assert (df.status == "skipped").all() and df.reason.str.contains("needs about").all()


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import torch
    from phasebench.kernels import IMPLS, PlannedCall, Impl
    from phasebench.kernels.attention.naive import naive_attention
    from phasebench.bench.sweep import runner
    from phasebench.bench.ops.attention.cases import AttentionCase

    die = sys.argv[2] == "die"
    def plan(req):
        def call():
            if die and req.q_len == 1:  # the second case: kill -9 in the middle of the sweep
                os.kill(os.getpid(), signal.SIGKILL)
            return naive_attention(req)
        return PlannedCall("flaky", "fake", call)
    IMPLS["flaky"] = Impl("flaky", "test double", frozenset({"cpu"}), frozenset({torch.float32}), plan)
    cases = [AttentionCase(1, 4, 2, 16, 16, 32, True, "float32"), AttentionCase(2, 4, 1, 1, 40, 32, True, "float32"),
             AttentionCase(1, 2, 2, 8, 24, 32, True, "float32")]
    runner.run(runner.RunConfig(cases, ["naive", "flaky"], torch.device("cpu"), Path(sys.argv[1]),
                                suite="test", resume=not die))
""")


def test_a_killed_run_resumes_without_losing_or_repeating_rows(tmp_path):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, str(script), str(out), "die"], capture_output=True, text=True)
    assert killed.returncode == -9
    before = pd.read_csv(out / "results.csv")
    assert len(before) == 3  # case 1 for both impls, case 2 for naive; flaky died on case 2
    run_id = __import__("json").loads((out / "run.json").read_text())["run_id"]
    resumed = subprocess.run([sys.executable, str(script), str(out), "resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = pd.read_parquet(out / "results.parquet")
    assert len(after) == 6 and (after.status == "ok").all()
    keys = after[["impl", "q_len", "kv_len", "batch"]].apply(tuple, axis=1)
    assert keys.is_unique
    assert before.time.tolist() == after.time.tolist()[:3]  # the rows measured before the kill are kept as they were
    assert set(after.run_id) == {run_id}
    meta = __import__("json").loads((out / "run.json").read_text())
    assert meta["finished"] and meta["run_id"] == run_id


def test_resume_with_other_measurement_options_is_refused(tmp_path):
    run(tmp_path, ["naive"], cases=CASES[:1], detect_contention=False)
    other = runner.TimerConfig(warmup_s=0.01, budget_s=0.05, min_samples=3, max_samples=10, flush_l2=False)
    with pytest.raises(ResumeError, match=r"resume: .* was measured with timer=.*use another --out"):
        run(tmp_path, ["naive"], cases=CASES[:1], resume=True, timer=other)


@pytest.mark.parametrize("other,named", [
    ({"cases": [AttentionCase(1, 4, 2, 16, 16, 32, True, "bfloat16")]}, "dtype"),
    ({"suite": "other"}, "suite"),
    ({"cases": [AttentionCase(1, 4, 2, 16, 16, 32, True, "float32", model="llama-3-8b")]}, "model"),
])
def test_one_folder_holds_one_sweep(tmp_path, other, named):
    runner.run(runner.RunConfig(CASES[:1], ["naive"], torch.device("cpu"), tmp_path, suite="test",
                                detect_contention=False))
    cfg = {"cases": CASES[:1], "impls": ["naive"], "suite": "test", **other}
    with pytest.raises(ResumeError, match=rf"resume: .* holds a sweep of {named}.*another --out") as err:
        runner.run(runner.RunConfig(cfg["cases"], cfg["impls"], torch.device("cpu"), tmp_path, suite=cfg["suite"],
                                    resume=True, detect_contention=False))
    assert "\n" not in str(err.value)
    assert len(pd.read_csv(tmp_path / "results.csv")) == 1  # nothing of the other sweep was appended


def test_other_impls_of_the_same_cases_resume_and_the_sweep_keeps_them_all(tmp_path):
    run(tmp_path, ["naive", "flash"], cases=CASES[:1], detect_contention=False)
    again = run(tmp_path, ["flash"], cases=CASES[:1], resume=True, retry_failed=True, detect_contention=False)
    assert len(again) == 2
    import json

    assert json.loads((tmp_path / "run.json").read_text())["selection"]["impls"] == ["flash", "naive"]
    more = run(tmp_path, ["naive", "flash", "triton"], cases=CASES[:1], resume=True, detect_contention=False)
    assert sorted(more.impl) == ["flash", "naive", "triton"]


def test_a_row_above_its_measured_roof_is_a_finding(tmp_path, monkeypatch, capsys):
    state = {}

    def memoized(req):
        def call():  # computes once per query, then hands back a copy of the (right) output without reading K/V
            if id(req.q) not in state:
                state[id(req.q)] = naive_attention(req)
            return state[id(req.q)].clone()  # a copy: the gate NaN-fills each output it has judged
        return PlannedCall("memo", "fake", call)

    monkeypatch.setitem(IMPLS, "memo", fake("memo", memoized))
    case = AttentionCase(1, 8, 2, 1, 8192, 64, True, "float32")
    df = run(tmp_path, ["memo", "naive"], cases=[case], detect_contention=False)
    memo, naive = (df[df.impl == name].iloc[0] for name in ("memo", "naive"))
    assert memo.status == "ok" and memo.pct_roofline > 100 and memo.above_roof
    assert memo.reason.startswith("above roof: ") and f"{memo.pct_roofline:.0f}% of its measured roof" in memo.reason
    assert "timed cold" in memo.reason and memo.cache_state in ("rotated", "evicted")
    assert naive.above_roof == (naive.pct_roofline > 100)  # the flag follows the figure, nothing else
    from phasebench.bench.sweep.console import closing_lines, format_table

    assert "ABOVE ROOF" in format_table(df)
    assert any("stand above 100% of their measured roof" in line for line in closing_lines(df, tmp_path))


def test_resume_checks_the_csv_header(tmp_path):
    run(tmp_path, ["naive"], cases=CASES[:1], detect_contention=False)
    csv_path = tmp_path / "results.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([lines[0].replace(",noisy,", ",loud,")] + lines[1:]) + "\n")
    with pytest.raises(ResumeError, match="has other columns"):
        run(tmp_path, ["naive"], cases=CASES[:1], resume=True)


def flaky(state: dict) -> Impl:
    """A fake impl that raises while state["broken"], else is naive attention; each plan is logged in
    state["planned"] (its q_len), and with state["interrupt"] the plan of a decode case is a Ctrl-C."""
    def plan(req):
        state.setdefault("planned", []).append(req.q_len)
        if state.get("interrupt") and req.q_len == 1:
            raise KeyboardInterrupt

        def call():
            if state["broken"]:
                raise RuntimeError("transient")
            return naive_attention(req)
        return PlannedCall("flaky", "fake", call)
    return fake("flaky", plan)


def test_retry_failed_measures_failed_and_skipped_rows_again(tmp_path, monkeypatch):
    state = {"broken": True}
    monkeypatch.setitem(IMPLS, "flaky", flaky(state))
    first = run(tmp_path, ["naive", "flaky"], detect_contention=False)
    assert list(first.status) == ["ok", "failed", "ok", "failed"]
    state["broken"] = False
    kept = run(tmp_path, ["naive", "flaky"], resume=True, detect_contention=False)
    assert list(kept.status) == ["ok", "failed", "ok", "failed"]  # plain resume keeps what is there
    retried = run(tmp_path, ["naive", "flaky"], resume=True, retry_failed=True, detect_contention=False)
    assert sorted(retried.status) == ["ok"] * 4 and len(retried) == 4
    naive_times = first[first.impl == "naive"].time.tolist()
    assert retried[retried.impl == "naive"].time.tolist() == naive_times  # ok rows are not re-measured


def test_an_interrupted_retry_keeps_the_failed_rows_it_has_not_replaced(tmp_path, monkeypatch):
    state = {"broken": True}
    monkeypatch.setitem(IMPLS, "flaky", flaky(state))
    run(tmp_path, ["naive", "flaky"], detect_contention=False)
    state.update(broken=False, interrupt=True)  # Ctrl-C while the second failed row is retried
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, ["naive", "flaky"], resume=True, retry_failed=True, detect_contention=False)
    rows = pd.read_csv(tmp_path / "results.csv")
    assert len(rows) == 4 and rows[["impl", "q_len"]].apply(tuple, axis=1).is_unique
    retried = rows[rows.impl == "flaky"].set_index("q_len")
    assert retried.loc[16, "status"] == "ok"  # retried: its failed row replaced
    assert retried.loc[1, "status"] == "failed" and retried.loc[1, "reason"] == "RuntimeError: transient"  # kept
    state.update(interrupt=False, planned=[])
    done = run(tmp_path, ["naive", "flaky"], resume=True, retry_failed=True, detect_contention=False)
    assert len(done) == 4 and (done.status == "ok").all()
    assert set(state["planned"]) == {1}  # only the row still failed is measured again (its gate plans it twice)


def test_a_retry_the_time_budget_refuses_keeps_the_failed_row_and_its_reason(tmp_path, monkeypatch):
    state = {"broken": True}
    monkeypatch.setitem(IMPLS, "flaky", flaky(state))
    first = run(tmp_path, ["naive", "flaky"], detect_contention=False)
    state["broken"], planned = False, list(state["planned"])
    again = run(tmp_path, ["naive", "flaky"], resume=True, retry_failed=True, detect_contention=False,
                time_budget_s=0.0)  # no time for any row: nothing is measured
    pd.testing.assert_frame_equal(again, first)  # the failed rows stay, with their reasons
    assert state["planned"] == planned and (first.status == "failed").sum() == 2


def test_a_retry_killed_between_writing_a_row_and_dropping_the_failed_one_resumes_clean(tmp_path):
    from phasebench.bench.sweep.results import ResultsStore

    store = ResultsStore(tmp_path)
    base = {"op": "attention", "impl": "naive", "model": "", "device": "cpu", "mode": "compiled",
            "timer": "perf_counter_ns", **CASES[0].row_fields()}
    store.append({**base, "status": "failed", "reason": "transient"})
    store.append({**base, "status": "ok", "latency_ms": 1.5})  # the retry's row, its failed row not yet dropped
    again = ResultsStore(tmp_path, resume=True, retry_failed=True)
    rows = again.frame()
    assert rows.status.tolist() == ["ok"] and rows.latency_ms.tolist() == [1.5]
    assert again.is_done(base) and not again.retrying


def test_the_resume_key_holds_every_field_that_changes_a_measurement():
    row = {"op": "attention", "impl": "naive", "model": "", "batch": 1, "q_heads": 4, "kv_heads": 2, "q_len": 16,
           "kv_len": 16, "head_dim": 32, "causal": True, "dtype": "float32", "seqlens": "", "device": "cpu0",
           "mode": "compiled", "timer": "perf_counter_ns"}
    for field, other in (("device", "gpu"), ("dtype", "bfloat16"), ("mode", "interpreter"),
                         ("timer", "cuda-graph+events"), ("seqlens", "3,16"), ("op", "linear")):
        assert row_key(row) != row_key({**row, field: other}), field


def test_a_ragged_decode_batch_is_measured_with_its_own_lengths(tmp_path):
    ragged = AttentionCase(3, 4, 2, 1, 97, 32, True, "float32", seqlens=(97, 40, 5))
    df = run(tmp_path, ["naive", "flash"] + (["triton"] if "triton" in available_impls("cpu") else []),
             cases=[ragged], detect_contention=False)
    assert (df.status == "ok").all(), df[["impl", "reason"]]
    assert set(df.seqlens) == {"97,40,5"} and set(df.kv_tokens) == {142}
    assert df.backend.str.contains("per-seq|splitkv|matmul").all()
    dense = AttentionCase(3, 4, 2, 1, 97, 32, True, "float32")
    assert df.flops.iloc[0] == pytest.approx(cost.flops(dense) * 142 / (3 * 97))


def test_linear_cases_run_through_the_same_path_and_a_wrong_plugin_is_incorrect(tmp_path):
    from phasebench.bench.ops.linear.cases import LinearCase
    from phasebench.kernels import register
    from phasebench.kernels.registry import OPS

    def transposed_sum(x, w):  # a wrong GEMV: drops the last input feature
        return torch.nn.functional.linear(x[:, :-1], w[:, :-1])

    register("linear", "drops_k", transposed_sum)
    try:
        cases = [LinearCase(3, 97, 4095, "float32", "decode"), LinearCase(70, 130, 200, "bfloat16", "prefill")]
        impls = ["naive", "torch", "drops_k", "flash"] + (["triton"] if "triton" in available_impls("cpu", "linear")
                                                         else [])
        df = run(tmp_path, impls, cases=cases, detect_contention=False)
    finally:
        OPS["linear"].pop("drops_k", None)
    assert set(df.op) == {"linear"} and "flash" not in set(df.impl)  # flash has no linear implementation
    ok = df[df.impl != "drops_k"]
    assert (ok.status == "ok").all(), ok[["impl", "reason"]]
    assert (df[df.impl == "drops_k"].status == "incorrect").all()
    r = ok[(ok.impl == "torch") & (ok.m == 3)].iloc[0]
    assert r.flops == 2 * 3 * 97 * 4095 and r.bytes == 4 * (3 * 4095 + 97 * 4095 + 3 * 97)
    # a decode GEMV is memory-bound wherever its floor at the read, write and copy ceilings outlasts its FLOPs at the
    # matmul ceiling (a busy host's matmul ceiling can sink its ridge under the GEMV's 1.5 FLOP/B)
    from phasebench.bench.spec.roof import memory_floor_s

    floor = memory_floor_s(r.read_bytes, r.write_bytes, r.read_gbps, r.write_gbps, r.peak_gbps)
    assert r["shape"] == "m3 n97 k4095" and r.cache_state in ("rotated", "evicted") and r.roof_level == "memory"
    assert r.bound == ("memory" if floor > r.flops / (r.peak_tflops * 1e12) else "compute")


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 13])
def test_spread_order_is_a_permutation_whose_prefixes_span_the_sweep(n):
    order = runner.spread_order(n)
    assert sorted(order) == list(range(n)) and order[0] == 0
    if n >= 3:  # the first two already reach into the second half
        assert max(order[:2]) >= n // 2


def slow_plan(req):
    def call():
        import time

        time.sleep(0.15)
        return naive_attention(req)
    return PlannedCall("slow", "fake", call)


@pytest.mark.slow
def test_a_time_budget_skips_the_rows_that_would_overrun_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(IMPLS, "slow", fake("slow", slow_plan))
    from phasebench.bench.instruments.roofline import ceilings
    from phasebench.bench.sweep import worker

    measured = ceilings(torch.device("cpu"), ("float32",))
    monkeypatch.setattr(worker, "device_ceilings",  # the rows use the budget
                        lambda dtypes, refresh, before=None: measured if before is None else (None, "not again"))
    cases = [AttentionCase(1, 2, 1, 1, 16 + i, 16, True, "float32") for i in range(8)]
    timer = runner.TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=3, max_samples=3, flush_l2=False)
    df = run(tmp_path, ["slow"], cases=cases, timer=timer, time_budget_s=2.0)  # six 0.15 s calls a row
    assert len(df) == 8  # every row is recorded, measured or not
    ok, skipped = df[df.status == "ok"], df[df.status == "skipped"]
    assert 1 <= len(ok) < 8 and len(skipped) == 8 - len(ok)
    assert skipped.reason.str.startswith("time budget: ").all()
    assert skipped.reason.str.contains(r"of 2 s left, a slow row takes about \d\.\d s", regex=True).all()
    # measured in spread order: the first case, then one from the far half of the sweep
    assert set(ok.kv_len) >= {16, 20} if len(ok) >= 2 else set(ok.kv_len) == {16}
    # skipped rows run on resume with --retry-failed, within a new budget
    again = run(tmp_path, ["slow"], cases=cases, timer=timer, resume=True, retry_failed=True, time_budget_s=60)
    assert (again.status == "ok").all() and len(again) == 8


def test_default_timer_takes_a_sample_time_and_graphs():
    assert runner.default_timer(torch.device("cpu")) == runner.CPU_TIMER
    t = runner.default_timer(torch.device("cuda"), cuda_graph=True, sample_time=0.1)
    assert t.cuda_graph and t.budget_s == 0.1 and t.warmup_s == runner.CUDA_TIMER.warmup_s
    assert t.target == runner.CUDA_TIMER.target == 0.01 and runner.CPU_TIMER.target == 0.02
    short = runner.default_timer(torch.device("cpu"), sample_time=0.02, ci_target=0.05)
    assert short.target == 0.05 and short.budget_s == 0.02 and short.min_time_s == 0.02  # the limit caps the minimum


def test_a_row_is_expected_to_take_as_long_as_the_longest_of_its_impl():
    budget = runner.TimeBudget(10.0, runner.CPU_TIMER)
    assert budget.expected("any") == runner.CPU_TIMER.warmup_s + runner.CPU_TIMER.budget_s
    for impl, seconds in (("fast", 0.5), ("fast", 0.3), ("slow", 9.0), ("slow", 4.0)):
        budget.record(impl, seconds)
    # an impl's first row (its compile and autotuning) is left out
    assert budget.expected("fast") == 0.3 and budget.expected("slow") == 4.0
    assert budget.expected("new") == pytest.approx(2.25)  # the median row, before an impl has two
    budget.start -= 7.0  # about 3 s left
    assert budget.refusal("fast") is None
    assert budget.refusal("slow").startswith("time budget: 3.0 s of 10 s left, a slow row takes about 4.0 s")
    budget.record("one", 0.1)
    assert budget.expected("one") == pytest.approx(0.5)  # one row of its own: still the median of all


def _retrying(tmp_path, combine: bool):
    """A store of three noisy rows and the rounds of a sweep that measures them again (a fake measure_one)."""
    from types import SimpleNamespace

    from phasebench.bench.instruments.roofline import Ceilings
    from phasebench.bench.sweep.measure import base_row
    from phasebench.bench.sweep.results import ResultsStore, row_key
    from phasebench.bench.sweep.rounds import RoundBook, SweepRounds

    store = ResultsStore(tmp_path)
    cases = [AttentionCase(1, 2, 1, 1, 17 + i, 16, True, "float32") for i in range(3)]
    ceil = Ceilings("host", "cpu", 20.0, {"float32": 0.2}, read_gbps=30.0, write_gbps=15.0)
    base = [{**{k: v for k, v in base_row(c, "naive", "r", "s", ceil, "clock").items() if k != "_levels"},
             "samples_ms": [9.0] * 6} for c in cases]
    outcomes = {17: [False], 18: [True, True, True], 19: [True, False]}  # quiet on the 1st, never, on the 2nd retry
    calls = []

    def measure_one(case, impl, row):
        calls.append(case.kv_len)
        return {**row, "noisy": outcomes[case.kv_len].pop(0), "latency_ms": 1.0, "samples_ms": [1.0] * 6,
                "_at": 5.0}

    cfg = SimpleNamespace(combine_rounds=combine, on_row=None, rounds=2)
    restarts = []
    executor = SimpleNamespace(restart=lambda: restarts.append(1) or True)
    rounds = SweepRounds(cfg, executor, store, RoundBook([]), measure_one, None, SimpleNamespace(warnings=[]))
    for row in base:
        noisy = {**row, "noisy": True, "noise_reason": "busy", "latency_ms": 9.0}
        if combine:  # round 2 of each row was noisy; round 1 quiet at 9 ms
            rounds.book.add(row_key(row), {**row, "noisy": False, "latency_ms": 9.0}, 1.0, 0)
            store.append(rounds.book.add(row_key(row), noisy, 2.0, 1))
        else:
            store.append(noisy)
    rounds.noisy = [(c, "naive", b, 1 if combine else 0) for c, b in zip(cases, base, strict=True)]
    rounds.rounds_run = 2
    return rounds, store, calls, restarts


@pytest.mark.parametrize("combine", [False, True], ids=["appended", "combined"])
def test_noisy_rows_are_measured_again_and_a_quiet_one_replaces_its_noisy_round(tmp_path, combine):
    rounds, store, calls, restarts = _retrying(tmp_path, combine)
    counts = rounds.retry_noisy(2)
    assert counts == {"rounds": 2, "noisy": 3, "quiet_on_retry": 2}
    assert sorted(calls) == [17, 18, 18, 19, 19]  # a row that came out quiet is not measured again
    rows = store.frame().set_index("kv_len")
    assert len(rows) == 3 and rows.loc[18, "latency_ms"] == pytest.approx(9.0) and rows.loc[18, "noisy"]  # kept
    if not combine:
        assert rows.loc[[17, 19], "latency_ms"].tolist() == [1.0, 1.0] and not restarts
        return
    assert len(restarts) == 2  # each retry round in a fresh worker, as the rounds were
    assert rows.loc[17, "round_latencies_ms"] == "9/1r" and rows.loc[17, "rounds"] == 2  # its noisy round replaced
    assert not rows.loc[17, "noisy"] and rows.loc[18, "round_latencies_ms"] == "9/9"


@pytest.mark.slow
def test_rounds_repeat_every_row_between_calls_on_the_sweep_worker(tmp_path):
    import json
    import os

    from phasebench.bench.sweep.worker import Isolation

    events = []

    def between(executor, k):
        events.append(("between", k, executor.call(os.getpid, timeout=60)))

    def on_row(row, index, total):
        events.append(("row", index, total))

    cases = [AttentionCase(1, 2, 1, 1, 19, 16, True, "float32"), AttentionCase(1, 3, 3, 5, 5, 8, False, "float32")]
    df = run(tmp_path, ["naive"], cases=cases, rounds=3, between_rounds=between, on_row=on_row,
             isolation=Isolation(isolate=True))
    assert len(df) == 6 and (df["status"] == "ok").all()
    assert [e[:2] for e in events] == [("between", 0), ("row", 1), ("row", 2), ("between", 1), ("row", 3),
                                       ("row", 4), ("between", 2), ("row", 5), ("row", 6), ("between", 3)]
    pids = {e[2] for e in events if e[0] == "between"}
    assert len(pids) == 1 and pids != {os.getpid()}  # the rows' own worker, never this process
    assert {e[2] for e in events if e[0] == "row"} == {6}
    assert df["kv_len"].tolist() == [19, 5] * 3  # each round appends the plan again, in order
    assert json.loads((tmp_path / "run.json").read_text())["rounds"] == 3


@pytest.mark.parametrize("given, message", [(dict(rounds=0), "rounds: at least 1, got 0"),
                                            (dict(rounds=2, resume=True), "neither resume"),
                                            (dict(rounds=2, retry_noisy=1), "neither resume")])
def test_rounds_refuse_what_repeats_cannot_mean(tmp_path, given, message):
    with pytest.raises(ValueError, match=message):
        run(tmp_path, ["naive"], **given)
    assert not (tmp_path / "results.csv").exists()


def test_ceilings_measured_again_after_the_run_are_kept_and_each_row_judged_at_one_of_them(tmp_path, monkeypatch):
    """The ceilings after the sweep (faked: the read stream 1.6x, the write 0.8x the ones before) go to run.json beside
    the ones before; every row is judged again at the one measurement nearest it, never at the read of one and the
    write of the other, its drift the move of its roof, its verdict over both; the closing lines name what moved. A
    case of the issue's kind: a decode that reads at the read ceiling."""
    import json

    from phasebench.bench.instruments import ceiling_drift
    from phasebench.bench.sweep.console import closing_lines

    seen = {}

    def again(device, before):
        seen["before"] = before
        return dataclasses.replace(before, read_gbps=before.read_gbps * 1.6, write_gbps=before.write_gbps * 0.8,
                                   warnings=[], checked="faked"), "faked"

    monkeypatch.setattr(ceiling_drift, "measure_again", again)
    df = run(tmp_path, ["naive"], cases=CASES[1:], detect_contention=False)
    meta = json.loads((tmp_path / "run.json").read_text())
    before = seen["before"]
    assert meta["ceilings"]["read_gbps"] == before.read_gbps
    assert meta["ceilings_after"]["read_gbps"] == pytest.approx(1.6 * before.read_gbps)
    assert meta["ceiling_drift"]["read_gbps"] == pytest.approx(0.6, abs=1e-4) and meta["rows_judged_again"] == 1
    assert [m["name"] for m in meta["ceiling_moments"]] == ["before", "after"]
    row = df.iloc[0]
    scale = 1.6 if row.roof_moment.startswith("after") else 1.0
    assert row.roof_moment.split()[0] in ("before", "after")
    assert row.read_gbps == pytest.approx(scale * before.read_gbps)
    assert row.write_gbps == pytest.approx((0.8 if scale > 1 else 1.0) * before.write_gbps)  # the same moment's
    assert row.cache_state in ("rotated", "evicted") and row.bound == "memory"
    assert 20 < row.ceiling_drift_pct < 60  # its roof: reads at 1.6x, writes at 0.8x
    from phasebench.bench.spec.roof import pct_of_roof, roof_of_row

    assert row.pct_roofline == pytest.approx(float(pct_of_roof(roof_of_row(row.to_dict())[1], row.latency_ms)))
    assert row.above_roof == (row.pct_roofline > 100)
    assert row.pct_roof_low < row.pct_roofline < row.pct_roof_high
    assert row.roof_verdict == ("above" if row.pct_roof_low > 100 else "within" if row.pct_roof_high <= 100
                                else "unresolved")
    assert any("ceilings moved during the run (highest over lowest of 2 measurements: read_gbps 60%, write_gbps 25%"
               in line for line in closing_lines(df, tmp_path))


def test_a_run_measures_the_cache_levels_only_where_a_compiled_row_will_be_warm():
    from phasebench.bench.ops.elementwise.cases import ElementwiseCase

    attention = AttentionCase(1, 2, 1, 1, 19, 16, True, "float32")
    rmsnorm = ElementwiseCase("rmsnorm", 3, 97, "float32", "decode")
    cold = runner.CPU_TIMER
    assert not runner.judged_warm([(attention, ["naive", "triton"])], cold)  # streamed operands: cold rows
    assert runner.judged_warm([(rmsnorm, ["torch"])], cold)  # an elementwise op streams nothing: warm
    assert runner.judged_warm([(attention, ["naive"])], dataclasses.replace(cold, cold=False))  # --warm
    warm_triton = runner.judged_warm([(attention, ["triton"])], dataclasses.replace(cold, cold=False))
    assert warm_triton == (runner.impl_mode("triton") == "compiled")  # an interpreter's rows are judged at no roof


def test_the_store_puts_its_rows_back_in_the_plans_order(tmp_path):
    from phasebench.bench.sweep.results import ResultsStore, row_key

    store = ResultsStore(tmp_path)
    rows = [{"op": "attention", "impl": impl, "kv_len": kv, "status": "ok", "latency_ms": 1.0}
            for kv in (17, 33) for impl in ("naive", "flash")]
    for row in rows:
        store.append(row)
    store.replace({**rows[0], "latency_ms": 2.0})  # a later round: the row moves to the end
    assert store.frame()["impl"].tolist()[-1] == "naive"
    store.reorder([row_key(r) for r in rows])
    frame = store.frame()
    assert list(zip(frame["impl"], frame["kv_len"], strict=True)) == [("naive", 17), ("flash", 17), ("naive", 33),
                                                                      ("flash", 33)]
    assert frame["latency_ms"].tolist() == [2.0, 1.0, 1.0, 1.0]
