"""The parsers on real captures kept in shared/fixtures/real beside the checkout (see its SOURCES.md)."""

import sqlite3
from pathlib import Path

import pytest
from phasebench.profiles import nsys, summary, torch_trace

# tests/profiles/<this file> -> checkout root -> its parent holds "shared"
REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
NSYS = REAL / "nvfuser_report1.sqlite"
HTA = REAL / "hta_benchmark_result_2869224_1695835535_trace.json.gz"


def _need(path):
    if not path.is_file():
        pytest.skip(f"real capture {path.name} not found in {REAL} (the shared folder sits beside the checkout in CI)")
    return path


@pytest.fixture(scope="module")
def nsys_kernels():
    return nsys.read_kernels(_need(NSYS))


@pytest.fixture(scope="module")
def hta_kernels():
    return torch_trace.read_kernels(_need(HTA))


def _consistent(df):
    assert (df["duration_ns"] > 0).all()
    assert (df["end_ns"] - df["start_ns"]).equals(df["duration_ns"])
    assert df["start_ns"].is_monotonic_increasing


def test_nsys_kernels(nsys_kernels):
    k = nsys_kernels
    assert len(k) == 18
    assert k["device_id"].eq(0).all() and k["stream_id"].nunique() == 1
    assert k["name"].nunique() == 13 and k["demangled_name"].nunique() == 16
    assert k["name"].notna().all() and k["correlation_id"].notna().all()
    _consistent(k)
    assert k["duration_ns"].sum() == 10_167_602
    assert k[["grid_x", "block_x", "registers_per_thread"]].gt(0).all().all()
    assert k["pid"].nunique() == 1 and k["tid"].notna().all()  # every launch found its runtime call
    assert k.attrs["schema_version"] == "3.17.1" and k.attrs["gpus"] == {0: "NVIDIA H200"}


def test_nsys_attribution(nsys_kernels):
    k = nsys_kernels
    # 8 of 18 kernels were launched inside nvFuser's host ranges, the other 10 outside any range
    assert k["nvtx_range"].notna().sum() == 8
    fused = k[k["name"].str.startswith("nvfuser_")]
    assert len(fused) == 6 and fused["nvtx_range"].eq("ExecutorRunFusion::cuLaunchKernel").all()
    assert (k["nvtx_range"] == "KernelExecutor::runFusion::intermediates").sum() == 2
    assert all(p[-1] == r for p, r in zip(k["nvtx_path"], k["nvtx_range"], strict=True) if r is not None)
    assert fused["nvtx_path"].map(len).min() >= 2


def test_nsys_attribution_matches_a_plain_sql_lookup(nsys_kernels):
    # the export reuses correlation ids in two processes, so the join needs the process too
    with sqlite3.connect(f"{NSYS.as_uri()}?mode=ro", uri=True) as con:
        repeated = con.execute("SELECT COUNT(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                               "GROUP BY correlationId HAVING COUNT(DISTINCT globalTid >> 24) > 1)").fetchone()[0]
        rows = con.execute(
            "SELECT k.correlationId, (SELECT n.text FROM NVTX_EVENTS n WHERE n.eventType = 59 "
            "AND n.globalTid = r.globalTid AND n.start <= r.start AND r.start < n.end "
            "ORDER BY n.start DESC, n.end ASC LIMIT 1) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
            "AND r.globalTid >> 24 = k.globalPid >> 24 ORDER BY k.start").fetchall()
    assert repeated > 0
    assert rows == list(zip(nsys_kernels["correlation_id"], nsys_kernels["nvtx_range"], strict=True))


def test_nsys_ranges():
    r = nsys.read_nvtx(_need(NSYS))
    assert len(r) == 13_513 and r["kind"].eq("push_pop").all()
    assert r["name"].notna().all() and r["name"].nunique() == 188
    assert r["domain"].isna().all()  # nvFuser uses the default domain
    assert (r["duration_ns"] >= 0).all() and (r["end_ns"] - r["start_ns"]).equals(r["duration_ns"])
    assert r["pid"].nunique() == 1 and r["tid"].nunique() == 9
    assert summary.summarize(nsys.read_kernels(NSYS), r).empty  # no phasebench case ranges in it


def test_hta_kernels(hta_kernels):
    k = hta_kernels
    assert k.attrs["kind"] == "kernel" and len(k) == 79
    assert k["device_id"].eq(0).all()
    assert k["stream_id"].value_counts().to_dict() == {7: 73, 20: 6}
    assert k["name"].nunique() == 16
    _consistent(k)
    assert (k["duration_ns"] % 1000 == 0).all()  # this trace has integer microseconds
    assert k[["grid_x", "block_x", "registers_per_thread", "correlation_id"]].notna().all().all()


def test_hta_attribution(hta_kernels):
    k = hta_kernels
    assert k["tid"].notna().all() and k["pid"].nunique() == 1  # each kernel found its cudaLaunchKernel
    assert k["nvtx_range"].notna().all()
    counts = k["nvtx_range"].value_counts().to_dict()
    assert counts == {"[param|pytorch.model.alex_net|0|0|0|warmup|forward]": 39,
                      "[param|pytorch.model.alex_net|0|0|0|measure|forward]": 39, "[param|cuda]": 1}
    assert k["nvtx_path"].map(len).max() == 4  # warmup|forward is nested in a range of the same name


def test_hta_ranges_and_cpu_ops():
    r = torch_trace.read_ranges(_need(HTA))
    assert len(r) == 8 and (r["duration_ns"] > 0).all()
    assert r["name"].value_counts()["[param|clear_cache]"] == 2
    ops = torch_trace.read_kernels(HTA, kind="cpu_op")
    # 359 cpu_op events, 147 of them not nested in another op (two exact-duplicate pairs are nested)
    assert len(ops) == 147 and ops["device_id"].isna().all()
    assert ops["nvtx_range"].notna().all()  # "[param|cuda]" spans the whole capture
    assert (ops["end_ns"] - ops["start_ns"]).equals(ops["duration_ns"])
