"""Report tests: summary and status tables, PNG files and the self-contained HTML."""

from __future__ import annotations

import base64
import re

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import status_table, summary_table, write_report
from phasebench.analysis.schema import conform

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def frame(rows) -> pd.DataFrame:
    return conform(rows)


def test_summary_table(frame):
    table = summary_table(frame)
    assert list(table.columns[:2]) == ["phase", "impl"]
    assert table["phase"].tolist()[0] == "prefill" and table["impl"].tolist()[:3] == ["naive", "flash", "triton"]
    assert table["rows"].sum() == len(frame)
    ok = frame[frame["status"] == "ok"]
    assert table["ok"].sum() == len(ok)
    for row in table.itertuples(index=False):
        group = ok[(ok["phase"] == row.phase) & (ok["impl"] == row.impl)]
        assert row.best_pct_roofline == pytest.approx(group["pct_roofline"].max())
        assert row.median_pct_roofline == pytest.approx(group["pct_roofline"].median())
    by_device = summary_table(frame, by=("device", "impl"))
    assert set(by_device["device"]) == {"NVIDIA H200"}


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
    for word in ("best_pct_roofline", "median_pct_roofline", "skipped", "failed", "incorrect", "out of memory"):
        assert word in page
    assert "src=\"http" not in page and "<script" not in page  # self-contained, static

    summary = pd.read_csv(paths["summary"])
    assert len(summary) == len(summary_table(frame))


def test_write_report_on_rows_that_all_failed(tmp_path, frame):
    failed = frame.assign(status="failed", reason="boom", latency_ms=np.nan, pct_roofline=np.nan)
    paths = write_report(failed, tmp_path)
    page = paths["html"].read_text(encoding="utf-8")
    assert "boom" in page and paths["roofline"].is_file()
