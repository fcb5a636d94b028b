"""nsys SQLite export parser, on exports of two schema generations built by conftest."""

import sqlite3

import numpy as np
import pandas as pd
import pytest
from phasebench.profiles import nsys

GENERATIONS = ["old", "new"]
NVTX_MINIMAL = "CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER)"


def _by_launch(kernels):
    keys = zip(kernels["pid"], kernels["correlation_id"], strict=True)
    return {(int(p), int(c)): r for (p, c), r in zip(keys, kernels["nvtx_range"], strict=True)}


@pytest.mark.parametrize("generation", GENERATIONS)
def test_kernels_rows_and_columns(nsys_export, data, generation):
    k = nsys.read_kernels(nsys_export(generation))
    assert list(k.columns) == nsys.KERNEL_COLUMNS
    assert len(k) == len(data.KERNELS)  # the repeated runtime row did not double a kernel
    assert k["start_ns"].is_monotonic_increasing
    assert (k["end_ns"] - k["start_ns"]).equals(k["duration_ns"])
    expected = sorted(data.KERNELS, key=lambda r: r[3])
    assert k["name"].tolist() == [r[2] for r in expected]
    assert k["duration_ns"].tolist() == [r[4] - r[3] for r in expected]
    assert k["device_id"].tolist() == [r[5] for r in expected]
    assert k["stream_id"].tolist() == [r[6] for r in expected]
    assert k["demangled_name"].tolist() == [f"void {r[2]}<128>(float*)" for r in expected]
    assert k["duration_ns"].sum() == sum(r[4] - r[3] for r in data.KERNELS)
    first = k.iloc[0]
    assert (first.grid_x, first.grid_y, first.block_x, first.registers_per_thread) == (10, 2, 128, 32)
    assert first.static_shared_bytes == 16 and first.dynamic_shared_bytes == 0 and first.shared_bytes == 16
    assert k["dynamic_shared_bytes"].iloc[-1] == 1024 * 7  # the kernel inserted 8th


@pytest.mark.parametrize("generation", GENERATIONS)
def test_attribution_per_process_and_innermost(nsys_export, data, generation):
    k = nsys.read_kernels(nsys_export(generation))
    assert _by_launch(k) == data.EXPECTED_RANGE
    inner = k[k["correlation_id"].eq(4) & k["pid"].eq(100)].iloc[0]
    assert inner["nvtx_path"] == (data.K1, "inner")
    flush = k[k["name"] == "zero_l2"].iloc[0]
    assert flush["nvtx_path"] == (data.K1, "l2flush")
    assert k.loc[k["nvtx_range"].isna(), "nvtx_path"].map(len).eq(0).all()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_launching_thread(nsys_export, generation):
    k = nsys.read_kernels(nsys_export(generation)).set_index(["pid", "correlation_id"])
    assert k.loc[(100, 5), "tid"] == 100  # the first of two runtime rows
    assert k.loc[(100, 7), "tid"] == 101
    assert k.loc[(200, 3), "tid"] == 200
    orphan = k.loc[(100, 99)]
    assert pd.isna(orphan["tid"]) and orphan["nvtx_range"] is None  # pid still known from globalPid


@pytest.mark.parametrize("generation", GENERATIONS)
def test_nvtx_ranges(nsys_export, data, generation):
    r = nsys.read_nvtx(nsys_export(generation))
    assert list(r.columns) == nsys.NVTX_COLUMNS
    closed = [x for x in data.RANGES if x[4] is not None]
    assert (r["kind"] == "push_pop").sum() == len(closed)  # the never-popped range is left out
    assert r.loc[r["kind"] == "start_end", "name"].tolist() == ["startend"]
    assert "a mark" not in set(r["name"]) and "phasebench" not in set(r["name"])
    assert r["start_ns"].is_monotonic_increasing
    assert (r["end_ns"] - r["start_ns"]).equals(r["duration_ns"])
    got = sorted(zip(r["pid"], r["tid"], r["name"], r["start_ns"], r["end_ns"], strict=True))
    want = sorted(x for x in closed + data.START_END)
    assert got == want
    domains = set(r.loc[r["pid"] == 100, "domain"].dropna())
    if generation == "new":
        assert domains == {"phasebench"} and r.loc[r["pid"] == 200, "domain"].isna().all()
        assert r.attrs["gpus"] == {0: "NVIDIA Test GPU", 1: "NVIDIA Test GPU"}
    else:
        assert r["domain"].isna().all() and "gpus" not in r.attrs
    assert r.attrs["schema_version"] == ("3.17.1" if generation == "new" else "2.7.1")


def test_event_types_come_from_the_enum_table(nsys_export, data):
    path = nsys_export("new", event_types={"NvtxPushPopRange": 159, "NvtxStartEndRange": 160,
                                           "NvtxDomainCreate": 175})
    k = nsys.read_kernels(path)
    assert _by_launch(k) == data.EXPECTED_RANGE
    r = nsys.read_nvtx(path)
    assert r["kind"].value_counts().to_dict() == {"push_pop": 7, "start_end": 1}
    assert set(r["domain"].dropna()) == {"phasebench"}


def test_kernel_table_without_global_pid(tmp_path, nsys_export):
    path = nsys_export("old", kernel_gpid=False)
    k = nsys.read_kernels(path)
    assert len(k) == 10
    assert k.loc[k["correlation_id"] == 1, "nvtx_range"].item().startswith("setup: ")
    # correlation ids 3 and 4 were called in two processes: without globalPid there is no telling which
    assert k.loc[k["correlation_id"].isin([3, 4]), "tid"].isna().all()
    assert k.loc[k["correlation_id"] == 7, "tid"].item() == 101


def test_export_without_runtime_or_nvtx(tmp_path, nsys_export, data):
    path = nsys_export("new")
    with sqlite3.connect(path) as con:
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
        con.execute("DROP TABLE NVTX_EVENTS")
    k = nsys.read_kernels(path)
    assert len(k) == len(data.KERNELS) and k["nvtx_range"].isna().all() and k["tid"].isna().all()
    assert sorted(k["pid"].unique()) == [100, 200]
    assert nsys.read_nvtx(path).empty


def test_many_ranges_are_fast_enough_and_exact(tmp_path, data):
    # 20k nested ranges on one thread: the lookup must not be a loop over ranges x kernels
    path = tmp_path / "big.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, 'k')")
    con.execute(NVTX_MINIMAL)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, "
                "correlationId INTEGER)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
                "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, shortName INTEGER, demangledName INTEGER)")
    tid = data.gtid(1, 1)
    n = 10_000
    outer = [(i * 100, i * 100 + 90, 59, f"outer{i}", tid) for i in range(n)]
    inner = [(i * 100 + 10, i * 100 + 20, 59, f"inner{i}", tid) for i in range(n)]
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?)", outer + inner)
    calls = np.arange(n) * 100 + np.where(np.arange(n) % 2, 15, 50)  # odd: in inner, even: only in outer
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)",
                    [(int(t), int(t) + 1, tid, i) for i, t in enumerate(calls)])
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, ?, 1, 1)",
                    [(int(t) + 2, int(t) + 5, i, data.gpid(1)) for i, t in enumerate(calls)])
    con.commit()
    con.close()
    k = nsys.read_kernels(path)
    want = [f"inner{i}" if i % 2 else f"outer{i}" for i in range(n)]
    assert k["nvtx_range"].tolist() == want
    assert len(nsys.read_nvtx(path)) == 2 * n


def test_bad_files_raise_one_line_value_errors(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("this is not a database, just text that is long enough to have a header\n" * 20)
    empty_db = tmp_path / "empty.sqlite"
    sqlite3.connect(empty_db).execute("CREATE TABLE other (x INTEGER)").connection.close()
    no_kernels = tmp_path / "cpu_only.sqlite"
    with sqlite3.connect(no_kernels) as con:
        con.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
        con.execute(NVTX_MINIMAL)
    cases = [(text, "not a readable SQLite"), (empty_db, "not an Nsight Systems export"),
             (no_kernels, "CUPTI_ACTIVITY_KIND_KERNEL"), (tmp_path / "missing.sqlite", "no such file")]
    for path, what in cases:
        with pytest.raises(ValueError, match=what) as err:
            nsys.read_kernels(path)
        message = str(err.value)
        assert str(path) in message and "\n" not in message
    assert nsys.read_nvtx(no_kernels).empty
    with pytest.raises(ValueError, match="not a readable SQLite"):
        nsys.read_nvtx(text)
