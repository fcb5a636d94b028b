"""Report tests: summary and status tables, PNG files and the self-contained HTML."""

from __future__ import annotations

import base64
import re

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import correctness_table, load, report_rows, status_table, summary_table, write_report
from phasebench.bench.cli.main import main
from phasebench.bench.spec.schema import conform

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def frame(rows) -> pd.DataFrame:
    return conform(rows)


def test_summary_table(frame):
    table = summary_table(frame)
    assert list(table.columns[:7]) == ["device", "mode", "timer", "profiled", "op", "phase", "impl"]
    assert table["phase"].tolist()[0] == "prefill" and table["impl"].tolist()[:3] == ["naive", "flash", "triton"]
    ok = frame[frame["status"] == "ok"]
    assert table["ok"].sum() == len(ok) and table["noisy"].sum() == 0
    for row in table.itertuples(index=False):
        group = ok[(ok["phase"] == row.phase) & (ok["impl"] == row.impl)]
        assert row.best_pct_roofline == pytest.approx(group["pct_roofline"].max())
        assert row.median_pct_roofline == pytest.approx(group["pct_roofline"].median())
    by_device = summary_table(frame, by=("device", "impl"))
    assert set(by_device["device"]) == {"NVIDIA H200"}


KEY = ["device", "mode", "timer", "phase", "impl"]


def test_summary_keeps_devices_modes_and_timers_apart(mixed):
    table = summary_table(mixed)
    assert not table.duplicated(KEY).any()
    compiled = mixed[(mixed["status"] == "ok") & (mixed["mode"] == "compiled")]
    assert set(map(tuple, table[KEY].to_numpy())) == set(map(tuple, compiled[KEY].drop_duplicates().to_numpy()))
    assert "interpreter" not in set(table["mode"])  # those rows are in the correctness table
    assert set(table["timer"]) == {"cuda-events", "perf_counter_ns"}
    for row in table.itertuples(index=False):
        group = compiled[(compiled[KEY] == [getattr(row, name) for name in KEY]).all(axis=1)]
        assert row.ok == len(group)
        assert row.median_tflops == pytest.approx(group["tflops"].median())


def test_summary_counts_noisy_rows_and_leaves_them_out_of_medians(frame, rng):
    ok_index = np.flatnonzero((frame["status"] == "ok") & (frame["impl"] == "flash"))
    picks = rng.choice(ok_index, size=3, replace=False)
    noisy = frame.copy()
    noisy.loc[picks, "noisy"] = True
    table = summary_table(noisy)
    assert table["noisy"].sum() == 3 and table["ok"].sum() == int((frame["status"] == "ok").sum())
    clean = noisy[(noisy["status"] == "ok") & ~noisy["noisy"].astype(bool)]
    for row in table[table["impl"] == "flash"].itertuples(index=False):
        group = clean[(clean["phase"] == row.phase) & (clean["impl"] == "flash")]
        assert row.median_gbps == pytest.approx(group["gbps"].median())


def test_correctness_table_holds_the_interpreter_rows(mixed):
    table = correctness_table(mixed)
    in_interpreter = mixed[mixed["mode"] == "interpreter"]
    assert list(table.columns) == ["device", "impl", "case", "max_rel_err", "status"]
    assert len(table) == len(in_interpreter) and set(table["impl"]) == {"triton"}
    assert sorted(table["max_rel_err"]) == sorted(in_interpreter["max_rel_err"])
    assert table["case"].str.contains(r"decode b8 hq32 hkv8 q1 k1024 d128 float32").any()
    assert correctness_table(mixed[mixed["mode"] == "compiled"]).empty


def profiled_pair(rng, helpers, tmp_path):
    """Two run folders, the second made by `phasebench profile` (run.json says so)."""
    plain = helpers.write_run(tmp_path / "results" / "plain", helpers.make_rows(rng, run_id="plain"))
    under = helpers.make_rows(rng, run_id="profile-1", impls=("flash",))
    helpers.write_run(tmp_path / "results" / "profile-1" / "run", under, profiled=True)
    return plain, len(under)


def test_profiled_rows_are_left_out_of_the_report_unless_asked(tmp_path, rng, helpers):
    plain, profiled_rows = profiled_pair(rng, helpers, tmp_path)
    df = load(tmp_path / "results")
    assert int(df["profiled"].sum()) == profiled_rows and set(df.loc[df["profiled"], "run_id"]) == {"profile-1"}

    paths = write_report(df, tmp_path / "report")
    summary = pd.read_csv(paths["summary"])
    assert summary["ok"].sum() == int(((df["status"] == "ok") & ~df["profiled"]).sum())
    assert not summary["profiled"].any()
    page = paths["html"].read_text(encoding="utf-8")
    assert f"{profiled_rows} rows measured under a profiler are left out" in page and "profile-1" not in page

    paths = write_report(df, tmp_path / "with", include_profiled=True)
    summary = pd.read_csv(paths["summary"])
    assert summary["ok"].sum() == int((df["status"] == "ok").sum())
    assert summary["profiled"].any() and "profile-1" in paths["html"].read_text(encoding="utf-8")
    assert len(report_rows(df)) == len(df) - profiled_rows
    assert len(report_rows(df, include_profiled=True)) == len(df)


def test_report_verb_include_profiled(tmp_path, rng, helpers, capsys):
    profiled_pair(rng, helpers, tmp_path)
    assert main(["report", str(tmp_path / "results"), "--out", str(tmp_path / "a")]) == 0
    assert "profiled rows left out" in capsys.readouterr().out
    without = pd.read_csv(tmp_path / "a" / "summary.csv")
    assert main(["report", str(tmp_path / "results"), "--out", str(tmp_path / "b"), "--include-profiled"]) == 0
    assert "left out" not in capsys.readouterr().out
    with_profiled = pd.read_csv(tmp_path / "b" / "summary.csv")
    assert not without["profiled"].any() and with_profiled["profiled"].any()
    assert with_profiled["ok"].sum() > without["ok"].sum()


def test_status_table_counts_every_status(frame):
    table = status_table(frame)
    for status in ("ok", "skipped", "failed", "incorrect"):
        assert table[status].sum() == int((frame["status"] == status).sum())
    assert (table["total"] == table[["ok", "skipped", "failed", "incorrect"]].sum(axis=1)).all()
    assert table["total"].sum() == len(frame)


def test_write_report(tmp_path, frame):
    paths = write_report(frame, tmp_path / "report")
    pngs = {name: path for name, path in paths.items() if path.suffix == ".png"}
    assert any("roofline" in path.name for path in pngs.values())
    assert len(pngs) == 6
    for path in pngs.values():
        assert path.read_bytes().startswith(PNG_MAGIC)

    page = paths["html"].read_text(encoding="utf-8")
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(pngs)
    assert base64.b64decode(images[0]).startswith(PNG_MAGIC)
    assert page.count("<table") >= 3  # runs, summary, status (and the not-ok reasons)
    assert 'id="correctness"' in page
    for word in ("best_pct_roofline", "median_pct_roofline", "skipped", "failed", "incorrect", "out of memory"):
        assert word in page.replace("<wbr>", "")  # column names may break after an underscore
    assert "src=\"http" not in page and "<script" not in page  # self-contained, static

    summary = pd.read_csv(paths["summary"])
    assert len(summary) == len(summary_table(frame))


def test_write_report_on_rows_that_all_failed(tmp_path, frame):
    failed = frame.assign(status="failed", reason="boom", latency_ms=np.nan, pct_roofline=np.nan)
    paths = write_report(failed, tmp_path)
    page = paths["html"].read_text(encoding="utf-8")
    assert "boom" in page and paths["roofline"].is_file()


def test_rows_above_their_roof_are_marked_in_the_summary_never_in_its_medians(rng, helpers):
    from phasebench.analysis.report import above_roof_rows

    frame = conform(helpers.with_read_write(helpers.make_rows(rng, not_ok=False), above=4, rng=rng))
    above = frame["above_roof"].astype(bool)
    table = summary_table(frame)
    assert table["above_roof"].sum() == 4 and table["ok"].sum() == len(frame)
    for row in table.itertuples(index=False):
        group = frame[(frame["phase"] == row.phase) & (frame["impl"] == row.impl)]
        clean, found = group[~above.loc[group.index]], group[above.loc[group.index]]
        assert row.above_roof == len(found)
        assert row.best_pct_roofline == pytest.approx(clean["pct_roofline"].max())
        assert row.median_pct_roofline == pytest.approx(clean["pct_roofline"].median())
        if len(found):
            assert row.max_pct_above_roof == pytest.approx(found["pct_roofline"].max()) and row.max_pct_above_roof > 105
        else:
            assert np.isnan(row.max_pct_above_roof)
    listed = above_roof_rows(frame)
    assert len(listed) == 4 and (listed["why"] == "above roof: a finding").all()


def test_the_ceilings_table_shows_all_three_and_which_rows_keep_the_copy_roof(rng, helpers):
    from phasebench.analysis.report import ceilings_table

    new = helpers.with_read_write(helpers.make_rows(rng, not_ok=False, run_id="v5"))
    old = helpers.make_rows(rng, not_ok=False, run_id="v4")
    table = ceilings_table(conform(pd.concat([new, old], ignore_index=True))).set_index("run_id")
    assert table.loc["v5", "read_gbps"] == 4600.0 and table.loc["v5", "write_gbps"] == 4400.0
    assert table.loc["v5", "copy_gbps"] == table.loc["v4", "copy_gbps"] == 4300.0
    assert table.loc["v5", "copy_roof_rows"] == 0 and table.loc["v4", "copy_roof_rows"] == len(old)
    assert np.isnan(table.loc["v4", "read_gbps"])


def test_the_ceilings_table_gives_each_precision_the_rows_multiply_in_its_own_matmul_ceiling(rng, helpers):
    from phasebench.analysis.report import ceilings_table

    rows = helpers.with_read_write(helpers.make_rows(rng, not_ok=False, run_id="v7"))
    upcast = rows["impl"] == "naive"  # a kernel that multiplies bf16 inputs in fp32, held to the fp32 ceiling
    rows["compute_dtype"] = rows["dtype"].where(~upcast, "float32")
    rows.loc[upcast, "peak_tflops"] = 67.0
    table = ceilings_table(conform(rows)).set_index("compute_dtype")
    assert table.loc["float32", "peak_tflops"] == 67.0 and table.loc["float32", "rows"] == upcast.sum()
    assert table.loc["bfloat16", "rows"] == (~upcast).sum() and table.loc["bfloat16", "peak_tflops"] != 67.0


def test_the_report_shows_the_three_ceilings(tmp_path, rng, helpers):
    rows = helpers.with_read_write(helpers.make_rows(rng, not_ok=False), above=2, rng=rng)
    write_report(conform(rows), tmp_path)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="ceilings"' in page and "read_gbps" in page and "write_gbps" in page and "copy_gbps" in page
    assert "read bytes / read_gbps + write bytes / write_gbps" in page
    assert 'id="above-roof-rows"' in page and "2 above roof" in page
