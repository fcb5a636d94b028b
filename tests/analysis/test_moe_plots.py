"""Routed-experts analysis: the coverage table (experts touched against the uniform expectation, bytes, latency and
% of roof from the performance rows only), its figure and its report section."""

from __future__ import annotations

import numpy as np
import pandas as pd
from phasebench.analysis import moe_coverage, moe_coverage_table
from phasebench.analysis.figures.kit import FINDING_GID, INTERVAL_GID, SERIES_GID
from phasebench.analysis.figures.moe import EXPECTED_GID, all_touched_batch
from phasebench.analysis.report.context import Context
from phasebench.analysis.report.sections import SECTIONS, moe_section
from phasebench.bench.spec.schema import conform

E, TOP = 12, 3
COMMON = {"run_id": "r1", "device": "Some CPU", "device_kind": "cpu", "suite": "moe-decode", "model": "tiny-moe",
          "op": "moe", "projection": "experts", "mode": "compiled", "timer": "perf_counter_ns", "phase": "decode",
          "dtype": "bfloat16", "status": "ok", "n": 72, "k": 200, "experts": E, "top_k": TOP, "routing_seed": 0,
          "samples": 9, "peak_tflops": 1.0, "peak_gbps": 20.0, "read_gbps": 30.0, "write_gbps": 15.0,
          "noisy": False, "above_roof": False}


def row(impl, m, touched, latency, routing="uniform", **extra):
    read = touched * 3 * 72 * 200 * 2.0 + 2.0 * m * 200 + 8.0 * m * TOP
    return {**COMMON, "impl": impl, "m": m, "touched_experts": touched, "routing": routing, "latency_ms": latency,
            "latency_ci_low_ms": 0.9 * latency, "latency_ci_high_ms": 1.2 * latency, "read_bytes": read,
            "write_bytes": 400.0 * m, "bytes": read + 400.0 * m, "pct_roofline": 40.0, **extra}


def frame():
    rows = [row("torch", m, t, 0.1 * t) for m, t in ((1, 3), (3, 7), (8, 11), (21, 12), (64, 12))]
    rows += [row("naive", 3, 7, 5.0, noisy=True, noise_reason="busy")]  # noisy: no latency from it
    rows += [row("triton", 3, 7, 900.0, mode="interpreter")]  # correctness only
    rows += [row("torch", m, t, 0.1 * t, routing="zipf-1.2") for m, t in ((1, 3), (8, 6), (64, 11))]
    return conform(pd.DataFrame(rows))


def test_the_table_sets_touched_experts_beside_the_uniform_expectation():
    table = moe_coverage_table(frame())
    torch3 = table[(table["impl"] == "torch") & (table["m"] == 3) & (table["routing"] == "uniform")].iloc[0]
    assert torch3["touched_experts"] == 7 and np.isclose(torch3["expected_touched"], E * (1 - (1 - TOP / E) ** 3))
    assert np.isclose(torch3["latency_ms"], 0.7) and torch3["timed_rows"] == 1
    assert np.isclose(torch3["read_bytes_per_token"], torch3["read_bytes"] / 3)
    untimed = table[table["impl"].isin(["naive", "triton"])]
    assert untimed["latency_ms"].isna().all() and (untimed["timed_rows"] == 0).all() and len(untimed) == 2
    assert all_touched_batch(table) == {("tiny-moe", "uniform"): 21, ("tiny-moe", "zipf-1.2"): None}


def test_the_figure_draws_coverage_bytes_and_roof_per_layer():
    fig = moe_coverage(frame())
    coverage, latency, roof = fig.axes[:3]
    assert len([line for line in coverage.lines if line.get_gid() == EXPECTED_GID]) == 1
    assert len([line for line in coverage.lines if line.get_gid() == SERIES_GID]) == 2  # two routings
    assert any(line.get_gid() == SERIES_GID for line in roof.lines)
    assert "left out: 1 interpreter-mode rows (correctness only); 1 noisy rows" in fig._suptitle.get_text()
    assert any(c.get_gid() == INTERVAL_GID for c in [*roof.collections, *roof.lines])  # % of roof with its interval


def test_a_row_above_its_roof_stays_in_the_table_and_is_drawn_hollow_with_its_share():
    df = frame()
    above = conform(pd.DataFrame([row("torch", 5, 9, 0.4, pct_roofline=131.0, above_roof=True),
                                  row("torch", 5, 9, 0.5, pct_roofline=110.0)]))
    table = moe_coverage_table(pd.concat([df, above], ignore_index=True))
    five = table[(table["m"] == 5)].iloc[0]
    assert bool(five["above_roof"]) and five["timed_rows"] == 2 and np.isfinite(five["pct_roofline"])
    assert np.isclose(five["latency_ci_low_ms"], 0.36) and np.isclose(five["latency_ci_high_ms"], 0.6)  # widest ends
    roof = moe_coverage(pd.concat([df, above], ignore_index=True)).axes[2]
    assert [t.get_text() for t in roof.texts if t.get_gid() == FINDING_GID] == ["120%"]
    assert any(c.get_gid() == FINDING_GID for c in roof.collections)


def test_the_report_section_names_where_every_expert_is_touched(tmp_path):
    found = moe_section(Context(frame(), tmp_path, dpi=30))
    page = "".join(found.body)
    assert found.title.startswith("Routed experts") and "tiny-moe uniform: from M = 21" in page
    assert "tiny-moe zipf-1.2: not within the batches measured" in page and (tmp_path / "moe_coverage.png").is_file()
    assert moe_section(Context(frame().assign(op="linear"), tmp_path, dpi=30)) is None and moe_section in SECTIONS
