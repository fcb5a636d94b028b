"""Loader tests: run folders (CSV, parquet), pytest-benchmark JSON, several runs, bad files, profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import SCHEMA_VERSION, load, load_profile
from phasebench.bench.spec.schema import ABOVE_ROOF_PCT, RESULT_COLUMNS, RUN_COLUMNS

from ..conftest import REPO


def test_run_folder_with_csv_only(tmp_path, rows, helpers):
    folder = helpers.write_run(tmp_path / "run-a", rows, formats=("csv",))
    frame = load(folder)

    assert list(frame.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert set(RUN_COLUMNS) <= set(frame.columns)
    assert len(frame) == len(rows)
    np.testing.assert_allclose(frame["latency_ms"], rows["latency_ms"], rtol=1e-12)
    assert str(frame["batch"].dtype) == "Int64" and str(frame["causal"].dtype) == "boolean"
    assert frame.loc[rows["status"] == "ok", "reason"].eq("").all()
    assert frame["model"].eq("llama3-8b").all()
    # run.json merged in
    assert frame["torch_version"].eq("2.5.1").all() and frame["git_commit"].eq("0123abc").all()
    assert frame["datasheet_tflops"].eq(989.0).all() and frame["datasheet_gbps"].eq(4800.0).all()
    assert frame["source"].str.endswith("results.csv").all()


def test_run_folder_prefers_parquet_and_file_paths_work(tmp_path, rows, helpers):
    folder = helpers.write_run(tmp_path / "run-a", rows, formats=("csv", "parquet"))
    shorter = rows.iloc[:5]
    shorter.to_parquet(folder / "results.parquet", index=False)

    from_folder = load(folder)
    assert len(from_folder) == 5 and from_folder["source"].str.endswith("results.parquet").all()
    from_csv = load(folder / "results.csv")  # run.json is still found beside the file
    assert len(from_csv) == len(rows) and from_csv["triton_version"].eq("3.1.0").all()
    assert len(load(folder / "run.json")) == 5


def test_run_without_datasheet_and_blank_run_id(tmp_path, rows, helpers):
    folder = helpers.write_run(tmp_path / "run-b", rows, datasheet=False)
    rows.assign(run_id="", device="").to_csv(folder / "results.csv", index=False)
    frame = load(str(folder))
    assert frame["datasheet_tflops"].isna().all()
    assert frame["device"].eq("NVIDIA H200").all()  # from run.json, rows were blank
    assert frame["device_kind"].eq("cuda").all()
    assert frame["run_id"].eq("run-a").all()


def test_pytest_benchmark_json(tmp_path, rows, rng, helpers):
    stranger = {"name": "test_other", "fullname": "t.py::test_other", "extra_info": {},
                "stats": {"median": 0.1, "q1": 0.09, "q3": 0.11, "rounds": 3}}
    path = helpers.write_pytest_benchmark(tmp_path / "bench.json", rows, rng, extra_benchmarks=[stranger])
    document = json.loads(path.read_text())
    frame = load(path)

    ok = rows[rows["status"] == "ok"].reset_index(drop=True)
    assert len(frame) == len(ok) == len(document["benchmarks"]) - 1
    stats = pd.DataFrame([bench["stats"] for bench in document["benchmarks"][:-1]])
    np.testing.assert_allclose(frame["latency_ms"], stats["median"] * 1e3)
    np.testing.assert_allclose(frame["latency_p20_ms"], stats["q1"] * 1e3)
    np.testing.assert_allclose(frame["latency_p80_ms"], stats["q3"] * 1e3)
    assert frame["samples"].tolist() == stats["rounds"].tolist()
    assert frame["status"].eq("ok").all()
    assert frame["run_id"].eq("pytest-benchmark:2025-06-02T08:30:00.123456+00:00").all()
    assert frame["device"].eq("NVIDIA H200").all()
    np.testing.assert_allclose(frame["pct_roofline"], ok["pct_roofline"])
    assert frame["phase"].tolist() == ok["phase"].tolist()
    assert frame["git_commit"].eq("0123abc").all()
    assert list(frame.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)


def test_pytest_benchmark_fills_device_and_figures(tmp_path, rows, rng, helpers):
    path = helpers.write_pytest_benchmark(tmp_path / "bench.json", rows, rng)
    document = json.loads(path.read_text())
    for bench in document["benchmarks"]:
        for name in ("device", "device_kind", "tflops", "pct_roofline", "bound"):
            bench["extra_info"].pop(name)
    path.write_text(json.dumps(document))
    frame = load(path)

    assert frame["device"].eq("AMD EPYC 9654").all()  # machine_info.cpu.brand_raw
    expected = frame["flops"] / (frame["latency_ms"] / 1e3) / 1e12
    np.testing.assert_allclose(frame["tflops"], expected)
    np.testing.assert_allclose(frame["pct_roofline"], 100 * frame["tflops"] / frame["roof_tflops"])
    assert set(frame["bound"]) <= {"memory", "compute"}


def test_two_runs_from_two_devices_combine(tmp_path, rng, helpers):
    gpu = helpers.make_rows(rng, run_id="gpu-run")
    cpu = helpers.make_rows(rng, run_id="cpu-run", device="AMD EPYC 9654", device_kind="cpu", dtype="float32")
    helpers.write_run(tmp_path / "runs" / "gpu-run", gpu, formats=("parquet",))
    helpers.write_run(tmp_path / "runs" / "cpu-run", cpu)
    bench = helpers.write_pytest_benchmark(tmp_path / "bench.json", gpu, rng)

    frame = load(tmp_path / "runs")  # a folder of run folders
    sizes = frame.groupby(["run_id", "device"]).size().to_dict()
    assert sizes == {("cpu-run", "AMD EPYC 9654"): len(cpu), ("gpu-run", "NVIDIA H200"): len(gpu)}
    assert set(frame["device_kind"]) == {"cpu", "cuda"}

    mixed = load([tmp_path / "runs" / "gpu-run"], tmp_path / "runs" / "cpu-run", [bench])
    assert mixed["run_id"].nunique() == 3
    assert len(mixed) == len(gpu) + len(cpu) + int((gpu["status"] == "ok").sum())
    assert str(mixed["batch"].dtype) == "Int64" and str(mixed["causal"].dtype) == "boolean"
    assert len(load(tmp_path)) == len(mixed)  # the JSON beside the runs is found too


@pytest.mark.parametrize(
    "name, content",
    [
        ("results.csv", "impl,phase,status\nflash,prefill,ok\n"),  # columns missing
        ("results.csv", ""),  # empty
        ("results.parquet", "this is not parquet"),
        ("bench.json", "{\"benchmarks\": [ oops"),
        ("bench.json", "{\"machine_info\": {}, \"benchmarks\": [{\"extra_info\": {\"impl\": \"flash\"}}]}"),
    ],
)
def test_broken_file_is_named_in_one_line(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError) as raised:
        load(path)
    message = str(raised.value)
    assert message.startswith(str(path)) and "\n" not in message


def test_non_numeric_column_is_named(tmp_path, rows, helpers):
    folder = helpers.write_run(tmp_path / "run-a", rows.assign(latency_ms="fast"))
    with pytest.raises(ValueError, match=r"results\.csv: column 'latency_ms' is not numeric"):
        load(folder)


def test_newer_schema_run_json_is_refused(tmp_path, rows, helpers):
    folder = helpers.write_run(tmp_path / "run-a", rows, schema=SCHEMA_VERSION + 1)
    with pytest.raises(ValueError) as raised:
        load(tmp_path)
    message = str(raised.value)
    assert str(folder / "run.json") in message and "newer" in message and "\n" not in message


def test_missing_and_empty_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.json").write_text("{\"unrelated\": true}")
    with pytest.raises(ValueError, match="no results"):
        load(tmp_path / "empty")
    with pytest.raises(ValueError):
        load()


def test_profile_table(tmp_path, rng):
    keys = ["flash/prefill/b1-hq32-hkv8-q512-k512-d128-bfloat16-causal",
            "sdpa.v2/decode/b8-hq32-hkv8-q1-k4096-d128-float16"]
    kernel_ns = rng.integers(10_000, 1_000_000, size=2)
    wall_ns = kernel_ns + rng.integers(1_000, 50_000, size=2)
    table = pd.DataFrame({
        "key": keys, "ranges": [20, 50], "wall_ns": wall_ns, "kernel_count": [3, 2],
        "kernel_time_ns": kernel_ns, "launch_overhead_ns": wall_ns - kernel_ns,
    })
    path = tmp_path / "profile_summary.csv"
    table.to_csv(path, index=False)

    profile = load_profile(path)  # case fields come from the key when the table lacks them
    assert profile["impl"].tolist() == ["flash", "sdpa.v2"]
    assert profile["phase"].tolist() == ["prefill", "decode"]
    assert profile["batch"].tolist() == [1, 8] and profile["kv_len"].tolist() == [512, 4096]
    assert profile["dtype"].tolist() == ["bfloat16", "float16"]
    assert profile["causal"].tolist() == [True, False]
    np.testing.assert_allclose(profile["kernel_time_ms"], kernel_ns / 1e6)
    np.testing.assert_allclose(profile["launch_overhead_ms"], (wall_ns - kernel_ns) / 1e6)
    assert profile["ranges"].tolist() == [20, 50]

    with_fields = profile.drop(columns=["source", "kernel_time_ms", "wall_ms", "launch_overhead_ms"])
    with_fields.to_parquet(tmp_path / "summary.parquet", index=False)
    both = load_profile(tmp_path)  # a folder: every profile table in it
    assert len(both) == 4 and both["causal"].tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="load_profile"):
        load(path)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"other\.csv: not a profile summary table: missing column"):
        load_profile(other)


def test_analysis_imports_no_gpu_stack():
    script = (
        "import sys, phasebench.analysis\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton') or m == 'matplotlib.pyplot'"
        " or m.startswith('phasebench.kernels')"
        " or (m.startswith('phasebench.bench.') and not m.startswith('phasebench.bench.spec'))"
        " or (m.startswith('phasebench.profiles.') and m != 'phasebench.profiles.names')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


NEW_IN_2 = ("op", "seqlens", "kv_tokens", "timer", "noisy", "noise_reason", "profiled")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_schema_1_files_get_the_defaults_of_new_columns(tmp_path, rows, helpers, fmt):
    old = rows.drop(columns=list(NEW_IN_2))
    folder = helpers.write_run(tmp_path / "old", old, formats=(fmt,), schema=1)
    frame = load(folder)
    assert list(frame.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert frame["op"].eq("attention").all() and frame["seqlens"].eq("").all() and frame["timer"].eq("").all()
    assert not frame["noisy"].any() and not frame["profiled"].any() and frame["noise_reason"].eq("").all()
    assert str(frame["noisy"].dtype) == "boolean" and str(frame["kv_tokens"].dtype) == "Int64"
    assert (frame["kv_tokens"] == frame["batch"] * frame["kv_len"]).all()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_schema_2_files_read_as_rows_within_their_roof(tmp_path, rows, helpers, fmt):
    folder = helpers.write_run(tmp_path / "v2", rows.drop(columns=["above_roof"], errors="ignore"), formats=(fmt,),
                               schema=2)
    frame = load(folder)
    assert str(frame["above_roof"].dtype) == "boolean" and not frame["above_roof"].any()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_schema_2_rows_above_their_roof_are_flagged_on_reading(tmp_path, rng, helpers, fmt):
    rows = helpers.make_rows(rng, not_ok=False, interpreter_impls=("triton",))
    high = rows.index[rows["impl"] != "naive"][::3]
    rows.loc[high, "pct_roofline"] = rng.uniform(ABOVE_ROOF_PCT + 1, 400, size=len(high))
    rows.loc[rows.index[rows["impl"] == "naive"][0], "pct_roofline"] = ABOVE_ROOF_PCT  # at the limit: not above it
    folder = helpers.write_run(tmp_path / "v2", rows.drop(columns=["above_roof"]), formats=(fmt,), schema=2)
    frame = load(folder)
    expected = (frame["mode"] == "compiled") & (frame["pct_roofline"] > ABOVE_ROOF_PCT)
    assert expected.any() and (frame["mode"][frame["pct_roofline"] > ABOVE_ROOF_PCT] == "interpreter").any()
    assert (frame["above_roof"] == expected).all()
    assert frame.loc[expected, "reason"].str.contains(f"above {ABOVE_ROOF_PCT:g}%: a finding").all()
    assert (frame.loc[~expected, "reason"] == "").all()


def test_schema_1_rows_read_as_dense_attention():
    """A run folder written before schema 2 (the old committed quick sample, kept under tests/analysis/data)."""
    old = Path(__file__).parent / "data" / "schema1-quick"
    assert json.loads((old / "run.json").read_text()).get("schema") == 1
    frame = load([old])
    assert len(frame) and frame["op"].eq("attention").all() and not frame["profiled"].any()
    assert not frame["noisy"].any()
    assert (frame["kv_tokens"] == frame["batch"] * frame["kv_len"]).all()


def test_ragged_seqlens_stay_text_and_flags_are_read(tmp_path, rows, helpers):
    ragged = rows.copy()
    ragged.loc[0, ["seqlens", "kv_tokens"]] = ["97,1025,3", 1125]
    ragged.loc[1, ["noisy", "noise_reason"]] = [True, "load average 3.1 on 2 cores"]
    ragged.loc[2, "profiled"] = True
    frame = load(helpers.write_run(tmp_path / "run-a", ragged))
    assert frame.loc[0, "seqlens"] == "97,1025,3" and frame.loc[0, "kv_tokens"] == 1125
    assert frame["noisy"].tolist() == [False, True] + [False] * (len(rows) - 2)
    assert frame.loc[1, "noise_reason"] == "load average 3.1 on 2 cores"
    assert frame["profiled"].sum() == 1 and bool(frame.loc[2, "profiled"])


def test_run_json_profiled_marks_every_row(tmp_path, rows, helpers):
    assert load(helpers.write_run(tmp_path / "p", rows, profiled=True))["profiled"].all()
    assert not load(helpers.write_run(tmp_path / "q", rows, profiled=False))["profiled"].any()


NEW_IN_5 = ("read_bytes", "write_bytes", "read_gbps", "write_gbps", "roof_model")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_schema_4_files_keep_their_copy_roof_and_say_so(tmp_path, rng, helpers, fmt):
    rows = helpers.make_rows(rng, not_ok=False).drop(columns=list(NEW_IN_5))
    folder = helpers.write_run(tmp_path / "v4", rows, formats=(fmt,), schema=4)
    frame = load(folder)
    assert list(frame.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert frame["roof_model"].eq("copy").all() and frame["read_bytes"].isna().all()
    assert frame["read_gbps"].isna().all() and frame["write_gbps"].isna().all()
    # the roof and its share as the file has them: bytes at the copy bandwidth, never recomputed
    np.testing.assert_allclose(frame["roof_tflops"], rows["roof_tflops"])
    np.testing.assert_allclose(frame["pct_roofline"], rows["pct_roofline"])


def test_schema_5_files_carry_the_split_and_the_three_ceilings(tmp_path, rng, helpers):
    rows = helpers.with_read_write(helpers.make_rows(rng, not_ok=False))
    frame = load(helpers.write_run(tmp_path / "v5", rows, schema=5))
    assert frame["roof_model"].eq("read+write").all()
    np.testing.assert_allclose(frame["read_bytes"] + frame["write_bytes"], frame["bytes"])
    np.testing.assert_allclose(frame["read_gbps"], rows["read_gbps"])
    np.testing.assert_allclose(frame["roof_tflops"], rows["roof_tflops"])


def test_pytest_benchmark_rows_derive_the_roof_of_their_split(tmp_path, rng, helpers):
    """A benchmark file that carries the read and write bytes and ceilings but no roof: the loader computes the
    floor as the runner would; one without the split (an older suite) gets the copy roof and says so."""
    rows = helpers.with_read_write(helpers.make_rows(rng, not_ok=False))
    bare = rows.drop(columns=["roof_tflops", "pct_roofline", "bound", "roof_model"])
    frame = load(helpers.write_pytest_benchmark(tmp_path / "split.json", bare.assign(
        roof_tflops=np.nan, pct_roofline=np.nan, bound="", roof_model=""), rng))
    assert frame["roof_model"].eq("read+write").all()
    floor = rows["read_bytes"] / (rows["read_gbps"] * 1e9) + rows["write_bytes"] / (rows["write_gbps"] * 1e9)
    expected = np.minimum(rows["peak_tflops"], rows["flops"] / floor / 1e12)
    np.testing.assert_allclose(frame["roof_tflops"], expected.to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(frame["pct_roofline"], 100 * frame["tflops"] / frame["roof_tflops"], rtol=1e-12)
    old = helpers.make_rows(rng, not_ok=False).drop(columns=["roof_tflops", "pct_roofline", "bound"])
    older = load(helpers.write_pytest_benchmark(tmp_path / "old.json", old.assign(
        roof_tflops=np.nan, pct_roofline=np.nan, bound=""), rng))
    assert older["roof_model"].eq("copy").all()
    np.testing.assert_allclose(older["roof_tflops"], np.minimum(old["peak_tflops"],
                                                                old["intensity"] * old["peak_gbps"] / 1e3))


def test_the_committed_samples_load_with_the_roofs_of_their_schema():
    """Measured before schema 5: the copy roof they were judged on; from schema 5: their read and write bytes at the
    read and write ceilings (never the copy roof)."""
    for sample in sorted({p.parent for p in (REPO / "analysis" / "sample").rglob("results.csv")}):
        frame = load(sample)
        schema = json.loads((sample / "run.json").read_text(encoding="utf-8"))["schema"]
        expected = {"copy"} if schema < 5 else {"read+write"}
        assert len(frame) and set(frame["roof_model"]) <= expected, (sample.name, schema)
