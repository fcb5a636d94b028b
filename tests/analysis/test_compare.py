"""compare(): pairs of the same measurement, bootstrap, row-interval and spread intervals, verdicts, unpaired rows,
figure, report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import compare, comparison_figure, load, regressions, with_samples, write_report
from phasebench.analysis.comparison.display import format_comparison
from phasebench.analysis.comparison.pairs import parse_threshold
from phasebench.bench.spec.interval import median_interval, ratio_interval
from phasebench.bench.spec.schema import conform
from phasebench.bench.sweep.results import ResultsStore

# new / base latency per case, by the rows' kv_len (decode) or q_len (prefill)
FACTORS = {256: 1.30, 1024: 0.70, 4096: 1.00, 128: 1.03, 512: 0.97}


def timed(rows: pd.DataFrame, rng, *, sigma: float, count: int, factors=None) -> pd.DataFrame:
    """Rows whose latency figures come from lognormal samples (median * factor of the row's case)."""
    out = rows.copy()
    samples = []
    for index, row in out.iterrows():
        factor = (factors or {}).get(row["kv_len"] if row["phase"] == "decode" else row["q_len"], 1.0)
        values = row["latency_ms"] * factor * np.exp(rng.normal(0, sigma, count))
        median = float(np.median(values))
        out.loc[index, ["latency_ms", "latency_p20_ms", "latency_p80_ms"]] = (
            median, float(np.percentile(values, 20)), float(np.percentile(values, 80)))
        found = median_interval(values)
        out.loc[index, ["latency_ci_low_ms", "latency_ci_high_ms"]] = (found.low, found.high)
        out.loc[index, "samples"] = count
        out.loc[index, "tflops"] = row["flops"] / (median / 1e3) / 1e12
        out.loc[index, "gbps"] = row["bytes"] / (median / 1e3) / 1e9
        out.loc[index, "pct_roofline"] = 100 * out.loc[index, "tflops"] / row["roof_tflops"]
        samples.append(values)
    return out.assign(samples_ms=pd.Series(samples, index=out.index, dtype=object))


@pytest.fixture
def sets(rng, helpers):
    base_rows = helpers.make_rows(rng, impls=("naive", "flash"), prefill_lens=(128, 512),
                                  decode_kv_lens=(256, 1024, 4096), decode_batches=(3,), not_ok=False)
    base = conform(timed(base_rows, rng, sigma=0.03, count=137))
    new = conform(timed(base_rows.assign(run_id="run-b"), rng, sigma=0.03, count=151, factors=FACTORS))
    return base, new


def expected(row) -> str:
    factor = FACTORS[row["kv_len"] if row["phase"] == "decode" else row["q_len"]]
    return "slower" if factor > 1.05 else "faster" if factor < 1 / 1.05 else "within threshold"


def test_known_ratios_and_tight_spreads_give_the_stated_verdicts(sets):
    base, new = sets
    frame = compare(base, new)
    pairs = frame[frame["pairing"] == "pair"]
    assert len(pairs) == len(base) and set(frame["pairing"]) == {"pair"}
    assert (pairs["method"] == "bootstrap").all()
    for _, row in pairs.iterrows():
        factor = FACTORS[row["kv_len"] if row["phase"] == "decode" else row["q_len"]]
        assert row["verdict"] == expected(row), row[["case", "impl", "ratio", "ratio_lo", "ratio_hi"]]
        assert row["ratio_lo"] <= row["ratio"] <= row["ratio_hi"]
        assert row["ratio"] == pytest.approx(factor, rel=0.03)
        assert row["new_tflops"] / row["base_tflops"] == pytest.approx(1 / row["ratio"])
    assert set(regressions(frame)["kv_len"]) == {256}
    assert frame.attrs == {"by": "run", "threshold": 0.05, "confidence": 0.95}


def test_a_wide_spread_leaves_a_verdict_unresolved_and_a_higher_threshold_takes_it_in(rng, sets, helpers):
    base, new = sets
    wide = conform(timed(new.drop(columns="samples_ms"), rng, sigma=0.6, count=7))
    frame = compare(base, wide)
    slow = frame[(frame["pairing"] == "pair") & (frame["kv_len"] == 256)]
    assert (slow["verdict"] == "unresolved").all()
    assert ((slow["ratio_hi"] - slow["ratio_lo"]) > 0.3).all()
    lenient = compare(base, new, threshold=0.50)  # 1.30 < 1.5 and 0.70 > 1 / 1.5
    assert set(lenient["verdict"]) == {"within threshold"}


def test_the_interval_is_seeded_and_swapping_sides_swaps_the_verdict(sets):
    base, new = sets
    first, again = compare(base, new, seed=3), compare(base, new, seed=3)
    pd.testing.assert_frame_equal(first, again)
    swapped = compare(new, base).set_index(["impl", "phase", "kv_len", "q_len"])
    first = first.set_index(["impl", "phase", "kv_len", "q_len"]).loc[swapped.index]
    flip = {"slower": "faster", "faster": "slower", "within threshold": "within threshold", "unresolved": "unresolved"}
    assert swapped["verdict"].tolist() == first["verdict"].map(flip).tolist()
    assert np.allclose(swapped["ratio"], 1 / first["ratio"])


def test_without_raw_samples_the_interval_comes_from_the_rows_intervals(sets):
    base, new = sets
    frame = compare(base.drop(columns="samples_ms"), new.drop(columns="samples_ms"))
    pairs = frame[frame["pairing"] == "pair"]
    assert (pairs["method"] == "row intervals").all()
    for _, row in pairs.iterrows():
        sides = [(row[f"{side}_latency_ms"], row[f"{side}_latency_ci_low_ms"], row[f"{side}_latency_ci_high_ms"])
                 for side in ("new", "base")]
        assert (row["ratio"], row["ratio_lo"], row["ratio_hi"]) == pytest.approx(ratio_interval(*sides))
        if FACTORS[row["kv_len"] if row["phase"] == "decode" else row["q_len"]] in (1.30, 0.70, 1.00):
            assert row["verdict"] == expected(row)


@pytest.mark.parametrize("new_ms, verdict", [((10.9, 10.6, 11.2), "slower"), ((9.1, 8.8, 9.4), "faster"),
                                             ((10.3, 9.9, 10.6), "unresolved"), ((10.0, 9.97, 10.03), "same")])
def test_row_intervals_that_overlap_leave_the_verdict_unresolved(sets, new_ms, verdict):
    """Synthetic intervals: separated ones give a verdict at threshold 0, overlapping ones none; a tight pair inside a
    5% band is within it."""
    base, _ = sets
    one = base.drop(columns="samples_ms").iloc[[0]].assign(latency_ms=10.0, latency_ci_low_ms=9.9,
                                                           latency_ci_high_ms=10.1)
    other = one.assign(run_id="run-b", latency_ms=new_ms[0], latency_ci_low_ms=new_ms[1],
                       latency_ci_high_ms=new_ms[2])
    apart = (new_ms[1] > 10.1) or (new_ms[2] < 9.9)
    row = compare(one, other, threshold=0.0 if verdict != "same" else 0.05).iloc[0]
    assert row["method"] == "row intervals"
    assert row["verdict"] == (verdict if verdict != "same" else "within threshold")
    assert apart == (verdict in ("slower", "faster"))


def test_rows_without_intervals_fall_back_to_the_spread(sets):
    base, new = sets
    columns = ["samples_ms", "latency_ci_low_ms", "latency_ci_high_ms"]
    frame = compare(base.drop(columns=columns), new.drop(columns=columns))
    pairs = frame[frame["pairing"] == "pair"]
    assert (pairs["method"] == "spread p20/p80").all()
    assert (pairs["ratio_lo"] < pairs["ratio"]).all() and (pairs["ratio"] < pairs["ratio_hi"]).all()
    for _, row in pairs.iterrows():
        if FACTORS[row["kv_len"] if row["phase"] == "decode" else row["q_len"]] in (1.30, 0.70, 1.00):
            assert row["verdict"] == expected(row)
    mixed = compare(base, new.drop(columns=columns))
    assert (mixed.loc[mixed["pairing"] == "pair", "method"] == "spread p20/p80").all()


def test_unpaired_rows_and_status_changes_are_listed_never_dropped(sets):
    base, new = sets
    new = new.copy()
    gone = (new["impl"] == "flash") & (new["kv_len"] == 4096)
    broken = (new["impl"] == "naive") & (new["q_len"] == 128)
    new.loc[broken, ["status", "reason"]] = ["incorrect", "max_rel_err 0.3 above the float32 limit"]
    new.loc[broken, "samples_ms"] = None
    extra = new[(new["impl"] == "flash") & (new["q_len"] == 512)].assign(impl="triton")
    noisy = (new["impl"] == "naive") & (new["kv_len"] == 1024)
    new.loc[noisy, ["noisy", "noise_reason"]] = [True, "another process held the CPU"]
    frame = compare(base, pd.concat([new[~gone], extra], ignore_index=True))
    assert len(frame) == len(base) + len(extra)
    by_kind = frame.groupby("pairing").size().to_dict()
    assert by_kind == {"pair": len(base) - 2, "status change": 1, "base only": 1, "new only": 1}
    change = frame[frame["pairing"] == "status change"].iloc[0]
    assert change["change"] == "ok -> incorrect" and change["new_reason"].startswith("max_rel_err")
    assert frame.loc[frame["pairing"] == "base only", "base_impl"].tolist() == ["flash"]
    assert frame.loc[frame["pairing"] == "new only", "new_impl"].tolist() == ["triton"]
    marked = frame[frame["noisy"]]
    assert len(marked) == 1 and marked["new_noisy"].all() and not marked["base_noisy"].any()
    text = format_comparison(frame)
    assert "status changed (1)" in text and "only in base (1)" in text and "only in new (1)" in text
    assert "ok -> incorrect" in text and "NOISY new" in text


def test_by_impl_compares_two_impls_within_one_result_set(sets):
    base, _ = sets
    frame = compare(base, by="impl", base_impl="naive", new_impl="flash")
    assert (frame["pairing"] == "pair").all() and len(frame) == len(base) // 2
    assert set(frame["base_impl"]) == {"naive"} and set(frame["new_impl"]) == {"flash"}
    latency = base.set_index(["impl", "phase", "q_len", "kv_len"])["latency_ms"]
    for _, row in frame.iterrows():
        key = (row["phase"], row["q_len"], row["kv_len"])
        assert row["ratio"] == pytest.approx(latency[("flash", *key)] / latency[("naive", *key)])
    with pytest.raises(ValueError, match=r"^new_impl: no rows of impl 'cudnn'"):
        compare(base, by="impl", base_impl="naive", new_impl="cudnn")
    with pytest.raises(ValueError, match=r"^base_impl, new_impl: by='impl' needs both"):
        compare(base, by="impl", base_impl="naive")


def test_unlike_rows_never_pair_unless_that_is_the_dimension_compared(sets):
    base, new = sets
    other_clock = new.assign(timer="pytest-benchmark")
    frame = compare(base, other_clock)
    assert not (frame["pairing"] == "pair").any() and len(frame) == 2 * len(base)
    assert "differ in timer" in format_comparison(frame) and "--by timer" in format_comparison(frame)
    across = compare(base, other_clock, by="timer")
    assert (across["pairing"] == "pair").all() and set(across["new_timer"]) == {"pytest-benchmark"}
    interpreted = compare(base.assign(mode="interpreter"), new.assign(mode="interpreter"))
    assert (interpreted["verdict"] == "slower").any() and regressions(interpreted).empty


def test_bad_arguments_raise_one_line_value_errors(sets):
    base, new = sets
    for call, pattern in ((lambda: compare(base, new, by="gpu"), r"^by: expected one of run, impl"),
                          (lambda: compare(base, new, threshold=1.5), r"^threshold: must be a fraction"),
                          (lambda: compare(base, new, confidence=1.0), r"^confidence: must be in"),
                          (lambda: compare(base), r"^b: by='run' compares two result sets"),
                          (lambda: compare(base, new, base_impl="naive"), r"^base_impl, new_impl: go with by='impl'")):
        with pytest.raises(ValueError, match=pattern):
            call()
    assert parse_threshold("5%") == pytest.approx(0.05) and parse_threshold("0.1") == pytest.approx(0.1)
    for text in ("5", "abc", "-3%", "120%"):
        with pytest.raises(ValueError, match=r"^threshold: "):
            parse_threshold(text)


def test_samples_come_back_from_parquet_samples_jsonl_and_pytest_benchmark_data(tmp_path, rng, sets, helpers):
    base, new = sets
    # a run that died before its parquet: results.csv and samples.jsonl only
    store = ResultsStore(tmp_path / "died")
    for row in base.to_dict("records"):
        store.append({**row, "samples_ms": list(row["samples_ms"])})
    loaded = with_samples(load(tmp_path / "died"))
    assert loaded["samples_ms"].map(len).tolist() == [137] * len(base)
    assert np.allclose(loaded["samples_ms"].iloc[0], base["samples_ms"].iloc[0])
    store.write_parquet()
    (tmp_path / "died" / "samples.jsonl").unlink()  # the parquet holds them now
    from_parquet = with_samples(load(tmp_path / "died" / "results.parquet"))
    assert np.allclose(np.concatenate(from_parquet["samples_ms"].tolist()), np.concatenate(base["samples_ms"].tolist()))
    # pytest-benchmark JSON: stats.data (seconds) when --benchmark-json wrote it, else (an older file without the
    # interval columns in extra_info) the q1/q3 spread
    plain = new.drop(columns="samples_ms").assign(latency_ci_low_ms=np.nan, latency_ci_high_ms=np.nan,
                                                  samples=pd.Series([int(v) for v in new["samples"]], dtype=object))
    path = helpers.write_pytest_benchmark(tmp_path / "bench.json", plain, rng)
    bare = compare(tmp_path / "died", path, by="timer")
    assert (bare.loc[bare["pairing"] == "pair", "method"] == "spread p20/p80 | q1/q3").all()
    document = json.loads(path.read_text())
    for entry, values in zip(document["benchmarks"], new["samples_ms"], strict=True):
        entry["stats"]["data"] = [v / 1e3 for v in values]
    path.write_text(json.dumps(document))
    frame = compare(tmp_path / "died", path, by="timer")
    pairs = frame[frame["pairing"] == "pair"]
    assert len(pairs) == len(base) and (pairs["method"] == "bootstrap").all()
    assert (pairs["verdict"] == pairs.apply(expected, axis=1)).all()


def test_the_figure_draws_one_point_per_pair_and_the_report_gets_a_section(tmp_path, sets):
    base, new = sets
    frame = compare(base, new)
    fig = comparison_figure(frame)
    points = sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections if c.get_gid() == "series")
    assert points == len(frame)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ratios = frame.set_index(frame["case"] + " · " + frame["impl"])["ratio"]
    assert [ratios[label] for label in labels] == sorted(ratios)
    empty = comparison_figure(compare(base, new.assign(timer="other")))
    assert "no data" in empty.axes[0].texts[0].get_text()
    paths = write_report(pd.concat([base, new], ignore_index=True), tmp_path / "report", comparison=frame)
    page = paths["html"].read_text()
    assert 'id="comparison"' in page and "bootstrap" in page and paths["comparison"].stat().st_size > 0
    assert len(pd.read_csv(paths["comparison_csv"])) == len(frame)


def test_a_row_that_stops_being_ok_or_vanishes_is_a_regression(sets):
    base, new = sets
    broken = new.copy()
    wrong = broken.index[(broken["impl"] == "flash") & (broken["kv_len"] == 4096)]
    broken.loc[wrong, ["status", "reason"]] = ("incorrect", "worst row's relative error 0.3 above the limit")
    broken.loc[wrong, ["latency_ms", "tflops", "gbps", "pct_roofline"]] = np.nan
    gone = broken.index[(broken["impl"] == "naive") & (broken["q_len"] == 512) & (broken["phase"] == "prefill")]
    broken = broken.drop(index=gone)
    frame = compare(base, broken)
    found = regressions(frame)
    kinds = found.groupby("regression").size().to_dict()
    assert kinds == {"slower": int((frame["verdict"] == "slower").sum()), "ok -> incorrect": len(wrong),
                     "missing in new": len(gone)}
    lenient = regressions(frame, allow_missing=True)
    assert "missing in new" not in set(lenient["regression"]) and len(lenient) == len(found) - len(gone)
    from phasebench.analysis.comparison.pairs import regression_line

    lines = [regression_line(row) for _, row in found.iterrows()]
    assert all("\n" not in line for line in lines)
    assert any("ok -> incorrect (worst row's relative error 0.3" in line for line in lines)
    assert any(line.endswith("ok in the base, missing in the new results") for line in lines)


def with_rounds(rows: pd.DataFrame, rng, *, between: float, rounds: int = 3, factors=None,
                moments=None) -> pd.DataFrame:
    """Rows measured in rounds: each round's median moves by a lognormal `between` (its process and moment; `moments`,
    one shift per round shared by every row, moves them together), the row's median their geometric mean."""
    out = rows.copy().assign(round_latencies_ms="", rounds=rounds)
    for index, row in out.iterrows():
        factor = (factors or {}).get(row["kv_len"] if row["phase"] == "decode" else row["q_len"], 1.0)
        shared = moments if moments is not None else np.zeros(rounds)
        medians = row["latency_ms"] * factor * np.exp(shared + rng.normal(0, between, rounds))
        out.loc[index, "latency_ms"] = float(np.exp(np.mean(np.log(medians))))
        out.loc[index, "round_latencies_ms"] = "/".join(f"{m:.6g}" for m in medians)
    return out.drop(columns=["samples_ms"], errors="ignore")


def test_rows_in_rounds_are_judged_between_runs_and_the_same_code_rarely_looks_changed(rng, helpers):
    """An A/A test by simulation: 40 pairs of runs of the same code whose rounds move by 6% between processes: the
    verdicts from the rounds call few pairs slower or faster (at most the 5% promised, plus sampling), where a
    bootstrap of the samples within each run (±0.5%) calls most of them; the promise is printed with the counts."""
    from phasebench.bench.spec.between_runs import repeat_interval

    base_rows = helpers.make_rows(rng, impls=("naive", "flash"), prefill_lens=(128, 512),
                                  decode_kv_lens=(256, 1024, 4096), decode_batches=(3,), not_ok=False)
    called, pairs, inside, covered = 0, 0, 0, 0
    for k in range(4):
        base = conform(with_rounds(base_rows.assign(run_id=f"a{k}"), rng, between=0.06))
        new = conform(with_rounds(base_rows.assign(run_id=f"b{k}"), rng, between=0.06))
        base[["latency_between_low_ms", "latency_between_high_ms"]] = [
            repeat_interval([float(v) for v in r.split("/")], m) for r, m in zip(base["round_latencies_ms"],
                                                                                  base["latency_ms"], strict=True)]
        frame = compare(base, new, threshold=0.0)
        found = frame[frame["pairing"] == "pair"]
        assert (found["method"] == "rounds (Welch)").all() and (found["covers"] == "between runs").all()
        called += int(found["verdict"].isin(["slower", "faster"]).sum())
        pairs += len(found)
        inside += int(found["in_base_between"].astype(bool).sum())
        covered += int(found["in_base_between"].notna().sum())
    assert pairs == 40 and called <= 5 and inside >= 34 and covered == 40
    text = format_comparison(frame)
    assert "judged on: 10 of 10 timed pairs with intervals between runs" in text
    assert "at most 5% of the time" in text and "between-run coverage:" in text


def test_two_impls_of_one_run_pair_their_rounds_and_a_real_change_is_found(rng, helpers):
    """Within one run, two impls share each round's process and moment: the paired interval takes out what moves both
    alike (here 10% per round), so flash 25% faster is found on every case."""
    rows = helpers.make_rows(rng, impls=("naive",), prefill_lens=(128,), decode_kv_lens=(256, 1024),
                             decode_batches=(3,), not_ok=False)
    rows = rows.assign(latency_ms=rows["latency_ms"] * 1e3)  # milliseconds: far past a timer's step
    moments = rng.normal(0, 0.10, 3)
    naive = with_rounds(rows, rng, between=0.005, moments=moments)
    flash = with_rounds(rows.assign(impl="flash"), rng, between=0.005, moments=moments,
                        factors={128: 0.75, 256: 0.75, 1024: 0.75})
    frame = compare(conform(pd.concat([naive, flash])), by="impl", base_impl="naive", new_impl="flash")
    found = frame[frame["pairing"] == "pair"]
    assert (found["method"] == "rounds (paired)").all() and (found["verdict"] == "faster").all()


def test_a_row_of_rounds_beside_a_row_of_one_is_judged_on_what_each_publishes(rng, helpers):
    """A row of three rounds publishes their geometric mean (7 ms here), its samples pooling at a median near 4.7 ms
    (the allocator's two regimes); beside a one-round row at 4.7 ms the ratio is of the published figures, and its
    interval, from the two rows' own intervals, holds it: never a bootstrap of the pooled samples' median."""
    rows = helpers.make_rows(rng, impls=("naive",), prefill_lens=(), decode_kv_lens=(256,), decode_batches=(3,),
                             not_ok=False)
    rounds = rows.assign(latency_ms=7.0, latency_ci_low_ms=2.0, latency_ci_high_ms=24.0, rounds=3,
                         round_latencies_ms="4.7/4.8/24.5",
                         samples_ms=pd.Series([[4.7] * 20 + [24.5] * 10], index=rows.index, dtype=object))
    single = rows.assign(run_id="run-b", latency_ms=4.7, latency_ci_low_ms=4.6, latency_ci_high_ms=4.8, rounds=1,
                         round_latencies_ms="4.7",
                         samples_ms=pd.Series([[4.7] * 30], index=rows.index, dtype=object))
    frame = compare(conform(rounds), conform(single))
    pair = frame[frame["pairing"] == "pair"].iloc[0]
    assert pair["ratio"] == pytest.approx(4.7 / 7.0) and pair["method"] == "row intervals"
    assert pair["ratio_lo"] <= pair["ratio"] <= pair["ratio_hi"] and pair["verdict"] == "unresolved"
