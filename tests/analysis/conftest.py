"""Fixtures for the analysis tests: synthetic result rows, run folders and pytest-benchmark files."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import RESULT_COLUMNS
from phasebench.bench.spec.models import DecoderConfig
from phasebench.bench.spec.schema import conform

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PEAKS = {  # (device, dtype) -> (peak_tflops, peak_gbps), "measured"
    ("NVIDIA H200", "bfloat16"): (720.0, 4300.0),
    ("NVIDIA H200", "float16"): (730.0, 4300.0),
    ("AMD EPYC 9654", "float32"): (2.5, 180.0),
    ("AMD EPYC 9654", "bfloat16"): (1.2, 180.0),
}
# A decoder of awkward sizes: qkv 1500x1000, o 1000x1000, gate_up 5460x1000, down 1000x2730, lm_head 5003x1000.
AWKWARD = DecoderConfig(hidden=1000, intermediate=2730, layers=3, q_heads=8, kv_heads=2, head_dim=125, vocab=5003,
                        name="awkward-1k")
LINEAR_MS = (1, 3, 8, 24, 96, 384, 1536)
NAN_PERF = ("latency_ms", "latency_p20_ms", "latency_p80_ms", "tflops", "gbps", "pct_roofline")


def _case_cost(batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal, dtype):
    if causal:
        pairs = q_len * (kv_len - q_len) + q_len * (q_len + 1) / 2
    else:
        pairs = q_len * kv_len
    flops = 4.0 * batch * q_heads * head_dim * pairs
    moved = ELEMENT_BYTES[dtype] * (2 * batch * q_heads * q_len * head_dim + 2 * batch * kv_heads * kv_len * head_dim)
    return flops, float(moved)


def make_rows(
    rng: np.random.Generator,
    *,
    run_id: str = "run-a",
    device: str = "NVIDIA H200",
    device_kind: str = "cuda",
    impls=("naive", "flash", "triton"),
    dtype: str = "bfloat16",
    model: str = "llama3-8b",
    prefill_lens=(128, 256, 512),
    decode_kv_lens=(256, 1024, 4096),
    decode_batches=(1, 8),
    not_ok: bool = True,
    timer: str | None = None,
    interpreter_impls=(),
    noisy: bool = False,
    profiled: bool = False,
) -> pd.DataFrame:
    """Result rows as the runner writes them, with random (seeded) latencies and consistent figures.

    timer defaults to the runner's clock for the device kind; impls in interpreter_impls run
    in mode "interpreter"; noisy and profiled set those flags on every row.
    """
    peak_tflops, peak_gbps = PEAKS[(device, dtype)]
    timer = timer or ("cuda-events" if device_kind == "cuda" else "perf_counter_ns")
    shapes = [(1, length, length, True) for length in prefill_lens]
    shapes += [(batch, 1, kv_len, False) for batch in decode_batches for kv_len in decode_kv_lens]
    rows = []
    for impl in impls:
        for batch, q_len, kv_len, causal in shapes:
            flops, moved = _case_cost(batch, 32, 8, q_len, kv_len, 128, causal, dtype)
            intensity = flops / moved
            roof = min(peak_tflops, intensity * peak_gbps / 1e3)
            achieved = roof * rng.uniform(0.05, 0.9)
            latency_ms = flops / (achieved * 1e12) * 1e3
            rows.append({
                "run_id": run_id, "time": "2025-06-01T12:00:00+00:00", "device": device,
                "device_kind": device_kind, "suite": "quick", "model": model, "op": "attention", "impl": impl,
                "backend": {"naive": "torch", "flash": "sdpa-flash"}.get(impl, "triton-prefill"),
                "mode": "interpreter" if impl in interpreter_impls else "compiled",
                "phase": "prefill" if q_len == kv_len else "decode",
                "batch": batch, "q_heads": 32, "kv_heads": 8, "q_len": q_len, "kv_len": kv_len,
                "head_dim": 128, "causal": causal, "dtype": dtype, "seqlens": "", "kv_tokens": batch * kv_len,
                "flops": flops, "bytes": moved, "intensity": intensity,
                "latency_ms": latency_ms,
                "latency_p20_ms": latency_ms * (1 - rng.uniform(0.005, 0.05)),
                "latency_p80_ms": latency_ms * (1 + rng.uniform(0.005, 0.05)),
                "samples": int(rng.integers(20, 200)), "timer": timer,
                "noisy": noisy, "noise_reason": "another process held the CPU" if noisy else "",
                "tflops": flops / (latency_ms / 1e3) / 1e12, "gbps": moved / (latency_ms / 1e3) / 1e9,
                "peak_tflops": peak_tflops, "peak_gbps": peak_gbps, "roof_tflops": roof,
                "pct_roofline": 100 * achieved / roof,
                "bound": "memory" if intensity * peak_gbps / 1e3 < peak_tflops else "compute",
                "max_rel_err": float(rng.uniform(1e-4, 5e-3)), "status": "ok", "reason": "",
                "profiled": profiled,
            })
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    if not_ok:
        statuses = [("skipped", "Unsupported: triton decode needs head_dim <= 256"),
                    ("failed", "RuntimeError: out of memory"),
                    ("incorrect", "max_rel_err 0.3 > tolerance 0.02")]
        picks = rng.choice(len(frame), size=len(statuses), replace=False)
        for index, (status, reason) in zip(picks, statuses, strict=True):
            frame.loc[index, ["status", "reason"]] = [status, reason]
            frame.loc[index, list(NAN_PERF)] = np.nan
    return frame


def make_linear_rows(
    rng: np.random.Generator,
    *,
    run_id: str = "lin-a",
    device: str = "NVIDIA H200",
    device_kind: str = "cuda",
    impls=("naive", "torch", "triton"),
    dtype: str = "bfloat16",
    config: DecoderConfig = AWKWARD,
    projections=("qkv", "o", "gate_up", "down"),
    ms=LINEAR_MS,
    drop=(),
    timer: str | None = None,
    interpreter_impls=(),
    noisy: bool = False,
) -> pd.DataFrame:
    """Linear result rows as the runner writes them (attention columns empty): x [m, k] times w [n, k]
    for each projection of `config`, random (seeded) latencies under the roofline of PEAKS;
    (projection, m) pairs in `drop` are not measured. M up to 256 is decode, above it prefill."""
    peak_tflops, peak_gbps = PEAKS[(device, dtype)]
    elem = ELEMENT_BYTES[dtype]
    timer = timer or ("cuda-events" if device_kind == "cuda" else "perf_counter_ns")
    shapes = config.projections()
    rows = []
    for impl in impls:
        for projection in projections:
            n, k = shapes[projection]
            for m in ms:
                if (projection, m) in drop:
                    continue
                flops, moved = 2.0 * m * n * k, float(elem * (m * k + n * k + m * n))
                intensity = flops / moved
                roof = min(peak_tflops, intensity * peak_gbps / 1e3)
                achieved = roof * rng.uniform(0.05, 0.9)
                latency_ms = flops / (achieved * 1e12) * 1e3
                rows.append({
                    "run_id": run_id, "time": "2025-06-03T09:00:00+00:00", "device": device,
                    "device_kind": device_kind, "suite": "decode-linear", "model": config.name, "op": "linear",
                    "impl": impl, "backend": {"naive": "torch-loops", "torch": "F.linear"}.get(impl, "triton-gemm"),
                    "mode": "interpreter" if impl in interpreter_impls else "compiled",
                    "phase": "decode" if m <= 256 else "prefill", "shape": f"{projection} m{m} n{n} k{k}",
                    "dtype": dtype, "seqlens": "", "m": m, "n": n, "k": k, "projection": projection,
                    "flops": flops, "bytes": moved, "intensity": intensity, "latency_ms": latency_ms,
                    "latency_p20_ms": latency_ms * (1 - rng.uniform(0.005, 0.05)),
                    "latency_p80_ms": latency_ms * (1 + rng.uniform(0.005, 0.05)),
                    "samples": int(rng.integers(20, 200)), "timer": timer,
                    "noisy": noisy, "noise_reason": "another process held the CPU" if noisy else "",
                    "tflops": flops / (latency_ms / 1e3) / 1e12, "gbps": moved / (latency_ms / 1e3) / 1e9,
                    "peak_tflops": peak_tflops, "peak_gbps": peak_gbps, "roof_tflops": roof,
                    "pct_roofline": 100 * achieved / roof,
                    "bound": "memory" if intensity * peak_gbps / 1e3 < peak_tflops else "compute",
                    "max_rel_err": float(rng.uniform(1e-4, 5e-3)), "status": "ok", "reason": "", "profiled": False,
                })
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


# device -> read, write GB/s; with PEAKS' copy, a read plus a write apart is faster than the copy's pair here
STREAMS = {"NVIDIA H200": (4600.0, 4400.0), "AMD EPYC 9654": (205.0, 170.0)}


def with_read_write(rows: pd.DataFrame, above: int = 0, rng: np.random.Generator | None = None) -> pd.DataFrame:
    """Rows of make_rows or make_linear_rows as schema 5 writes them: their read and write bytes (by hand: q, k, v in
    and o out; x and w in, y out), the device's read and write ceilings (STREAMS) beside its copy, the roof of their
    floor (read/R + write/W: the copy is slower here) and latencies under it; `above` ok rows, drawn with `rng`,
    made 110-190% of their roof and flagged, as the runner flags them."""
    out = rows.copy()
    out["above_roof"] = out["above_roof"].astype(object).where(out["above_roof"].notna(), False).astype(bool)
    out["reason"] = out["reason"].astype(object)
    elem = out["dtype"].map(ELEMENT_BYTES).astype(float)
    attention = out["op"] == "attention"
    q = out["batch"] * out["q_heads"] * out["q_len"] * out["head_dim"]
    kv = 2 * out["batch"] * out["kv_heads"] * out["kv_len"] * out["head_dim"]
    x_w, y = out["m"] * out["k"] + out["n"] * out["k"], out["m"] * out["n"]
    out["read_bytes"] = elem * np.where(attention, q + kv, x_w)
    out["write_bytes"] = elem * np.where(attention, q, y)
    out["read_gbps"] = out["device"].map(lambda name: STREAMS[name][0])
    out["write_gbps"] = out["device"].map(lambda name: STREAMS[name][1])
    floor = out["read_bytes"] / (out["read_gbps"] * 1e9) + out["write_bytes"] / (out["write_gbps"] * 1e9)
    out["roof_tflops"] = np.minimum(out["peak_tflops"], out["flops"] / floor / 1e12)
    out["bound"] = np.where(floor > out["flops"] / (out["peak_tflops"] * 1e12), "memory", "compute")
    out["roof_model"] = "read+write"
    ok = out["status"] == "ok"
    share = out.loc[ok, "pct_roofline"] / 100  # the share of its roof each row had, kept on the new roof
    out.loc[ok, "latency_ms"] = 1e3 * out.loc[ok, "flops"] / (out.loc[ok, "roof_tflops"] * 1e12 * share)
    if above:
        picks = (rng or np.random.default_rng(11)).choice(np.flatnonzero(ok), size=above, replace=False)
        over = (rng or np.random.default_rng(11)).uniform(1.1, 1.9, size=above)
        out.loc[out.index[picks], "latency_ms"] = 1e3 * out["flops"].iloc[picks] / (
            out["roof_tflops"].iloc[picks] * 1e12 * over)
        out.loc[out.index[picks], "above_roof"] = True
        out.loc[out.index[picks], "reason"] = "above roof: a finding"
    seconds = out["latency_ms"] / 1e3
    out.loc[ok, "tflops"] = out["flops"] / seconds / 1e12
    out.loc[ok, "gbps"] = out["bytes"] / seconds / 1e9
    out.loc[ok, "pct_roofline"] = 100 * out["tflops"] / out["roof_tflops"]
    out.loc[ok, ["latency_p20_ms", "latency_p80_ms"]] = np.c_[seconds[ok] * 990, seconds[ok] * 1010]
    return out


def write_run(folder: Path, rows: pd.DataFrame, *, formats=("csv",), schema: int = 2, datasheet=True,
              profiled: bool | None = None) -> Path:
    """A `phasebench run` output folder: results files plus run.json."""
    folder.mkdir(parents=True, exist_ok=True)
    if "csv" in formats:
        rows.to_csv(folder / "results.csv", index=False)
    if "parquet" in formats:
        rows.to_parquet(folder / "results.parquet", index=False)
    device = rows["device"].iloc[0]
    sheet = {"name": "H200 SXM", "peak_gbps": 4800.0, "peak_tflops": {"bfloat16": 989.0, "float16": 989.0}}
    run = {
        "schema": schema, "run_id": rows["run_id"].iloc[0], "started": "2025-06-01T11:59:00+00:00",
        "finished": "2025-06-01T12:10:00+00:00", "command": ["phasebench", "run", "--suite", "quick"],
        "suite": "quick", "device": {"name": device, "kind": rows["device_kind"].iloc[0]},
        "versions": {"python": "3.11.7", "torch": "2.5.1", "triton": "3.1.0", "flash_attn": None,
                     "phasebench": "0.1.0"},
        "git_commit": "0123abc",
        "ceilings": {"device": device, "peak_gbps": 4300.0, "peak_tflops": {"bfloat16": 720.0},
                     "datasheet": sheet if datasheet and device == "NVIDIA H200" else None},
    }
    if profiled is not None:
        run["profiled"] = profiled
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def _stats(rng: np.random.Generator, median_s: float, q1_s: float, q3_s: float, rounds: int) -> dict:
    low, high = median_s * rng.uniform(0.8, 0.95), median_s * rng.uniform(1.1, 1.5)
    mean = (q1_s + median_s + q3_s) / 3
    iqr = q3_s - q1_s
    return {
        "min": low, "max": high, "mean": mean, "stddev": iqr / 1.35, "rounds": rounds,
        "median": median_s, "iqr": iqr, "q1": q1_s, "q3": q3_s, "iqr_outliers": 1,
        "stddev_outliers": 2, "outliers": "2;1", "ld15iqr": low, "hd15iqr": high,
        "ops": 1.0 / mean, "total": mean * rounds, "iterations": 1,
    }


def write_pytest_benchmark(path: Path, rows: pd.DataFrame, rng: np.random.Generator, *,
                           stamp: str = "2025-06-02T08:30:00.123456+00:00", extra_benchmarks=()) -> Path:
    """A pytest-benchmark JSON file in the layout pytest-benchmark writes (ok rows only)."""
    info_fields = [name for name in RESULT_COLUMNS if name not in (
        "run_id", "time", "latency_ms", "latency_p20_ms", "latency_p80_ms", "samples", "status", "reason")]
    benchmarks = []
    for row in rows[rows["status"] == "ok"].itertuples(index=False):
        row = row._asdict()
        # as the bench writes them: each op's own case fields only (a linear entry has no batch, no kv_len)
        extra = {name: (row[name].item() if hasattr(row[name], "item") else row[name])
                 for name in info_fields if not pd.isna(row[name])}
        if row["op"] == "linear":
            param = f"{row['impl']}-{row['phase']}-{row['projection']}-m{row['m']}"
        else:
            param = f"{row['impl']}-{row['phase']}-b{row['batch']}-k{row['kv_len']}"
        benchmarks.append({
            "group": row["phase"], "name": f"test_attention[{param}]",
            "fullname": f"bench/test_attention.py::test_attention[{param}]",
            "params": {"impl": row["impl"], "case": param}, "param": param, "extra_info": extra,
            "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 5, "max_time": 1.0,
                        "min_time": 5e-06, "warmup": False},
            "stats": _stats(rng, row["latency_ms"] / 1e3, row["latency_p20_ms"] / 1e3,
                            row["latency_p80_ms"] / 1e3, row["samples"]),
        })
    benchmarks.extend(extra_benchmarks)
    document = {
        "machine_info": {
            "node": "bench-host", "processor": "x86_64", "machine": "x86_64", "python_compiler": "GCC 12.2.0",
            "python_implementation": "CPython", "python_version": "3.11.7", "release": "6.1.0", "system": "Linux",
            "cpu": {"arch": "X86_64", "bits": 64, "count": 16, "brand_raw": "AMD EPYC 9654"},
        },
        "commit_info": {"id": "0123abc", "time": "2025-06-01T10:00:00+00:00", "dirty": False,
                        "project": "phasebench", "branch": "main"},
        "benchmarks": benchmarks,
        "datetime": stamp,
        "version": "5.1.0",
    }
    path.write_text(json.dumps(document, indent=2))
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20250601)


@pytest.fixture
def rows(rng) -> pd.DataFrame:
    return make_rows(rng)


@pytest.fixture
def mixed(rng) -> pd.DataFrame:
    """Rows that must never pool: two devices; on the GPU compiled triton rows timed with CUDA
    events and the same cases timed with a host clock; on the CPU triton in the interpreter."""
    gpu = make_rows(rng, run_id="gpu", not_ok=False)
    gpu_host = make_rows(rng, run_id="gpu-host", timer="perf_counter_ns", not_ok=False)
    cpu = make_rows(rng, run_id="cpu", device="AMD EPYC 9654", device_kind="cpu", dtype="float32",
                    interpreter_impls=("triton",), not_ok=False)
    return conform(pd.concat([gpu, gpu_host, cpu], ignore_index=True))


@pytest.fixture
def helpers():
    """The builders above, for tests that need several runs or files."""

    return SimpleNamespace(make_rows=make_rows, make_linear_rows=make_linear_rows, write_run=write_run,
                           write_pytest_benchmark=write_pytest_benchmark, with_read_write=with_read_write)


@pytest.fixture
def linear_rows(rng) -> pd.DataFrame:
    return conform(make_linear_rows(rng))
