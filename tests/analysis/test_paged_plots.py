"""The paged KV cache figure, table and report section on synthetic rows of known bandwidth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import paged_figure, paged_table, write_report
from phasebench.analysis.figures.paged import REFERENCE_GID
from phasebench.bench.spec.schema import conform

from .conftest import make_rows

# the share of its contiguous bandwidth each page size keeps, per impl: known answers for the table
KEEPS = {"naive": {16: 0.5, 64: 0.6, 256: 0.7}, "triton": {16: 0.8, 64: 0.95, 256: 1.0}}


def paged_frame(interpreter_impls=()) -> pd.DataFrame:
    rows = make_rows(np.random.default_rng(5), impls=tuple(KEEPS), not_ok=False, decode_batches=(8,),
                     decode_kv_lens=(1024, 4096), interpreter_impls=interpreter_impls)
    rows = rows[rows["phase"] == "decode"].assign(page_size=0)
    frames = [rows]
    for page in (16, 64, 256):
        keep = rows["impl"].map({impl: shares[page] for impl, shares in KEEPS.items()})
        frames.append(rows.assign(page_size=page, gbps=rows["gbps"] * keep, tflops=rows["tflops"] * keep,
                                  pct_roofline=rows["pct_roofline"] * keep, latency_ms=rows["latency_ms"] / keep))
    return conform(pd.concat(frames, ignore_index=True))


def test_the_table_gives_each_page_sizes_share_of_the_contiguous_bandwidth():
    table = paged_table(paged_frame())
    assert set(table["page_size"]) == {0, 16, 64, 256} and set(table["case"]) == {"decode b8 q1 k1024",
                                                                                   "decode b8 q1 k4096"}
    for row in table.itertuples():
        expected = 1.0 if row.page_size == 0 else KEEPS[row.impl][row.page_size]
        assert row.vs_contiguous == pytest.approx(expected)
    assert list(dict.fromkeys(table["impl"])) == ["naive", "triton"]


def test_the_figure_draws_a_line_per_case_and_the_contiguous_reference():
    fig = paged_figure(paged_frame())
    assert len(fig.axes) == 4  # GB/s and % of roof for each of two impls
    top = fig.axes[0]
    series = [line for line in top.get_lines() if line.get_gid() == "series"]
    references = [line for line in top.get_lines() if line.get_gid() == REFERENCE_GID]
    assert len(series) == 2 and len(references) == 2
    assert sorted(series[0].get_xdata()) == [16, 64, 256]
    contiguous = {line.get_color(): line.get_ydata()[0] for line in references}
    for line in series:  # naive keeps half its bandwidth at pages of 16
        assert line.get_ydata()[0] == pytest.approx(0.5 * contiguous[line.get_color()])


def test_interpreter_rows_and_contiguous_only_frames_are_not_drawn():
    fig = paged_figure(paged_frame(interpreter_impls=("triton",)))
    assert len(fig.axes) == 2 and "interpreter-mode" in fig._suptitle.get_text()
    dense = paged_frame().query("page_size == 0")
    assert paged_table(dense).empty
    assert "no case measured with a paged KV cache" in paged_figure(dense).axes[0].texts[0].get_text()


def test_the_report_has_a_paged_section_only_for_paged_rows(tmp_path):
    paths = write_report(paged_frame(), tmp_path / "with")
    page = paths["html"].read_text()
    assert 'id="paged"' in page and "vs_contiguous" in page and paths["paged"].stat().st_size > 0
    plain = write_report(paged_frame().query("page_size == 0"), tmp_path / "without")
    assert 'id="paged"' not in plain["html"].read_text() and "paged" not in plain
