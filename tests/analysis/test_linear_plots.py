"""Linear-layer analysis: the ridge crossing, the weight floor, layer tokens/s, and frames that mix both operators."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from phasebench.analysis import (
    correctness_table,
    decode_scaling,
    layer_tokens_per_second,
    layer_tokens_per_second_table,
    linear_crossings,
    linear_sweep,
    load,
    phase_comparison,
    prefill_scaling,
    roofline,
    speedup,
    speedup_table,
    status_table,
    summary_table,
    tokens_per_second,
    write_report,
)
from phasebench.analysis.figures.linear import crossing_m, linear_intensity, linear_roof
from phasebench.bench.spec.models import DecoderConfig
from phasebench.bench.spec.schema import conform

from ..conftest import REPO
from .conftest import AWKWARD, ELEMENT_BYTES, LINEAR_MS, PEAKS

LAYER = ("qkv", "o", "gate_up", "down")


def expected_crossing(ridge: float, n: int, k: int, elem: int) -> float:
    return ridge * elem * n * k / (2 * n * k - ridge * elem * (n + k))


def gid_lines(ax, gid: str) -> list:
    return [line for line in ax.get_lines() if line.get_gid() == gid]


def is_no_data(fig) -> bool:
    return any(text.get_text().startswith("no data") for ax in fig.axes for text in ax.texts)


def drawn(fig) -> list:
    """Every data point of a figure: scatter offsets and series lines, per axes, in order."""
    found = []
    for ax in fig.axes:
        for collection in ax.collections:
            if isinstance(collection, PathCollection):
                found.append(np.asarray(collection.get_offsets(), dtype=float).round(12).tolist())
        for line in ax.get_lines():
            found.append((line.get_gid(), np.asarray(line.get_xydata(), dtype=float).round(12).tolist()))
        found.append([patch.get_height() for patch in ax.patches])
    return found


@pytest.fixture
def cpu_linear(rng, helpers) -> pd.DataFrame:
    return conform(helpers.make_linear_rows(rng, run_id="cpu-lin", device="AMD EPYC 9654", device_kind="cpu",
                                            dtype="float32", impls=("naive", "torch")))


def test_crossing_m_is_where_intensity_meets_the_ridge(linear_rows, cpu_linear):
    for frame in (linear_rows, cpu_linear):
        table = linear_crossings(frame)
        device, dtype = frame["device"].iloc[0], frame["dtype"].iloc[0]
        peak_tflops, peak_gbps = PEAKS[(device, dtype)]
        ridge, elem = peak_tflops * 1e3 / peak_gbps, ELEMENT_BYTES[dtype]
        assert set(table["projection"]) == set(LAYER) and len(table) == 4 * frame["impl"].nunique()
        for row in table.itertuples(index=False):
            n, k = AWKWARD.projections()[row.projection]
            assert (row.n, row.k) == (n, k)
            assert row.ridge_intensity == pytest.approx(ridge)
            assert row.crossing_m == pytest.approx(expected_crossing(ridge, n, k, elem))
            assert float(linear_intensity(row.crossing_m, n, k, elem)) == pytest.approx(ridge)
            assert (row.m_min, row.m_max) == (min(LINEAR_MS), max(LINEAR_MS))


def copy_roof(ridge: float) -> dict:
    """Ceilings whose three streams run at one rate (the copy roof of files before schema 5) with this ridge."""
    return {"tflops": ridge * 100.0 / 1e3, "read": 100.0, "write": 100.0, "copy": 100.0}


def test_crossing_is_infinite_where_intensity_never_reaches_the_ridge():
    # limit of the intensity: 2NK / (elem (N + K)) = 2 * 37 * 53 / (2 * 90) = 21.8 FLOP/B
    assert crossing_m(37, 53, 2, copy_roof(21.0)) > 0 and np.isfinite(crossing_m(37, 53, 2, copy_roof(21.0)))
    assert crossing_m(37, 53, 2, copy_roof(21.0)) == pytest.approx(expected_crossing(21.0, 37, 53, 2))
    assert crossing_m(37, 53, 2, copy_roof(22.0)) == np.inf
    assert np.isnan(crossing_m(37, 53, 2, {**copy_roof(21.0), "tflops": np.nan}))  # no compute ceiling: unknown


def test_bound_flags_at_the_ends_of_the_m_range(linear_rows, rng, helpers):
    table = linear_crossings(linear_rows)
    assert table["memory_bound_at_min_m"].all() and table["compute_bound_at_max_m"].all()
    # Stop the sweep under every crossing (the smallest is o's, about 250): compute-bound nowhere.
    short = conform(helpers.make_linear_rows(rng, ms=(1, 5, 37)))
    short_table = linear_crossings(short)
    assert short_table["memory_bound_at_min_m"].all() and not short_table["compute_bound_at_max_m"].any()
    assert (short_table["crossing_m"] > 37).all()


def test_weight_floor_and_the_figures_at_the_ends(cpu_linear):
    table = linear_crossings(cpu_linear)
    peak_gbps = PEAKS[("AMD EPYC 9654", "float32")][1]
    for row in table.itertuples(index=False):
        n, k = AWKWARD.projections()[row.projection]
        assert row.weight_floor_ms == pytest.approx(4 * n * k / peak_gbps / 1e6)  # bytes / (GB/s) in ms
        rows = cpu_linear[(cpu_linear["projection"] == row.projection) & (cpu_linear["impl"] == row.impl)]
        smallest, largest = rows[rows["m"] == row.m_min], rows[rows["m"] == row.m_max]
        assert row.latency_at_min_m_ms == pytest.approx(smallest["latency_ms"].median())
        assert row.gbps_at_min_m == pytest.approx(smallest["gbps"].median())
        assert row.tflops_at_max_m == pytest.approx(largest["tflops"].median())
        assert row.floor_pct == pytest.approx(100 * row.weight_floor_ms / row.latency_at_min_m_ms)
        # Under the roofline, no row is faster than streaming its weights once at the peak.
        assert row.floor_pct < 100


def test_crossings_leave_out_interpreter_rows_and_noisy_timings(rng, helpers):
    frame = helpers.make_linear_rows(rng, interpreter_impls=("triton",))
    frame.loc[(frame["impl"] == "torch") & (frame["m"] == 1), "noisy"] = True
    table = linear_crossings(conform(frame))
    assert "triton" not in set(table["impl"])
    torch_rows = table[table["impl"] == "torch"]
    assert torch_rows["gbps_at_min_m"].isna().all() and torch_rows["latency_at_min_m_ms"].isna().all()
    assert torch_rows["tflops_at_max_m"].notna().all() and (torch_rows["noisy"] == 1).all()
    assert torch_rows["memory_bound_at_min_m"].all()  # bound comes from the cost model, noisy or not


def test_layer_tokens_per_second_sums_the_four_projections(rng, helpers):
    frame = helpers.make_linear_rows(rng, impls=("naive", "torch"), drop=(("down", 24), ("qkv", 1536)))
    # a second run of the same cases: each projection's latency is the median over both
    again = helpers.make_linear_rows(rng, run_id="lin-b", impls=("naive", "torch"), projections=("o",))
    frame = conform(pd.concat([frame, again], ignore_index=True))
    table = layer_tokens_per_second_table(frame)
    assert set(table["m"]) == set(LINEAR_MS) - {24, 1536}  # only the M with all four projections
    for row in table.itertuples(index=False):
        rows = frame[(frame["impl"] == row.impl) & (frame["m"] == row.m)]
        latencies = [rows.loc[rows["projection"] == name, "latency_ms"].median() for name in LAYER]
        assert row.layer_ms == pytest.approx(sum(latencies))
        assert row.tokens_per_s == pytest.approx(row.m / (sum(latencies) / 1e3))
        assert row.o_ms == pytest.approx(latencies[1])
        assert row.roofline_tokens_per_s >= row.tokens_per_s  # the rows sit under their roofs


def test_layer_tokens_leaves_out_lm_head_noisy_and_interpreter_rows(rng, helpers):
    frame = helpers.make_linear_rows(rng, projections=LAYER + ("lm_head",), interpreter_impls=("triton",))
    frame.loc[(frame["impl"] == "torch") & (frame["projection"] == "gate_up") & (frame["m"] == 8), "noisy"] = True
    frame = conform(frame)
    table = layer_tokens_per_second_table(frame)
    assert set(table["impl"]) == {"naive", "torch"}
    assert 8 not in set(table.loc[table["impl"] == "torch", "m"]) and 8 in set(table.loc[table["impl"] == "naive", "m"])
    naive = table[(table["impl"] == "naive") & (table["m"] == 3)].iloc[0]
    rows = frame[(frame["impl"] == "naive") & (frame["m"] == 3) & frame["projection"].isin(LAYER)]
    assert naive.layer_ms == pytest.approx(rows["latency_ms"].sum())  # no lm_head in a layer


def test_layer_tokens_figure_draws_the_table(rng, helpers):
    frame = conform(helpers.make_linear_rows(rng, interpreter_impls=("triton",)))
    fig = layer_tokens_per_second(frame)
    (ax,) = fig.axes
    table = layer_tokens_per_second_table(frame)
    series = {line.get_label(): line for line in gid_lines(ax, "series")}
    assert set(series) == {"naive", "torch"}
    for impl, line in series.items():
        expected = table[table["impl"] == impl].sort_values("m")
        np.testing.assert_allclose(line.get_xdata(), expected["m"].to_numpy(dtype=float))
        np.testing.assert_allclose(line.get_ydata(), expected["tokens_per_s"].to_numpy(dtype=float))
    assert len(gid_lines(ax, "ceiling")) == 1
    assert ax.get_xscale() == "log" and "interpreter" in fig._suptitle.get_text()
    incomplete = conform(helpers.make_linear_rows(rng, projections=("o", "down")))
    assert is_no_data(layer_tokens_per_second(incomplete))


def test_linear_sweep_draws_impls_roofs_ridge_and_floor(linear_rows):
    frame = linear_rows[linear_rows["impl"] != "triton"]
    fig = linear_sweep(frame)
    assert len(fig.axes) == 3 * len(LAYER)
    peak_tflops, peak_gbps = PEAKS[("NVIDIA H200", "bfloat16")]
    ridge = peak_tflops * 1e3 / peak_gbps
    for row, projection in enumerate(LAYER):  # rows of panels in projection order
        n, k = AWKWARD.projections()[projection]
        tflops_ax, gbps_ax, latency_ax = fig.axes[3 * row:3 * row + 3]
        assert projection in tflops_ax.get_title() and f"N={n}, K={k}" in tflops_ax.get_title()
        rows = frame[frame["projection"] == projection]
        for ax, metric in ((tflops_ax, "tflops"), (gbps_ax, "gbps"), (latency_ax, "latency_ms")):
            assert ax.get_xscale() == "log" and ax.get_xaxis().get_scale() == "log"
            lines = {line.get_label(): line for line in gid_lines(ax, "series")}
            assert set(lines) == {"naive", "torch"}
            for impl, line in lines.items():
                expected = rows[rows["impl"] == impl].sort_values("m")
                np.testing.assert_allclose(line.get_xdata(), expected["m"].to_numpy(dtype=float))
                np.testing.assert_allclose(line.get_ydata(), expected[metric].to_numpy(dtype=float))
            (ridge_line,) = gid_lines(ax, "ridge")
            assert ridge_line.get_xdata()[0] == pytest.approx(expected_crossing(ridge, n, k, 2))
        ceilings = gid_lines(tflops_ax, "ceiling")
        flat = [line for line in ceilings if np.ptp(line.get_ydata()) == 0]
        assert len(flat) == 1 and flat[0].get_ydata()[0] == pytest.approx(peak_tflops)
        (slope,) = [line for line in ceilings if np.ptp(line.get_ydata()) > 0]
        ms = np.asarray(slope.get_xdata())
        np.testing.assert_allclose(slope.get_ydata(), linear_intensity(ms, n, k, 2) * peak_gbps / 1e3)
        (floor,) = gid_lines(latency_ax, "floor")
        assert floor.get_ydata()[0] == pytest.approx(2 * n * k / peak_gbps / 1e6)


def test_linear_sweep_picks_model_and_projections_and_leaves_rows_out(rng, helpers):
    other = helpers.make_linear_rows(rng, run_id="other", config=DecoderConfig(
        hidden=777, intermediate=1999, layers=2, q_heads=7, kv_heads=1, head_dim=111, vocab=3001, name="odd-777"))
    frame = helpers.make_linear_rows(rng, interpreter_impls=("triton",))
    frame.loc[frame["m"] == 96, "noisy"] = True
    frame = conform(pd.concat([frame, other], ignore_index=True))
    fig = linear_sweep(frame, model="awkward-1k", projections=["down", "o"])
    assert len(fig.axes) == 6
    titles = [fig.axes[0].get_title(), fig.axes[3].get_title()]
    assert "· o (" in titles[0] and "· down (" in titles[1]  # the usual projection order
    for ax in fig.axes:
        for line in gid_lines(ax, "series"):
            assert line.get_label() != "triton" and 96 not in set(line.get_xdata())
    title = fig._suptitle.get_text()
    assert "interpreter-mode" in title and "noisy" in title
    assert is_no_data(linear_sweep(frame, model="no-such-model"))
    all_noisy = frame.assign(noisy=True)
    assert is_no_data(linear_sweep(all_noisy)) and is_no_data(layer_tokens_per_second(all_noisy))
    with pytest.raises(ValueError, match="projections"):
        linear_sweep(frame, projections=[3])


def test_linear_sweep_keeps_groups_apart(rng, helpers):
    gpu = helpers.make_linear_rows(rng, projections=("o",))
    host = helpers.make_linear_rows(rng, run_id="host", projections=("o",), timer="perf_counter_ns")
    fig = linear_sweep(conform(pd.concat([gpu, host], ignore_index=True)))
    assert len(fig.axes) == 6
    assert "cuda-events" in fig.axes[0].get_title() and "perf_counter_ns" in fig.axes[3].get_title()


@pytest.fixture
def attention_and_linear(rows, rng, helpers):
    attention = conform(rows)
    both = conform(pd.concat([rows, helpers.make_linear_rows(rng, interpreter_impls=("triton",))],
                             ignore_index=True))
    return attention, both


@pytest.mark.parametrize("figure", [phase_comparison, tokens_per_second, prefill_scaling, decode_scaling],
                         ids=lambda f: f.__name__)
def test_attention_figures_ignore_linear_rows(attention_and_linear, figure):
    attention, both = attention_and_linear
    alone, mixed = figure(attention), figure(both)
    assert drawn(mixed) == drawn(alone)
    assert [ax.get_title() for ax in mixed.axes] == [ax.get_title() for ax in alone.axes]
    assert mixed._suptitle.get_text() == alone._suptitle.get_text()  # the left-out count is of attention rows


def test_roofline_draws_both_operators_apart(attention_and_linear):
    attention, both = attention_and_linear
    (ax,) = roofline(both).axes
    performance = both[(both["status"] == "ok") & (both["mode"] != "interpreter")]
    rows_drawn = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_gid() != "row_roof"]
    assert sum(len(c.get_offsets()) for c in rows_drawn) == len(performance)
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert {"attention · prefill", "attention · decode", "linear · decode", "linear · prefill"} <= set(labels)
    markers = {}
    for collection in rows_drawn:
        xs = np.asarray(collection.get_offsets())[:, 0]
        ops = set(performance.loc[np.isin(performance["intensity"].to_numpy(), xs), "op"])
        markers.setdefault(ops.pop(), set()).add(collection.get_paths()[0].vertices.round(6).tobytes())
    assert not markers["attention"] & markers["linear"]
    (alone,) = roofline(attention).axes
    assert "attention · prefill" not in [text.get_text() for text in alone.get_legend().get_texts()]


def test_speedup_pairs_linear_cases_within_the_op(attention_and_linear):
    _, both = attention_and_linear
    table = speedup_table(both)
    linear = table[table["op"] == "linear"]
    assert set(linear["impl"]) == {"torch"}  # triton ran in the interpreter: never paired
    assert len(linear) == len(LAYER) * len(LINEAR_MS)
    for row in linear.itertuples(index=False):
        cases = both[(both["op"] == "linear") & (both["m"] == row.m) & (both["projection"] == row.projection)]
        naive = cases.loc[cases["impl"] == "naive", "latency_ms"].median()
        assert row.speedup == pytest.approx(naive / cases.loc[cases["impl"] == "torch", "latency_ms"].median())
    assert table[table["op"] == "attention"]["m"].isna().all()
    titles = [ax.get_title() for ax in speedup(both).axes]
    assert "linear · decode" in titles and "attention · decode" in titles


def test_tables_group_by_op(attention_and_linear):
    _, both = attention_and_linear
    summary = summary_table(both)
    assert "op" in summary.columns and not summary.duplicated(["mode", "op", "phase", "impl"]).any()
    decode_naive = summary[(summary["phase"] == "decode") & (summary["impl"] == "naive")]
    assert list(decode_naive["op"]) == ["attention", "linear"]
    status = status_table(both)
    assert status.groupby("op")["total"].sum().to_dict() == both.groupby("op").size().to_dict()
    interp = correctness_table(both)
    linear_text = interp.loc[interp["impl"] == "triton", "case"]
    assert linear_text.str.startswith("linear ").all() and linear_text.str.contains(" m96 n1000 k1000").any()


@pytest.mark.slow
def test_report_adds_the_linear_section_only_with_linear_rows(attention_and_linear, tmp_path):
    attention, both = attention_and_linear
    paths = write_report(both, tmp_path / "both")
    assert {"linear_sweep", "layer_tokens_per_second", "phase_comparison"} <= set(paths)
    assert paths["linear_sweep"].stat().st_size > 1000
    page = paths["html"].read_text()
    assert "where decode turns compute-bound" in page and "crossing_m" in page
    plain = write_report(attention, tmp_path / "attention")
    assert not {"linear_sweep", "layer_tokens_per_second"} & set(plain)
    assert "compute-bound</h2>" not in plain["html"].read_text()
    assert not (tmp_path / "attention" / "linear_sweep.png").exists()
    only_linear = write_report(op_only(both, "linear"), tmp_path / "linear")
    assert "decode_scaling" not in only_linear and "linear_sweep" in only_linear


def op_only(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    return frame[frame["op"] == op]


def test_loader_reads_linear_rows_from_runner_files_and_pytest_benchmark(rng, helpers, tmp_path):
    rows = helpers.make_linear_rows(rng, impls=("naive", "torch"), projections=("o", "down"), ms=(2, 77))
    csv_run = helpers.write_run(tmp_path / "csv-run", rows)
    parquet_run = helpers.write_run(tmp_path / "parquet-run", rows.assign(run_id="pq"), formats=("parquet",))
    bench = helpers.write_pytest_benchmark(tmp_path / "linear.json", rows, rng)
    extra = json.loads(bench.read_text())["benchmarks"][0]["extra_info"]
    assert "batch" not in extra and {"op", "m", "n", "k", "projection", "shape"} <= set(extra)
    for source in (csv_run, parquet_run, bench):
        df = load(source)
        assert len(df) == len(rows) and set(df["op"]) == {"linear"}
        assert df["batch"].isna().all() and df["kv_tokens"].isna().all()
        assert sorted(df["m"].unique()) == [2, 77] and set(df["projection"]) == {"o", "down"}
        np.testing.assert_allclose(np.sort(df["flops"]), np.sort(rows["flops"].to_numpy(dtype=float)))
        assert linear_crossings(df)["crossing_m"].notna().all()
    from_bench = load(bench)
    assert (from_bench["bound"] == rows["bound"].to_numpy()).all()
    assert from_bench["shape"].str.startswith(("o m", "down m")).all()
    mixed = load(csv_run, helpers.write_pytest_benchmark(tmp_path / "attention.json", helpers.make_rows(rng), rng))
    assert set(mixed["op"]) == {"attention", "linear"}


def test_committed_linear_sample_loads_and_crosses():
    frame = load(REPO / "analysis" / "sample" / "cpu-linear")
    assert set(frame["op"]) == {"linear"} and frame["m"].notna().all() and frame["batch"].isna().all()
    table = linear_crossings(frame)
    assert not table.empty and table["crossing_m"].gt(0).all()
    for row in table.itertuples(index=False):  # the runner's cost model and the analysis' agree
        rows = frame[(frame["projection"] == row.projection) & (frame["impl"] == row.impl)]
        elem = rows["bytes"].iloc[0] / (rows["m"].iloc[0] * row.k + row.n * row.k + rows["m"].iloc[0] * row.n)
        np.testing.assert_allclose(linear_intensity(rows["m"], row.n, row.k, elem), rows["intensity"], rtol=1e-9)
        bound = np.where(rows["m"].to_numpy(dtype=float) < row.crossing_m, "memory", "compute")
        assert (rows["bound"].to_numpy() == bound).all()


def test_loader_refuses_linear_rows_without_their_shape(rng, helpers, tmp_path):
    rows = helpers.make_linear_rows(rng, projections=("o",), ms=(5,)).drop(columns=["n"])
    helpers.write_run(tmp_path / "run", rows)
    with pytest.raises(ValueError, match="missing result column.*n"):
        load(tmp_path / "run")


def test_crossing_with_read_and_write_ceilings_by_hand():
    """2·M·N·K / P = elem·(M·K + N·K) / R + elem·M·N / W, linear in M: M = elem·N·K/R / (2·N·K/P - elem·(K/R + N/W))
    (the copy here slower than a read and a write apart, so the floor is theirs)."""
    n, k, elem = 4099, 1031, 2
    ceilings = {"tflops": 0.731, "read": 34.6, "write": 31.7, "copy": 19.9}
    peak, read, write = 0.731e12, 34.6e9, 31.7e9
    expected = elem * n * k / read / (2 * n * k / peak - elem * (k / read + n / write))
    assert crossing_m(n, k, elem, ceilings) == pytest.approx(expected, rel=1e-9)
    assert linear_roof(expected * 0.99, n, k, elem, ceilings)[2] == "memory"
    assert linear_roof(expected * 1.01, n, k, elem, ceilings)[2] == "compute"


def test_linear_findings_are_hollow_in_the_sweep_and_flag_the_layer_sums(rng, helpers):
    rows = conform(helpers.with_read_write(helpers.make_linear_rows(rng, impls=("naive", "torch")), above=3, rng=rng))
    above = rows[rows["above_roof"].astype(bool)]
    fig = linear_sweep(rows)
    drawn = {(round(float(x), 9), round(float(y), 9)) for ax in fig.axes for c in ax.collections
             if c.get_gid() == "above_roof" for x, y in c.get_offsets()}
    for row in above.itertuples(index=False):  # on each of its three panels
        for metric in ("tflops", "gbps", "latency_ms"):
            assert (round(float(row.m), 9), round(float(getattr(row, metric)), 9)) in drawn
    table = layer_tokens_per_second_table(rows)
    flagged = table[table["above_roof"]]
    summed, found = (set(zip(t["impl"], t["m"], strict=True)) for t in (table, above))
    assert set(zip(flagged["impl"], flagged["m"], strict=True)) == found & summed
    crossings = linear_crossings(rows)
    assert crossings["above_roof"].sum() == 3 and (crossings["noisy"] == 0).all()
