"""Per-case summary from parsed kernels and ranges."""

import numpy as np
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
    # K1 owns its two attn_fwd launches and the one under "inner"; the l2flush kernel is its flush
    assert k1["kernel_count"] == 3 and k1["kernel_time_ns"] == 500 + 250 + 300
    # the l2flush range spans 200 ns on the host (3_100 to 3_300); its kernel runs 150 ns on the GPU
    assert k1["flush_ns"] == 200 and k1["flush_kernel_ns"] == 150
    assert k1["launch_overhead_ns"] == 11_000 - 1_050 - 150
    assert (k2["ranges"], k2["wall_ns"], k2["kernel_count"], k2["kernel_time_ns"]) == (1, 6_000, 1, 300)
    assert (k2["flush_ns"], k2["flush_kernel_ns"], k2["launch_overhead_ns"]) == (0, 0, 5_700)
    for col, value in parse_case_key(data.K1).items():
        assert pd.isna(k1[col]) if value is None else k1[col] == value
    assert s["causal"].dtype == "boolean" and s["batch"].dtype == "Int64" and s["kernel_time_ns"].dtype == "int64"
    assert s.equals(summary.summarize_file(path))


def test_summary_of_torch_traces(gpu_trace, cpu_trace, data):
    s = summary.summarize(torch_trace.read_kernels(gpu_trace), torch_trace.read_ranges(gpu_trace))
    assert s["key"].tolist() == [data.K1]
    row = s.iloc[0]
    assert (row["ranges"], row["wall_ns"]) == (2, 80_500)
    assert (row["kernel_count"], row["kernel_time_ns"]) == (4, 12_500 + 4_000 + 12_500 + 6_000)
    # zero_l2 (3.25 us on the GPU) ran in the 5 us l2flush range nested in K1
    assert (row["flush_ns"], row["flush_kernel_ns"]) == (5_000, 3_250)
    assert row["launch_overhead_ns"] == 80_500 - 35_000 - 3_250
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
    owners = summary.owners(kernels)
    assert owners["key"].tolist() == [data.K1, data.K1, None, data.K1, None]
    assert owners["flush"].tolist() == [False, True, False, False, False]


def test_launch_overhead_takes_the_flush_kernels_gpu_time_not_the_flush_ranges_host_span(data):
    """Two timed cases, on two threads; the flush kernels run far shorter than their ranges are open."""
    rng = np.random.default_rng(7)
    ranges, kernels = [], []
    expected = {}
    for tid, key, t0 in ((11, data.K1, 1_000), (12, data.K2, 1_300)):
        case_ns = flush_ns = host_ns = 0
        for occ in range(2):
            start = t0 + occ * 100_000
            ranges.append((key, start, start + 90_001, tid))
            for i in range(3):  # three samples: flush, then two of the case's kernels
                f0 = start + 100 + 29_000 * i
                host = int(rng.integers(3_000, 9_000))
                ranges.append(("l2flush", f0, f0 + host, tid))
                host_ns += host
                dur = int(rng.integers(10, 700))  # GPU time of the flush kernel
                kernels.append((dur, (key, "l2flush")))
                flush_ns += dur
                for _ in range(2):
                    dur = int(rng.integers(50, 5_000))
                    kernels.append((dur, (key, "aten::mm") if i else (key,)))
                    case_ns += dur
        expected[key] = (host_ns, case_ns, flush_ns, 2 * 90_001 - case_ns - flush_ns)
    ranges.append(("l2flush", 500, 600, 11))  # a flush outside every timed range (e.g. in setup)
    ranges.append((f"setup: {data.K1}", 400, 700, 11))
    kernels += [(333, (f"setup: {data.K1}", "l2flush")), (444, ("l2flush",)), (555, ())]
    r = pd.DataFrame(ranges, columns=["name", "start_ns", "end_ns", "tid"]).assign(
        duration_ns=lambda d: d.end_ns - d.start_ns)
    k = pd.DataFrame({"duration_ns": [d for d, _ in kernels], "nvtx_path": [p for _, p in kernels],
                      "nvtx_range": [p[-1] if p else None for _, p in kernels]})
    s = summary.summarize(k, r)
    got = s.set_index("key")[["flush_ns", "kernel_time_ns", "flush_kernel_ns", "launch_overhead_ns"]]
    assert {key: tuple(v) for key, v in got.iterrows()} == expected
    assert (s["kernel_count"] == 12).all()
    # the kernels left out are those outside timed ranges, nothing in a timed range is dropped
    placed = s["kernel_time_ns"].sum() + s["flush_kernel_ns"].sum()
    assert placed == k["duration_ns"].sum() - 333 - 444 - 555
    assert (s["flush_ns"] != s["flush_kernel_ns"]).all()  # so the old wall - flush_ns - kernels would differ


def test_a_range_without_kernels_and_empty_input(data):
    ranges = pd.DataFrame({"name": [data.K2], "start_ns": [0], "duration_ns": [10]})
    s = summary.summarize(pd.DataFrame({"duration_ns": [], "nvtx_range": []}), ranges)
    assert s[["kernel_count", "kernel_time_ns", "launch_overhead_ns"]].values.tolist() == [[0, 0, 10]]
    empty = summary.summarize(pd.DataFrame({"duration_ns": [], "nvtx_range": []}),
                              pd.DataFrame({"name": [], "duration_ns": []}))
    assert empty.empty and list(empty.columns) == summary.SUMMARY_COLUMNS
