"""The headline: the best implementation per op and phase, its share of the roof, the runner-up, the counts, and a
phases folder's few numbers; rendered as a frame, markdown and HTML."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import headline, load_phases
from phasebench.analysis.phases.check import pct_interval
from phasebench.bench.spec import steps as step_defs
from phasebench.bench.spec.schema import conform

from ..conftest import REPO
from .phase_rows import TINY, compose, op_rows, scenario_steps

CASE = ["phase", "batch", "q_len", "kv_len"]


def expected_best(ok: pd.DataFrame, phase: str):
    """The rule, recomputed in float64 from the rows: geometric mean pct over the cases every impl measured."""
    rows = ok[ok["phase"] == phase]
    cases = [set(map(tuple, part[CASE].to_numpy())) for _, part in rows.groupby("impl")]
    shared = set.intersection(*cases)
    rows = rows[[tuple(c) in shared for c in rows[CASE].to_numpy()]]
    score = rows.groupby("impl")["pct_roofline"].apply(lambda v: float(np.exp(np.log(v.to_numpy(float)).mean())))
    ranked = score.sort_values(ascending=False)
    latency = rows.pivot_table(index=CASE, columns="impl", values="latency_ms")
    best, runner = ranked.index[:2]
    speedup = float(np.exp(np.log(latency[runner] / latency[best]).mean()))
    return best, ranked.iloc[0], runner, ranked.iloc[1], speedup, len(shared)


def test_the_best_impl_is_the_one_closest_to_its_roof_on_the_cases_all_measured(rng, helpers):
    rows = conform(helpers.make_rows(rng, not_ok=False))
    frame = headline(rows).frame
    assert list(frame["phase"]) == ["prefill", "decode"] and set(frame["op"]) == {"attention"}
    for phase in ("prefill", "decode"):
        row = frame[frame["phase"] == phase].iloc[0]
        best, pct, runner, runner_pct, speedup, cases = expected_best(rows, phase)
        assert (row["best_impl"], row["runner_up"], row["cases"], row["shared"]) == (best, runner, cases, True)
        assert row["pct_roofline"] == pytest.approx(pct) and row["runner_up_pct"] == pytest.approx(runner_pct)
        assert row["speedup"] == pytest.approx(speedup) and row["speedup"] >= 1
        mine = rows[(rows["phase"] == phase) & (rows["impl"] == best)]
        assert row["max_pct_roofline"] == pytest.approx(mine["pct_roofline"].max())
        bounds = mine["bound"].value_counts()
        assert row["bound"] == (bounds.index[0] if len(bounds) == 1 else
                                ", ".join(f"{name} {count}" for name, count in bounds.items()))
    assert frame.set_index("phase").loc["decode", "bound"] == "memory"  # decode intensity is far below every ridge


def test_a_case_one_impl_lacks_takes_no_part_in_the_ranking(rng, helpers):
    rows = conform(helpers.make_rows(rng, impls=("naive", "flash"), not_ok=False))
    decode = rows["phase"] == "decode"
    lacking = decode & (rows["impl"] == "naive") & (rows["kv_len"] == 4096)
    rows.loc[decode & (rows["impl"] == "naive"), "pct_roofline"] = 50.0  # naive: 50% on every case it has
    rows.loc[decode & (rows["impl"] == "flash"), "pct_roofline"] = 40.0
    rows.loc[decode & (rows["impl"] == "flash") & (rows["kv_len"] == 4096), "pct_roofline"] = 99.0
    rows = rows[~lacking]
    row = headline(rows).frame.set_index("phase").loc["decode"]
    # flash's 99% cases have no naive row: over the shared cases naive leads, 50% against 40%
    assert row["best_impl"] == "naive" and row["pct_roofline"] == pytest.approx(50.0)
    assert row["runner_up_pct"] == pytest.approx(40.0) and row["cases"] == int(decode.sum() / 2 - lacking.sum())


def test_noisy_and_above_roof_rows_are_counted_and_never_ranked(rng, helpers):
    rows = conform(helpers.make_rows(rng, not_ok=True))
    prefill = rows["phase"] == "prefill"
    clean = headline(rows).frame.set_index("phase").loc["prefill"]
    winner = clean["best_impl"]
    rows.loc[prefill & (rows["impl"] == winner) & (rows["status"] == "ok"), "noisy"] = True
    others = rows.index[prefill & (rows["impl"] != winner) & (rows["status"] == "ok")]
    rows.loc[others[0], ["above_roof", "pct_roofline"]] = (True, 180.0)
    lead = headline(rows)
    row = lead.frame.set_index("phase").loc["prefill"]
    assert row["best_impl"] != winner and row["max_pct_roofline"] < 100
    # the finding is marked beside the best, never ranked: its count, its share and a note
    assert row["above_roof"] == 1 and row["max_pct_above_roof"] == pytest.approx(180.0)
    assert "Above their roof beside these (findings, hollow in the figures): attention prefill 1; up to 180%" in (
        lead.markdown())
    counts = lead.counts.iloc[0]
    assert counts["noisy"] == int((prefill & (rows["impl"] == winner) & (rows["status"] == "ok")).sum())
    assert counts["above_roof"] == 1 and counts["ok"] == int((rows["status"] == "ok").sum())
    assert (counts["failed"], counts["incorrect"], counts["skipped"]) == (1, 1, 1)
    rows.loc[prefill & (rows["status"] == "ok"), "noisy"] = True  # nothing quiet left in prefill
    row = headline(rows).frame.set_index("phase").loc["prefill"]
    assert row["best_impl"] == "" and row["note"].startswith("no quiet ok row at or under its roof: ")


def test_devices_modes_timers_and_dtypes_never_pool(mixed):
    lead = headline(mixed)
    groups = lead.frame[["device", "mode", "timer", "dtype"]].drop_duplicates()
    assert len(groups) == 3 and "interpreter" not in set(lead.frame["mode"])  # GPU events, GPU host clock, CPU
    cpu = lead.frame[lead.frame["device"] == "AMD EPYC 9654"]
    assert set(cpu["best_impl"]) <= {"naive", "flash"}  # its triton rows ran in the interpreter
    correctness = lead.correctness
    in_interpreter = mixed[mixed["mode"] == "interpreter"]
    assert list(correctness["impl"]) == ["triton"] and correctness["ok"].sum() == len(in_interpreter)
    assert correctness["worst_max_rel_err"].iloc[0] == pytest.approx(in_interpreter["max_rel_err"].max())
    assert len(lead.counts) == 4 and lead.counts["ok"].sum() == len(mixed)


def phase_tables():
    sizes = dict(prompts=(16, 64), context=48, chunks=(8, 16), chunk_batch=4, chunk_prompt=64)
    steps = scenario_steps(TINY, batches=(1, 2, 4, 8, 16), **sizes)

    def latency(use):  # a step costs about max(tokens, 8): throughput stops growing after batch 8
        fields = use.field_dict
        return 0.05 * max(fields.get("m") or fields["batch"] * fields["q_len"], 8)

    return compose(op_rows(step_defs.distinct_uses(steps), latency), TINY, batches=(1, 2, 4, 8, 16), **sizes)


def test_a_phases_folder_says_ttft_tpot_saturation_and_limits():
    tables = phase_tables()
    lead = headline(None, tables)
    assert lead.frame.empty and len(lead.phases) == 1
    found = lead.phases[0]
    assert list(found["ttft"]["ttft_ms"]) == list(tables["prefill"].sort_values("prompt")["ttft_ms"])
    assert list(found["decode"]["tpot_ms"]) == list(tables["decode"]["tpot_ms"])
    knee = tables["decode"].loc[tables["decode"]["saturated"], "batch"]
    assert found["saturation_batch"] == int(knee.iloc[0])
    limits = found["interactive"].set_index("prompt")
    for row in tables["interactive"].itertuples(index=False):
        assert limits.loc[row.prompt, f"batch_at_{row.user_tokens_per_s_target:g}_tok_s"] == row.largest_batch
        assert limits.loc[row.prompt, "meets_ttft"] == (row.ttft_ms <= 1e3 * row.ttft_target_s)
    text = lead.markdown()
    assert f"Saturation batch {found['saturation_batch']}" in text and "Interactive limits" in text
    assert "Phases · tiny, 3 layers · cpu · float32" in text


def test_the_committed_phases_sample_reads_as_its_numbers():
    sample = REPO / "analysis" / "sample" / "cpu-phases"
    lead = headline(None, load_phases(sample))
    text = lead.markdown()
    prefill = pd.read_csv(sample / "prefill.csv")
    for row in prefill.itertuples(index=False):
        assert f"{row.ttft_ms / 1e3:.3g} s at {row.prompt} tokens" in text
        assert (f"prompt {row.prompt}: missed" in text) == (row.ttft_ms > 3e3)  # the 3 s TTFT target
    # the published error (the ops/ rows the tables show) and the per-layer one, each with its interval
    reference = pd.read_csv(sample / "reference.csv")
    published = lead.phases[0]["composition"]
    named = set()  # each reference is named once per sentence, then its rows by batch
    for r, p in zip(reference.itertuples(index=False), published.itertuples(index=False), strict=True):
        where = "prefill" if r.phase == "prefill" else f"decode batch {r.batch}"
        if (r.reference, r.phase) in named:
            where = where.replace("decode batch", "batch")
        who = "" if (r.reference, r.phase) in named else f"{r.reference} ({r.layers} layers) "
        named.add((r.reference, r.phase))
        assert r.error_pct == p.error_pct
        error, published, per_layer = (
            pct_interval(getattr(r, f"{stem}_pct"), getattr(r, f"{stem}_low_pct"), getattr(r, f"{stem}_high_pct"))
            for stem in ("error", "published_per_layer_error", "per_layer_error"))
        assert f"{who}{where} {error} (published per layer {published}, check's per layer {per_layer})" in text


def test_markdown_and_html_say_the_same_and_links_point_at_the_lists(rng, helpers):
    rows = conform(helpers.make_rows(rng, not_ok=True))
    rows.loc[rows.index[rows["status"] == "ok"][:2], "noisy"] = True
    lead = headline(rows)
    text, page = lead.markdown(), lead.html()
    for row in lead.frame.itertuples(index=False):
        assert f"| {row.op} | {row.phase} | {row.best_impl} |" in text
        assert f"<td>{row.best_impl}</td>" in page
    assert '<a href="#noisy-rows">2 noisy</a>' in page and '<a href="#not-ok-rows">1 failed</a>' in page
    assert "<a " not in lead.html(links=False) and lead._repr_html_() == lead.html(links=False)
    assert str(lead) == repr(lead) == text and "2 noisy" in text


def test_the_first_screen_says_when_the_ceilings_moved_by_more_than_ten_percent(rng, helpers):
    """A run whose rows saw their roof move by 23% while they ran (ceiling_drift_pct) gets a sentence under its counts
    with the figure and how many rows that leaves unresolved; one whose roofs moved by 9% gets none."""
    rows = conform(helpers.make_rows(rng, not_ok=False))
    rows["ceiling_drift_pct"] = rng.uniform(1.0, 9.0, len(rows))
    rows["roof_verdict"] = "within"
    quiet = headline(rows)
    assert "The ceilings moved" not in quiet.markdown() and quiet.counts.iloc[0]["roof_unresolved"] == 0
    moved = rows.index[rows["mode"] == "compiled"][:3]
    rows.loc[moved[0], "ceiling_drift_pct"] = 23.4
    rows.loc[moved[1:], "roof_verdict"] = "unresolved"
    text = headline(rows).markdown()
    assert "The ceilings moved by up to 23% while these rows ran" in text and "and 2 stay unresolved" in text
    assert headline(rows).counts.iloc[0]["ceilings_moved_pct"] == pytest.approx(23.4)
