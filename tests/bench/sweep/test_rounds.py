"""A run's rounds: the order of each round, the rows of a (case, impl)'s rounds combined into one (pooled samples,
the rounds' medians and the interval of a repeat, the worst status), and a run in rounds end to end: one row per
(case, impl), each round after the first in a fresh worker after a probe of the ceilings."""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import replace

import pytest
import torch
from phasebench.bench.instruments.ceiling_drift import moment
from phasebench.bench.instruments.roofline import Ceilings
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.spec.between_runs import latencies_of, repeat_interval, run_figure, run_interval
from phasebench.bench.spec.roof import roof_of_row
from phasebench.bench.sweep import rounds as rounds_mod
from phasebench.bench.sweep.measure import base_row
from phasebench.bench.sweep.worker import Isolation

CASE = AttentionCase(1, 4, 2, 1, 97, 16, True, "float32")
CEIL = Ceilings("host", "cpu", 20.0, {"float32": 0.2}, read_gbps=30.0, write_gbps=15.0)


def round_row(samples, case=CASE, **extra) -> dict:
    row = {k: v for k, v in base_row(case, "naive", "r", "s", CEIL, "clock").items() if k != "_levels"}
    ordered = sorted(samples)
    return {**row, "status": "ok", "latency_ms": (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2,
            "samples_ms": list(samples), "converged": True, "time": "2026-12-07T09:00:00+00:00", **extra}


def test_the_first_round_keeps_the_plan_and_later_ones_shuffle_cases_and_impls_alike_for_one_run():
    plan = [(f"case{i}", ["naive", "flash", "torch"]) for i in range(6)]
    assert rounds_mod.round_order(plan, 0, "run-a") == plan
    second = rounds_mod.round_order(plan, 1, "run-a")
    assert sorted(c for c, _ in second) == sorted(c for c, _ in plan) and second != plan
    assert all(sorted(impls) == ["flash", "naive", "torch"] for _, impls in second)  # a case's impls stay together
    assert second == rounds_mod.round_order(plan, 1, "run-a")  # seeded by the run and the round
    assert rounds_mod.round_order(plan, 2, "run-a") != second


def test_each_round_counts_once_in_the_runs_figure_and_its_intervals():
    """Three rounds, the second with ten times the samples of the others: the run's figure is the geometric mean of
    the three medians (the heavy round does not make it), with the interval from the rounds' spread and the wider one
    a repeat lands in; the samples pool for the percentiles; noisy and not converged where one round was."""
    rows = [round_row([1.0, 1.1, 1.2, 1.05, 1.15, 1.12]),
            round_row([1.4, 1.5, 1.45, 1.41, 1.47, 1.52] * 10, noisy=True, noise_reason="busy host: x"),
            round_row([1.2, 1.25, 1.22, 1.3, 1.21, 1.27], converged=False)]
    out, used = rounds_mod.combine(rows)
    medians = [r["latency_ms"] for r in rows]
    assert used == [0, 1, 2] and out["latency_ms"] == pytest.approx(run_figure(medians))
    assert out["latency_ms"] < 1.3 < statistics.median(s for r in rows for s in r["samples_ms"])  # not the pooled one
    assert (out["latency_ci_low_ms"], out["latency_ci_high_ms"]) == pytest.approx(run_interval(medians))
    low, high = repeat_interval(medians, out["latency_ms"])
    assert (out["latency_between_low_ms"], out["latency_between_high_ms"]) == (pytest.approx(low), pytest.approx(high))
    assert out["latency_between_low_ms"] < out["latency_ci_low_ms"] < out["latency_ms"] < out["latency_ci_high_ms"]
    assert latencies_of(out["round_latencies_ms"]) == pytest.approx(medians, rel=1e-5) and out["rounds"] == 3
    assert out["samples"] == 72 and out["noisy"] and out["noise_reason"] == "busy host: x (round 2)"
    assert not out["converged"]  # one round stopped short of its target
    assert out["gbps"] == pytest.approx(out["bytes"] / (out["latency_ms"] / 1e3) / 1e9)


def test_rounds_that_ran_otherwise_are_not_pooled_and_a_retried_round_is_marked():
    rows = [round_row([1.0] * 6, backend="sdpa-flash"), round_row([2.0] * 6, backend="sdpa-math"),
            round_row([1.1] * 6, backend="sdpa-flash")]
    out, used = rounds_mod.combine(rows, [0, 1, 2], [False, False, True])
    assert used == [0, 2] and out["rounds"] == 2 and out["round_latencies_ms"] == "1//1.1r"
    assert rounds_mod.with_notes(out)["reason"].endswith("round 2 ran as sdpa-math: left out")
    assert out["latency_ms"] == pytest.approx((1.0 * 1.1) ** 0.5)


def test_a_compiled_rows_recompiles_are_summed_over_its_rounds_and_its_compile_is_the_first_rounds():
    rows = [round_row([1.0] * 6, compile_s=4.2, compile_cache="cold", recompiles=0),
            round_row([1.1] * 6, compile_s=0.3, compile_cache="disk", recompiles=2),
            round_row([1.2] * 6, compile_s=0.2, compile_cache="disk", recompiles=1)]
    out, _ = rounds_mod.combine(rows)
    assert out["recompiles"] == 3 and (out["compile_s"], out["compile_cache"]) == (4.2, "cold")
    plain, _ = rounds_mod.combine([round_row([1.0] * 6), round_row([1.1] * 6)])
    assert math.isnan(plain["recompiles"])  # an impl that compiles nothing keeps the blank


def test_a_wrong_output_in_any_round_makes_the_row_wrong_and_one_round_makes_no_interval():
    ok = round_row([1.0] * 6)
    wrong = {**ok, "status": "incorrect", "reason": "max_rel_err 0.3 > limit 1e-4"}
    out, _ = rounds_mod.combine([ok, ok, wrong])
    assert out["status"] == "incorrect" and out["reason"] == "round 3 of 3: max_rel_err 0.3 > limit 1e-4"
    one, _ = rounds_mod.combine([ok])
    assert one["rounds"] == 1 and math.isnan(one.get("latency_between_low_ms", math.nan))
    failed, _ = rounds_mod.combine([{**ok, "status": "failed", "reason": "boom"}])
    assert failed["rounds"] == 0 and failed["round_latencies_ms"] == ""


def test_the_published_pct_of_roof_lies_inside_what_the_verdict_reads():
    """Rounds of unequal weight at moments far apart (a read ceiling from 30 to 70 GB/s): whatever the rounds, the
    row's % of roof at its moment lies between pct_roof_low and pct_roof_high, and the flag and the verdict agree."""
    rng = random.Random(52)
    base = Ceilings("host", "cpu", 20.0, {"float32": 0.2}, read_gbps=61.0, write_gbps=30.0)
    big = AttentionCase(4, 32, 8, 1, 8192, 128, True, "float32")  # a decode of milliseconds, past any timer's step
    roof_ms = 1e3 * float(roof_of_row(round_row([1.0] * 6, big))[1])  # at 61 and 30 GB/s
    verdicts = set()
    for _ in range(200):
        found, speed = rounds_mod.RowRounds(), rng.uniform(0.3, 2.5)
        for k in range(3):
            latency = speed * rng.uniform(0.9, 1.1) * roof_ms
            count = rng.choice([6, 30, 300])
            found.add(round_row([latency * rng.uniform(0.99, 1.01) for _ in range(count)], big), 10.0 * k + 5, k, k)
        moments = [moment(replace(base, read_gbps=rng.uniform(30, 70), write_gbps=rng.uniform(15, 35)), f"m{i}",
                          10.0 * i) for i in range(4)]
        row = found.combined(moments)
        assert row["pct_roof_low"] <= row["pct_roofline"] <= row["pct_roof_high"]
        assert row["roof_verdict"] != "within" or not row["above_roof"]
        assert row["roof_verdict"] != "above" or row["above_roof"]
        verdicts.add(row["roof_verdict"])
    assert verdicts == {"above", "within", "unresolved"}  # the draws reach every verdict


def test_a_retry_of_a_noisy_round_takes_its_place_and_runs_in_the_last_bracket():
    found = rounds_mod.RowRounds()
    found.add(round_row([1.0] * 6), 10.0, 0, 0)
    found.add(round_row([3.0] * 6, noisy=True), 20.0, 1, 1)
    found.add(round_row([1.1] * 6), 90.0, 1, 2, retried=True)
    assert found.bracket == [0, 2] and found.retried == [False, True]
    assert rounds_mod.combine(found.rows, found.index, found.retried)[0]["round_latencies_ms"] == "1/1.1r"


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory):
    from phasebench.bench.sweep import runner

    out = tmp_path_factory.mktemp("rounds")
    shown = []
    cases = [CASE, AttentionCase(1, 2, 2, 5, 5, 8, False, "float32")]
    timer = runner.default_timer(torch.device("cpu"), sample_time=0.02)
    df = runner.run(runner.RunConfig(cases, ["naive", "triton"], torch.device("cpu"), out, suite="test",
                                     detect_contention=False, timer=timer, rounds=3, combine_rounds=True,
                                     isolation=Isolation(isolate=True),
                                     on_row=lambda row, i, n: shown.append((row["impl"], row["kv_len"], row["round"]))))
    return df, json.loads((out / "run.json").read_text()), shown


def test_a_run_in_rounds_keeps_one_row_per_case_and_impl_from_three_processes(three_rounds):
    df, meta, shown = three_rounds
    assert len(df) == 4 and (df["status"] == "ok").all()
    compiled = df[df["mode"] == "compiled"]
    assert (compiled["rounds"] == 3).all() and compiled["latency_between_low_ms"].notna().all()
    assert (df.loc[df["mode"] == "interpreter", "rounds"] == 1).all()  # one sample, never repeated
    assert meta["isolation"]["workers_started"] == 3 and meta["rounds_run"] == 3
    # the tests keep the host's ceilings (PHASEBENCH_HOST_CEILINGS): they judge every run, nothing is measured again
    assert [m["name"] for m in meta["ceiling_moments"]] == ["before"]
    assert [r for _, _, r in shown] == ["1/3"] * 4 + ["2/3"] * 2 + ["3/3"] * 2
    assert compiled["roof_moment"].str.match(r"^before \d\d:\d\d:\d\dZ$").all()
    assert (compiled["pct_roof_low"] <= compiled["pct_roofline"]).all()
    assert (compiled["pct_roofline"] <= compiled["pct_roof_high"]).all()
    for row in compiled.itertuples():
        medians = latencies_of(row.round_latencies_ms)
        assert len(medians) == 3 and row.samples >= 6 + 2 * 4  # a later round takes 4 samples at least
        assert row.latency_ms == pytest.approx(run_figure(medians), rel=1e-5)
        low, high = repeat_interval(medians, row.latency_ms)
        assert row.latency_between_low_ms == pytest.approx(low, rel=1e-5)


def test_each_later_round_is_probed_and_its_rows_judged_at_the_measurements_around_them(tmp_path, monkeypatch):
    """In this process (fakes for the ceilings: before, a probe per later round and one after the run, as no row is
    warm), a row takes the moment nearest its rounds' middle, and its verdict spans the measurements around all its
    rounds."""
    from dataclasses import replace

    from phasebench.bench.instruments import ceiling_drift, roofline
    from phasebench.bench.sweep import runner

    monkeypatch.delenv(roofline.HOST_KEEP_ENV, raising=False)
    monkeypatch.setattr(roofline, "ceilings", lambda device, dtypes, refresh=False, levels=True: CEIL)
    probes = iter([0.5, 2.0, 1.1])  # the read ceiling at round 2's probe, round 3's, then after the run
    monkeypatch.setattr(ceiling_drift, "probe_moment", lambda device, before, name: {
        **ceiling_drift.moment(replace(before, read_gbps=30.0 * next(probes)), name, __import__("time").time())})
    monkeypatch.setattr(ceiling_drift, "measure_again", lambda device, before: pytest.fail("no warm row: probed"))
    timer = runner.default_timer(torch.device("cpu"), sample_time=0.02)
    df = runner.run(runner.RunConfig([CASE], ["naive"], torch.device("cpu"), tmp_path, suite="test",
                                     detect_contention=False, timer=timer, rounds=3, combine_rounds=True))
    meta = json.loads((tmp_path / "run.json").read_text())
    assert [m["name"] for m in meta["ceiling_moments"]] == ["before", "round 2", "round 3", "after"]
    assert [m["read_gbps"] for m in meta["ceiling_moments"]] == [30.0, 15.0, 60.0, 33.0]
    assert meta["ceilings_after"] is None and meta["ceiling_drift"]["read_gbps"] == pytest.approx(0.1)
    assert meta["ceiling_spread"]["read_gbps"] == pytest.approx(3.0)  # 60 / 15 - 1
    row = df.iloc[0]
    assert row.roof_moment.split()[:2] in (["round", "2"], ["round", "3"])  # nearest the middle round
    assert row.read_gbps in (15.0, 60.0) and row.rounds == 3
    assert row.pct_roof_low < row.pct_roofline < row.pct_roof_high  # over 15 to 60 GB/s
    assert row.ceiling_drift_pct > 0


def test_a_round_too_small_for_an_interval_spans_its_samples_and_notes_survive_the_judging():
    """A later round of four samples has no 95% interval: the roof range takes its extremes; a round that ran with
    another backend is named in the reason after the row is judged at its moments; the worst round's error is kept."""
    found = rounds_mod.RowRounds()
    found.add(round_row([1.0, 1.01, 0.99, 1.02, 1.0, 1.03], max_rel_err=1e-7), 5.0, 0, 0)
    found.add(round_row([1.2, 1.1, 1.3, 1.25], max_rel_err=3e-6), 15.0, 1, 1)
    found.add(round_row([1.0] * 6, backend="other"), 25.0, 2, 2)
    assert rounds_mod._round_span(found.rows[1]) == (pytest.approx(1.225), 1.1, 1.3)
    moments = [moment(CEIL, f"m{i}", 10.0 * i) for i in range(4)]
    row = found.combined(moments)
    assert row["rounds"] == 2 and row["reason"].endswith("round 3 ran as other: left out") and "_left" not in row
    assert row["max_rel_err"] == 3e-6
    assert math.isfinite(row["pct_roof_low"]) and row["pct_roof_low"] <= row["pct_roofline"] <= row["pct_roof_high"]
