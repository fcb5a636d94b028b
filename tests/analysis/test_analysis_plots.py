"""Plot tests: each figure function returns a Figure with the expected points, labels and scales."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from phasebench.analysis import (
    decode_scaling,
    phase_comparison,
    prefill_scaling,
    roofline,
    speedup,
    speedup_table,
    tokens_per_second,
)
from phasebench.bench.spec.schema import conform


@pytest.fixture
def frame(rows) -> pd.DataFrame:
    return conform(rows)


@pytest.fixture
def two_devices(rng, helpers) -> pd.DataFrame:
    gpu = helpers.make_rows(rng, run_id="gpu")
    cpu = helpers.make_rows(rng, run_id="cpu", device="AMD EPYC 9654", device_kind="cpu", dtype="float32",
                            impls=("naive", "flash"))
    return conform(pd.concat([gpu, cpu], ignore_index=True))


def row_collections(ax) -> list:
    """The scatters that stand for rows (a row's own roof, gid "row_roof", is a mark beside its point)."""
    return [c for c in ax.collections if isinstance(c, PathCollection) and c.get_gid() != "row_roof"]


def scatter_points(ax) -> int:
    return sum(len(c.get_offsets()) for c in row_collections(ax))


def series_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid() == "series"]


def data_axes(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.axison]


def assert_labelled(fig: Figure) -> None:
    for ax in data_axes(fig):
        assert ax.get_xlabel() or not ax.get_xticklabels(), "x axis without a label"
        assert ax.get_ylabel(), "y axis without a label"


def is_no_data(fig: Figure) -> bool:
    return any(text.get_text().startswith("no data") for ax in fig.axes for text in ax.texts)


def test_roofline_points_scales_and_ceilings(frame):
    fig = roofline(frame)
    (ax,) = fig.axes
    ok = frame[frame["status"] == "ok"]
    assert isinstance(fig, Figure)
    assert scatter_points(ax) == len(ok)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "intensity" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    assert ax.get_legend() is not None
    ceilings = [line for line in ax.get_lines() if line.get_gid() == "ceiling"]
    roofs = [line for line in ceilings if len(line.get_xdata()) > 1]
    assert [line.get_linestyle() for line in roofs] == ["-"]  # no datasheet columns: measured only
    ridge = [line for line in ceilings if len(line.get_xdata()) == 1]
    peak_tflops, peak_gbps = ok["peak_tflops"].iloc[0], ok["peak_gbps"].iloc[0]
    np.testing.assert_allclose(ridge[0].get_xdata(), [peak_tflops * 1e3 / peak_gbps])
    np.testing.assert_allclose(ridge[0].get_ydata(), [peak_tflops])
    # The roof is min(x * GB/s / 1000, peak TFLOP/s).
    xs, ys = roofs[0].get_xdata(), roofs[0].get_ydata()
    np.testing.assert_allclose(ys, np.minimum(np.asarray(xs) * peak_gbps / 1e3, peak_tflops))


def test_roofline_datasheet_from_columns_and_argument(frame):
    with_sheet = frame.assign(datasheet_tflops=989.0, datasheet_gbps=4800.0)
    (ax,) = roofline(with_sheet).axes
    styles = sorted(line.get_linestyle() for line in ax.get_lines()
                    if line.get_gid() == "ceiling" and len(line.get_xdata()) > 1)
    assert styles == ["-", "--"]
    sheet = {"NVIDIA H200": {"peak_gbps": 4800.0, "peak_tflops": {"bfloat16": 989.0}}}
    (ax,) = roofline(frame, datasheet=sheet).axes
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and max(dashed[0].get_ydata()) == pytest.approx(989.0)


def test_roofline_one_panel_per_group_with_its_roof(two_devices):
    fig = roofline(two_devices)
    assert [ax.get_title() for ax in fig.axes] == ["AMD EPYC 9654 · compiled · perf_counter_ns",
                                                   "NVIDIA H200 · compiled · cuda-events"]
    for ax in fig.axes:
        roofs = [line for line in ax.get_lines() if line.get_gid() == "ceiling" and len(line.get_xdata()) > 1]
        assert len(roofs) == 1
    assert sum(scatter_points(ax) for ax in fig.axes) == int((two_devices["status"] == "ok").sum())


def plotted_points(fig: Figure) -> set[tuple[float, float]]:
    return {(round(float(x), 9), round(float(y), 9)) for ax in fig.axes for c in row_collections(ax)
            for x, y in c.get_offsets()}


def row_points(rows: pd.DataFrame) -> set[tuple[float, float]]:
    return {(round(float(x), 9), round(float(y), 9)) for x, y in zip(rows["intensity"], rows["tflops"], strict=True)}


def test_roofline_leaves_interpreter_rows_out(mixed):
    fig = roofline(mixed)
    in_interpreter = mixed[mixed["mode"] == "interpreter"]
    compiled = mixed[mixed["mode"] == "compiled"]
    assert len(in_interpreter) and not (plotted_points(fig) & row_points(in_interpreter))
    assert plotted_points(fig) == row_points(compiled)
    assert sum(scatter_points(ax) for ax in fig.axes) == len(compiled)
    assert sorted(ax.get_title() for ax in fig.axes) == [
        "AMD EPYC 9654 · compiled · perf_counter_ns",
        "NVIDIA H200 · compiled · cuda-events",
        "NVIDIA H200 · compiled · perf_counter_ns",
    ]
    assert f"{len(in_interpreter)} interpreter-mode" in fig._suptitle.get_text()


def test_only_interpreter_rows_give_no_performance_figure(mixed):
    cpu_triton = mixed[(mixed["device"] == "AMD EPYC 9654") & (mixed["impl"] == "triton")]
    for plot in PLOTS:
        fig = plot(cpu_triton)
        assert is_no_data(fig), plot.__name__


def test_noisy_rows_are_left_out_with_a_note(frame, rng):
    picks = rng.choice(np.flatnonzero(frame["status"] == "ok"), size=5, replace=False)
    noisy = frame.copy()
    noisy.loc[picks, "noisy"] = True
    fig = roofline(noisy)
    assert not (plotted_points(fig) & row_points(noisy.loc[picks]))
    assert sum(scatter_points(ax) for ax in fig.axes) == int((frame["status"] == "ok").sum()) - 5
    assert "5 noisy" in fig._suptitle.get_text()
    assert "noisy" in phase_comparison(noisy)._suptitle.get_text()


def test_phase_comparison(frame):
    fig = phase_comparison(frame)
    ok = frame[frame["status"] == "ok"]
    axes = data_axes(fig)
    assert len(axes) == 2 * ok["phase"].nunique()
    latency_axes = [ax for ax in axes if ax.get_ylabel() == "latency (ms)"]
    pct_axes = [ax for ax in axes if "roofline" in ax.get_ylabel()]
    assert sum(scatter_points(ax) for ax in latency_axes) == len(ok)
    assert sum(scatter_points(ax) for ax in pct_axes) == len(ok)
    assert {ax.get_title() for ax in latency_axes} == {"prefill", "decode"}
    assert all(ax.get_yscale() == "log" for ax in latency_axes)
    assert_labelled(fig)


def test_tokens_per_second(frame):
    fig = tokens_per_second(frame)
    (ax,) = data_axes(fig)
    ok = frame[frame["status"] == "ok"]
    assert scatter_points(ax) == len(ok)
    assert len(ax.patches) == ok.groupby(["impl", "phase"]).ngroups
    assert ax.get_yscale() == "log" and ax.get_title() == "llama3-8b"
    assert_labelled(fig)
    # The first bar is naive prefill: median of batch * q_len / latency.
    naive_prefill = ok[(ok["impl"] == "naive") & (ok["phase"] == "prefill")]
    expected = np.median(naive_prefill["batch"] * naive_prefill["q_len"] / (naive_prefill["latency_ms"] / 1e3))
    assert ax.patches[0].get_height() == pytest.approx(expected)
    naive_decode = ok[(ok["impl"] == "naive") & (ok["phase"] == "decode")]
    expected = np.median(naive_decode["batch"] / (naive_decode["latency_ms"] / 1e3))
    assert ax.patches[1].get_height() == pytest.approx(expected)


def test_tokens_per_second_one_model_of_several(rng, helpers):
    both = conform(pd.concat([helpers.make_rows(rng, model="llama3-8b"),
                              helpers.make_rows(rng, model="mistral-7b", impls=("flash",))]))
    assert len(data_axes(tokens_per_second(both))) == 2
    fig = tokens_per_second(both, model="mistral-7b")
    (ax,) = data_axes(fig)
    expected = both[(both["model"] == "mistral-7b") & (both["status"] == "ok")]
    assert scatter_points(ax) == len(expected)
    assert is_no_data(tokens_per_second(both, model="no-such-model"))


def test_prefill_scaling(frame):
    fig = prefill_scaling(frame)
    latency_ax, tflops_ax = fig.axes
    ok = frame[(frame["status"] == "ok") & (frame["phase"] == "prefill")]
    for ax in (latency_ax, tflops_ax):
        lines = series_lines(ax)
        assert len(lines) == ok["impl"].nunique()
        for line in lines:
            impl = line.get_label().split(" · ")[0]
            assert list(line.get_xdata()) == sorted(ok.loc[ok["impl"] == impl, "q_len"].unique())
        assert ax.get_xscale() == "log"
    naive = ok[ok["impl"] == "naive"].sort_values("q_len")
    (naive_line,) = [line for line in series_lines(latency_ax) if line.get_label() == "naive"]
    np.testing.assert_allclose(naive_line.get_ydata(), naive["latency_ms"])
    assert latency_ax.get_yscale() == "log"
    assert_labelled(fig)


def test_prefill_scaling_labels_dtypes(rng, helpers):
    mixed = conform(pd.concat([helpers.make_rows(rng), helpers.make_rows(rng, dtype="float16")]))
    labels = {line.get_label() for line in series_lines(prefill_scaling(mixed).axes[0])}
    assert "flash · bfloat16" in labels and "flash · float16" in labels


def test_decode_scaling(frame):
    fig = decode_scaling(frame)
    (ax,) = fig.axes
    ok = frame[(frame["status"] == "ok") & (frame["phase"] == "decode")]
    lines = series_lines(ax)
    assert len(lines) == ok.groupby(["impl", "batch"]).ngroups
    assert sum(len(line.get_xdata()) for line in lines) == ok.groupby(["impl", "batch", "kv_len"]).ngroups
    peak = [line for line in ax.get_lines() if line.get_gid() == "ceiling"]
    assert len(peak) == 1 and peak[0].get_ydata()[0] == pytest.approx(ok["peak_gbps"].iloc[0])
    assert "KV length" in ax.get_xlabel() and "GB/s" in ax.get_ylabel()


def test_scaling_one_panel_per_device(two_devices):
    assert len(decode_scaling(two_devices).axes) == 2
    assert len(prefill_scaling(two_devices).axes) == 4


def test_scaling_one_panel_per_group_without_interpreter_lines(mixed):
    fig = decode_scaling(mixed)
    assert len(fig.axes) == 3  # two GPU timers, the CPU; its interpreter triton rows are not drawn
    labels = {ax.get_title(): {line.get_label() for line in series_lines(ax)} for ax in fig.axes}
    cpu = labels["AMD EPYC 9654 · compiled · perf_counter_ns"]
    assert cpu and not any(label.startswith("triton") for label in cpu)
    assert any(label.startswith("triton") for label in labels["NVIDIA H200 · compiled · perf_counter_ns"])
    assert len(prefill_scaling(mixed).axes) == 6


def test_strips_are_labelled_by_group(mixed):
    fig = phase_comparison(mixed)
    ticks = {tick.get_text() for ax in fig.axes for tick in ax.get_xticklabels()}
    assert "triton · NVIDIA H200 · cuda-events · bfloat16" in ticks
    assert "triton · NVIDIA H200 · perf_counter_ns · bfloat16" in ticks
    assert not any(tick.startswith("triton · AMD") for tick in ticks)
    ok = mixed[(mixed["status"] == "ok") & (mixed["mode"] == "compiled")]
    latency_axes = [ax for ax in fig.axes if ax.get_ylabel() == "latency (ms)"]
    assert sum(scatter_points(ax) for ax in latency_axes) == len(ok)


def test_speedup_table_and_plot(two_devices):
    table = speedup_table(two_devices, baseline="naive")
    ok = two_devices[two_devices["status"] == "ok"]
    keys = ["phase", "batch", "q_len", "kv_len", "device", "dtype"]
    latency = ok.set_index(keys + ["impl"])["latency_ms"]
    for row in table.itertuples(index=False):
        key = tuple(getattr(row, name) for name in keys)
        assert row.speedup == pytest.approx(latency[key + ("naive",)] / latency[key + (row.impl,)])
    assert "naive" not in set(table["impl"])
    fig = speedup(two_devices, baseline="naive")
    axes = data_axes(fig)
    assert sum(scatter_points(ax) for ax in axes) == len(table)
    assert all(ax.get_yscale() == "log" and "naive" in ax.get_ylabel() for ax in axes)
    assert is_no_data(speedup(two_devices, baseline="cudnn"))


def test_speedup_pairs_only_rows_of_one_device_mode_and_timer(mixed):
    table = speedup_table(mixed, baseline="naive")
    ok = mixed[(mixed["status"] == "ok") & (mixed["mode"] == "compiled")]
    keys = ["device", "timer", "phase", "batch", "q_len", "kv_len"]
    latency = ok.set_index(keys + ["impl"])["latency_ms"]
    assert latency.index.is_unique
    for row in table.itertuples(index=False):
        key = tuple(getattr(row, name) for name in keys)
        assert row.speedup == pytest.approx(latency[key + ("naive",)] / latency[key + (row.impl,)])
    # CPU triton ran in the interpreter: no pair with the compiled CPU naive rows.
    assert not ((table["device"] == "AMD EPYC 9654") & (table["impl"] == "triton")).any()
    assert set(table["mode"]) == {"compiled"}
    gpu = table[table["device"] == "NVIDIA H200"]
    per_timer = gpu.groupby("timer").size().to_dict()
    cases = ok[(ok["device"] == "NVIDIA H200") & (ok["impl"] == "naive")].groupby("timer").size().to_dict()
    assert per_timer == {timer: 2 * count for timer, count in cases.items()}  # flash and triton each
    assert len(table) == sum(per_timer.values()) + len(ok[(ok["device"] == "AMD EPYC 9654") & (ok["impl"] == "flash")])


def test_speedup_of_an_interpreter_row_over_a_compiled_one_is_no_pair(mixed):
    cpu = mixed[(mixed["device"] == "AMD EPYC 9654") & mixed["impl"].isin(["naive", "triton"])]
    assert speedup_table(cpu, baseline="naive").empty
    assert is_no_data(speedup(cpu, baseline="naive"))


PLOTS = [roofline, phase_comparison, tokens_per_second, prefill_scaling, decode_scaling, speedup]


@pytest.mark.parametrize("plot", PLOTS, ids=lambda plot: plot.__name__)
def test_plots_without_data_say_so(plot, frame):
    nothing_ok = frame.assign(status="skipped")
    for empty in (nothing_ok, frame.iloc[0:0], frame[frame["phase"] == "chunked_prefill"]):
        fig = plot(empty)
        assert isinstance(fig, Figure) and is_no_data(fig)


@pytest.fixture
def findings(rng, helpers) -> pd.DataFrame:
    """Schema 5 rows (read and write bytes, the three ceilings), five of the ok ones above their roof."""
    return conform(helpers.with_read_write(helpers.make_rows(rng, not_ok=True), above=5, rng=rng))


def hollow(ax) -> list:
    return [c for c in ax.collections if isinstance(c, PathCollection) and c.get_gid() == "above_roof"]


def hollow_points(fig: Figure) -> set[tuple[float, float]]:
    return {(round(float(x), 9), round(float(y), 9)) for ax in fig.axes for c in hollow(ax) for x, y in c.get_offsets()}


def test_rows_above_their_roof_are_drawn_hollow_and_labelled_never_dropped(findings):
    above = findings[findings["above_roof"].astype(bool)]
    assert len(above) == 5 and (above["pct_roofline"] > 105).all()
    fig = roofline(findings)
    (ax,) = fig.axes
    assert hollow_points(fig) == row_points(above)  # each finding where its figures put it
    assert all((c.get_facecolors()[:, 3] == 0).all() for c in hollow(ax))  # hollow: no fill
    assert plotted_points(fig) == row_points(findings[findings["status"] == "ok"])  # nothing dropped
    labels = sorted(t.get_text() for t in ax.texts if t.get_gid() == "above_roof")
    assert labels == sorted(f"{pct:.0f}%" for pct in above["pct_roofline"])
    assert "hollow: 5 above their roof" in fig._suptitle.get_text()
    assert any("above its roof" in t.get_text() for t in ax.get_legend().get_texts())


@pytest.mark.parametrize("plot", [phase_comparison, tokens_per_second, prefill_scaling, decode_scaling],
                         ids=lambda plot: plot.__name__)
def test_every_figure_draws_its_findings_hollow(findings, plot):
    above = findings[findings["above_roof"].astype(bool)]
    fig = plot(findings)
    phases = {"prefill_scaling": {"prefill"}, "decode_scaling": {"decode"}}.get(plot.__name__,
                                                                                {"prefill", "decode"})
    mine = above[above["phase"].isin(phases)]
    drawn = sum(len(c.get_offsets()) for ax in fig.axes for c in hollow(ax))
    per_row = 2 if plot is phase_comparison or plot is prefill_scaling else 1  # two metrics: two panels
    assert drawn == per_row * len(mine)
    if len(mine):
        assert "above their roof" in fig._suptitle.get_text() or "above its roof" in fig._suptitle.get_text()


def test_a_finding_stays_out_of_the_medians(findings):
    one = findings[findings["above_roof"].astype(bool)].iloc[0]
    same = findings[(findings["phase"] == one["phase"]) & (findings["impl"] == one["impl"])
                    & (findings["status"] == "ok")]
    clean = same[~same["above_roof"].astype(bool)]
    ax = next(ax for ax in phase_comparison(findings).axes
              if ax.get_title() == one["phase"] and ax.get_ylabel() == "latency (ms)")
    medians = {round(float(segment[0][1]), 9) for c in ax.collections if not isinstance(c, PathCollection)
               for segment in c.get_segments()}
    assert round(float(np.median(clean["latency_ms"])), 9) in medians
    pooled = round(float(np.median(same["latency_ms"])), 9)
    assert pooled == round(float(np.median(clean["latency_ms"])), 9) or pooled not in medians


def test_speedup_marks_pairs_with_a_finding(findings):
    table = speedup_table(findings, baseline="naive")
    above = findings[findings["above_roof"].astype(bool) & (findings["status"] == "ok")]
    assert table["above_roof"].any() and table["above_roof"].sum() <= len(above) * 2
    fig = speedup(findings)
    assert sum(len(c.get_offsets()) for ax in fig.axes for c in hollow(ax)) == int(table["above_roof"].sum())


def test_the_roofline_draws_read_write_and_copy_slopes_and_each_rows_roof(findings):
    (ax,) = roofline(findings).axes
    ok = findings[findings["status"] == "ok"]
    peak, read, write, copy = (float(ok[c].iloc[0]) for c in ("peak_tflops", "read_gbps", "write_gbps", "peak_gbps"))
    roofs = [line for line in ax.get_lines() if line.get_gid() == "ceiling" and len(line.get_xdata()) > 1]
    assert len(roofs) == 3  # read, write, copy: one device, one dtype, no datasheet
    for line, gbps in zip(roofs, (read, write, copy), strict=True):
        xs = np.asarray(line.get_xdata())
        np.testing.assert_allclose(line.get_ydata(), np.minimum(xs * gbps / 1e3, peak))
    assert roofs[0].get_linewidth() > roofs[1].get_linewidth()  # read leads; write and copy lighter
    assert [line.get_linestyle() for line in roofs] == ["-", ":", "-."]
    (ridge,) = [line for line in ax.get_lines() if line.get_gid() == "ceiling" and len(line.get_xdata()) == 1]
    np.testing.assert_allclose(ridge.get_xdata(), [peak * 1e3 / read])  # the ridge of the read roof
    (marks,) = [c for c in ax.collections if c.get_gid() == "row_roof"]
    got = {(round(float(x), 9), round(float(y), 9)) for x, y in marks.get_offsets()}
    assert got == {(round(float(x), 9), round(float(y), 9)) for x, y in zip(ok["intensity"], ok["roof_tflops"],
                                                                          strict=True)}
