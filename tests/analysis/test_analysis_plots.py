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
from phasebench.analysis.schema import conform


@pytest.fixture
def frame(rows) -> pd.DataFrame:
    return conform(rows)


@pytest.fixture
def two_devices(rng, helpers) -> pd.DataFrame:
    gpu = helpers.make_rows(rng, run_id="gpu")
    cpu = helpers.make_rows(rng, run_id="cpu", device="AMD EPYC 9654", device_kind="cpu", dtype="float32",
                            impls=("naive", "flash"))
    return conform(pd.concat([gpu, cpu], ignore_index=True))


def scatter_points(ax) -> int:
    return sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))


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


def test_roofline_one_roof_per_device_and_dtype(two_devices):
    (ax,) = roofline(two_devices).axes
    roofs = [line for line in ax.get_lines() if line.get_gid() == "ceiling" and len(line.get_xdata()) > 1]
    assert len(roofs) == two_devices.groupby(["device", "dtype"]).ngroups == 2
    assert scatter_points(ax) == int((two_devices["status"] == "ok").sum())


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


PLOTS = [roofline, phase_comparison, tokens_per_second, prefill_scaling, decode_scaling, speedup]


@pytest.mark.parametrize("plot", PLOTS, ids=lambda plot: plot.__name__)
def test_plots_without_data_say_so(plot, frame):
    nothing_ok = frame.assign(status="skipped")
    for empty in (nothing_ok, frame.iloc[0:0], frame[frame["phase"] == "chunked_prefill"]):
        fig = plot(empty)
        assert isinstance(fig, Figure) and is_no_data(fig)
