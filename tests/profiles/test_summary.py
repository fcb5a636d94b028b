"""Per-case summary from parsed kernels and ranges."""

import pandas as pd
import pytest
from phasebench.profiles import nsys, summary, torch_trace
from phasebench.profiles.names import parse_case_key


@pytest.mark.parametrize("generation", ["old", "new"])
def test_summary_of_nsys_export(nsys_export, data, generation):
    path = nsys_export(generation)
    s = summary.summarize(nsys.read_kernels(path), nsys.read_nvtx(path))
    assert list(s.columns) == summary.SUMMARY_COLUMNS
    assert s["key"].tolist() == [data.K1, data.K2]  # setup/check ranges are no rows; order of first start
    k1, k2 = s.iloc[0], s.iloc[1]
    assert k1["ranges"] == 2 and k1["wall_ns"] == 7_000 + 4_000
    # K1 owns its two attn_fwd launches and the one under "inner", not the l2flush kernel
    assert k1["kernel_count"] == 3 and k1["kernel_time_ns"] == 500 + 250 + 300
    # the l2flush range (3_100 to 3_300) nested in K1's first occurrence is not overhead either
    assert k1["flush_ns"] == 200 and k2["flush_ns"] == 0
    assert k1["launch_overhead_ns"] == k1["wall_ns"] - 200 - k1["kernel_time_ns"]
    assert (k2["ranges"], k2["wall_ns"], k2["kernel_count"], k2["kernel_time_ns"]) == (1, 6_000, 1, 300)
    for col, value in parse_case_key(data.K1).items():
        assert k1[col] == value
    assert s["causal"].dtype == bool and s["batch"].dtype == "int64" and s["kernel_time_ns"].dtype == "int64"
    assert s.equals(summary.summarize_file(path))


def test_summary_of_torch_traces(gpu_trace, cpu_trace, data):
    s = summary.summarize(torch_trace.read_kernels(gpu_trace), torch_trace.read_ranges(gpu_trace))
    assert s["key"].tolist() == [data.K1]
    row = s.iloc[0]
    assert (row["ranges"], row["wall_ns"]) == (2, 80_500)
    assert (row["kernel_count"], row["kernel_time_ns"]) == (4, 12_500 + 4_000 + 12_500 + 6_000)
    c = summary.summarize_file(cpu_trace)
    assert c[["key", "ranges", "wall_ns", "kernel_count", "kernel_time_ns", "launch_overhead_ns"]].values.tolist() == [
        [data.K2, 1, 100_000, 2, 60_250, 39_750]]


def test_attribution_without_paths_uses_the_innermost_range(data):
    kernels = pd.DataFrame({"duration_ns": [5, 7, 11], "nvtx_range": [data.K1, "l2flush", None]})
    ranges = pd.DataFrame({"name": [data.K1, f"check: {data.K1}", "other"], "duration_ns": [100, 50, 3]})
    s = summary.summarize(kernels, ranges)
    assert s[["key", "kernel_count", "kernel_time_ns", "wall_ns", "launch_overhead_ns"]].values.tolist() == [
        [data.K1, 1, 5, 100, 95]]


def test_paths_decide_ownership(data):
    paths = [(data.K1, "aten::mm"), (data.K1, "l2flush", "aten::zero_"), (f"check: {data.K1}", "aten::mm"),
             ("outer", data.K1), ()]
    kernels = pd.DataFrame({"duration_ns": [1, 2, 4, 8, 16], "nvtx_range": [p[-1] if p else None for p in paths],
                            "nvtx_path": paths})
    assert summary.attribute(kernels).tolist() == [data.K1, None, None, data.K1, None]


def test_a_range_without_kernels_and_empty_input(data):
    ranges = pd.DataFrame({"name": [data.K2], "start_ns": [0], "duration_ns": [10]})
    s = summary.summarize(pd.DataFrame({"duration_ns": [], "nvtx_range": []}), ranges)
    assert s[["kernel_count", "kernel_time_ns", "launch_overhead_ns"]].values.tolist() == [[0, 0, 10]]
    empty = summary.summarize(pd.DataFrame({"duration_ns": [], "nvtx_range": []}),
                              pd.DataFrame({"name": [], "duration_ns": []}))
    assert empty.empty and list(empty.columns) == summary.SUMMARY_COLUMNS
