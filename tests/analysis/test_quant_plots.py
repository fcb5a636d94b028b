"""Quantized linear analysis: the speedup over the unquantized projection against the ideal (the unquantized time over
the quantized roof, up to the ridge), its figure,
its report section and the quantized points on the roofline."""

from __future__ import annotations

import numpy as np
import pandas as pd
from phasebench.analysis import quant_speedup, quant_speedup_table, roofline, write_report
from phasebench.analysis.figures.quantized import IDEAL_GID
from phasebench.bench.spec.quant import QUANT_SCHEMES
from phasebench.bench.spec.roof import memory_floor_s
from phasebench.bench.spec.schema import conform

N, K = 4097, 1000  # awkward: N odd, K no multiple of a group
COMMON = {"run_id": "r1", "device": "Some CPU", "device_kind": "cpu", "suite": "decode-quant", "model": "tiny",
          "projection": "o", "mode": "compiled", "timer": "perf_counter_ns", "phase": "decode", "dtype": "bfloat16",
          "status": "ok", "n": N, "k": K, "samples": 9, "peak_tflops": 1.0, "peak_gbps": 20.0, "read_gbps": 30.0,
          "write_gbps": 15.0, "noisy": False, "above_roof": False}


def row(op, impl, m, latency, scheme="", mode="compiled"):
    if op == "linear":
        read, written = 2.0 * (m * K + N * K), 2.0 * m * N
    else:
        read = QUANT_SCHEMES[scheme].stored_bytes(N, K, 2) + 2.0 * m * K
        written = 2.0 * m * N
    flops = 2.0 * m * N * K
    return {**COMMON, "op": op, "impl": impl, "m": m, "scheme": scheme, "latency_ms": latency, "mode": mode,
            "flops": flops, "read_bytes": read, "write_bytes": written, "bytes": read + written,
            "intensity": flops / (read + written), "tflops": flops / latency / 1e9,
            "gbps": (read + written) / latency / 1e6}


def frame():
    rows = []
    for m, base in ((1, 8.0), (4, 8.4), (16, 9.6)):
        rows.append(row("linear", "torch", m, base))
        rows.append(row("linear", "naive", m, 50.0))  # not the baseline: never a denominator
        rows.append(row("qlinear", "torch", m, base / 3.0, "int4-g128"))
        rows.append(row("qlinear", "naive", m, base * 1.5, "int4-g128"))
        rows.append(row("qlinear", "torch", m, base / 1.8, "int8"))
        rows.append(row("qlinear", "triton", m, 900.0, "int4-g128", mode="interpreter"))  # correctness only
    return conform(pd.DataFrame(rows))


def test_the_table_pairs_each_quantized_row_with_its_unquantized_projection():
    table = quant_speedup_table(frame())
    assert set(table["impl"]) == {"torch", "naive"}  # interpreter rows take no part
    one = table[(table["m"] == 4) & (table["scheme"] == "int4-g128") & (table["impl"] == "torch")].iloc[0]
    assert np.isclose(one["speedup"], 3.0) and np.isclose(one["baseline_latency_ms"], 8.4)
    dense = 2.0 * (4 * K + N * K) + 2.0 * 4 * N
    read = QUANT_SCHEMES["int4-g128"].stored_bytes(N, K, 2) + 2.0 * 4 * K
    roof_ms = 1e3 * float(memory_floor_s(read, 2.0 * 4 * N, 30.0, 15.0, 20.0))
    assert one["bound"] == "memory" and np.isclose(one["roof_ms"], roof_ms)
    # the ideal is the baseline's own time over the quantized roof, not the bytes ratio: a baseline off its roof
    # (8.4 ms here, far above its floor) lets the ideal stand far above the bytes saved
    assert np.isclose(one["ideal"], 8.4 / roof_ms) and one["ideal"] > one["bytes_ratio"]
    assert np.isclose(one["bytes_ratio"], dense / (read + 2.0 * 4 * N))
    assert np.isclose(one["pct_of_ideal"], 100 * 3.0 / one["ideal"])
    # past the ridge (int4 at M = 16 and 1 TFLOP/s is compute-bound) the bytes saved buy nothing: no ideal
    past = table[(table["m"] == 16) & (table["impl"] == "torch") & (table["scheme"] == "int4-g128")]
    assert (past["bound"] == "compute").all() and past["ideal"].isna().all()
    naive = table[(table["impl"] == "naive") & (table["scheme"] == "int4-g128")]
    assert (naive["speedup"] < 1).all()


def test_the_figure_draws_each_scheme_with_its_ideal():
    fig = quant_speedup(frame())
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["int4-g128", "int8"]
    ideal = [line for line in fig.axes[0].get_lines() if line.get_gid() == IDEAL_GID]
    assert len(ideal) == 1
    xs, ys = ideal[0].get_xydata().T
    assert list(xs) == [1, 4]  # drawn only up to the ridge


def test_without_an_unquantized_baseline_the_figure_says_so():
    df = frame()
    fig = quant_speedup(df[df["op"] == "qlinear"])
    assert any(text.get_text().startswith("no data") for ax in fig.axes for text in ax.texts)


def test_quantized_points_sit_right_of_the_unquantized_on_the_roofline():
    df = frame()
    fig = roofline(df)
    labels = [text.get_text() for ax in fig.axes for text in ax.get_legend().get_texts()]
    assert "qlinear · decode" in labels and "linear · decode" in labels
    at_one = df[(df["m"] == 1) & (df["impl"] == "torch")]
    assert at_one[at_one["op"] == "qlinear"]["intensity"].min() > at_one[at_one["op"] == "linear"]["intensity"].max()


def test_the_report_has_the_quantized_section(tmp_path):
    paths = write_report(frame(), tmp_path / "report")
    assert "Quantized weights: speedup against the bytes they save" in paths["html"].read_text()
    assert paths["quant_speedup"].is_file()
