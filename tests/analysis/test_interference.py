"""`phasebench interference` rows in analysis: the loader, the summary and verdicts, the figures, the report section."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import (
    load_interference,
    stretch_figure,
    user_rate_figure,
    write_interference_figures,
    write_report,
)
from phasebench.analysis.figures.kit import SERIES_GID
from phasebench.analysis.interference.figures import chunk_figure
from phasebench.analysis.interference.rows import interference_summary, verdicts
from phasebench.analysis.loading.results import DataFileError
from phasebench.bench.cli.main import main
from phasebench.bench.spec.interference_schema import INTERFERENCE_COLUMNS, INTERFERENCE_SCHEMA, conform_interference
from phasebench.bench.spec.schema import conform

from ..conftest import REPO

# decode ms of each (batch, mode) at prompt 64; at prompt 512 the co-located one doubles
DECODE_MS = {(1, "alone"): 50.0, (1, "colocated"): 200.0, (1, "protected"): 80.0,
             (6, "alone"): 90.0, (6, "colocated"): 270.0, (6, "protected"): 99.0}
MECHANISMS = {"alone": "alone", "colocated": "process", "protected": "disjoint cores"}


def designed_rows(noisy=(), failed=()) -> pd.DataFrame:
    rows = []
    for (batch, mode), ms in DECODE_MS.items():
        for prompt in (64, 512):
            decode = ms * (2 if prompt == 512 and mode == "colocated" else 1)
            alone = DECODE_MS[(batch, "alone")]
            row = {"run_id": "r1", "time": "2026-12-04T00:00:00+00:00", "device": "cpu", "device_kind": "cpu",
                   "model": "m-test", "layers": 2, "dtype": "float32", "batch": batch, "context": 300,
                   "prompt": prompt, "mode": mode, "mechanism": MECHANISMS[mode], "decode_ms": decode,
                   "decode_p10_ms": 0.9 * decode, "decode_p90_ms": 1.2 * decode, "samples": 40,
                   "stretch": decode / alone, "p90_stretch": decode / alone, "tokens_per_s_per_user": 1e3 / decode,
                   "prefill_alone_ms": 10.0 * prompt, "prefill_ms": 15.0 * prompt, "prefill_slowdown": 1.5,
                   "noisy": (batch, prompt, mode) in noisy, "status": "ok", "reason": ""}
            if (batch, prompt, mode) in failed:
                row = {k: v for k, v in row.items() if not k.startswith(("decode", "stretch", "p90", "tokens"))}
                row.update(status="failed", reason="out of memory: boom", stretch=np.nan)
            if row["noisy"]:
                row["noise_reason"] = "busy host: other processes used 0.90 of 2 CPUs while sampling"
            rows.append(row)
    return conform_interference(pd.DataFrame(rows))


def write_folder(folder, rows, schema=1):
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_csv(folder / "interference.csv", index=False)
    meta = {"interference_schema": schema, "kind": "interference", "git_commit": "abc", "versions": {"torch": "9.9"}}
    (folder / "run.json").write_text(json.dumps(meta))
    return folder


def test_rows_round_trip_through_the_loader(tmp_path):
    rows = designed_rows(noisy={(6, 512, "colocated")})
    folder = write_folder(tmp_path / "one", rows)
    back = load_interference(folder)
    assert list(back.columns[:len(INTERFERENCE_COLUMNS)]) == list(INTERFERENCE_COLUMNS)
    assert back["source"].iloc[0].endswith("interference.csv") and set(back["git_commit"]) == {"abc"}
    pd.testing.assert_frame_equal(back[list(INTERFERENCE_COLUMNS)], rows, check_dtype=False)
    assert back["batch"].dtype == "Int64" and back["noisy"].sum() == 1
    both = load_interference([folder, write_folder(tmp_path / "two", rows) / "interference.csv"])
    assert len(both) == 2 * len(rows)


def test_the_committed_schema_1_sample_loads_with_its_device_named_and_no_share_claimed():
    sample = REPO / "analysis" / "sample" / "cpu-interference"
    assert json.loads((sample / "run.json").read_text())["interference_schema"] < INTERFERENCE_SCHEMA
    rows = load_interference(sample)
    assert set(rows["device_name"]) == {json.loads((sample / "run.json").read_text())["device"]["name"]}
    assert rows["covered"].isna().all() and (rows["status"] == "ok").all()


@pytest.mark.parametrize("damage, error, says", [
    (lambda d: (d / "interference.csv").unlink(), FileNotFoundError, "interference.csv: missing"),
    (lambda d: (d / "interference.csv").write_text(""), DataFileError, "file is empty"),
    (lambda d: (d / "interference.csv").write_text("batch,prompt\n1,2\n"), DataFileError,
     "missing interference column(s) context, mode, mechanism, status"),
    (lambda d: (d / "interference.csv").write_text(
        (d / "interference.csv").read_text().replace(",protected,", ",shielded,")), DataFileError,
     "'shielded', not one of alone, colocated, protected"),
    (lambda d: (d / "run.json").write_text('{"interference_schema": 7}'), DataFileError, "schema 7 is newer"),
    (lambda d: (d / "run.json").write_text("{oops"), DataFileError, "not valid JSON"),
])
def test_a_broken_folder_gets_one_line_naming_the_file(tmp_path, damage, error, says):
    folder = write_folder(tmp_path / "f", designed_rows())
    damage(folder)
    with pytest.raises(error) as raised:
        load_interference(folder)
    message = str(raised.value)
    assert says in message and message.startswith(str(folder)) and len(message.splitlines()) == 1


def test_verdicts_per_batch_prompt_and_target():
    found = verdicts(designed_rows()).set_index(["batch", "prompt", "target"])
    # batch 1: alone 20, colocated 5 (2.5 at prompt 512), protected 12.5 tok/s
    assert found.loc[(1, 64, 10.0), "kept"] == ["alone", "protected (disjoint cores)"]
    assert found.loc[(1, 64, 10.0), "lost"] == ["colocated (process)"]
    assert found.loc[(1, 512, 3.0), "lost"] == ["colocated (process)"] and found.loc[(1, 64, 3.0), "lost"] == []
    # batch 6: alone 11.1, colocated 3.7 (1.85), protected 10.1 tok/s
    assert found.loc[(6, 64, 3.0), "lost"] == [] and found.loc[(6, 512, 3.0), "lost"] == ["colocated (process)"]
    assert found.loc[(6, 64, 10.0), "kept"] == ["alone", "protected (disjoint cores)"]


def test_summary_prints_the_rows_the_verdicts_and_what_went_wrong():
    rows = designed_rows(noisy={(6, 512, "colocated")}, failed={(1, 512, "protected")})
    text = interference_summary(rows)
    lines = text.splitlines()
    assert lines[0] == "interference · m-test (2 layers) · cpu · float32 · context 300"
    table = [line.split() for line in lines if line.split()[:2] in (["1", "64"], ["6", "512"])]
    assert [r[2] for r in table] == ["alone", "colocated", "protected", "alone", "colocated", "protected"]
    # mean, p50, p90, p99, stretch: schema 2's rows knew the median and p90 only
    assert table[1][4:9] == ["–", "200", "240", "–", "4"]
    assert table[4][-1] == "NOISY"
    assert "failed: batch 1 prompt 512 protected (disjoint cores): out of memory: boom" in lines
    assert ("  batch 1, prompt 64, 10 tok/s (2 layers timed, not scaled to the model): kept by alone, protected "
            "(disjoint cores); lost by colocated (process)") in lines
    assert lines[-1].startswith("1 of 11 rows NOISY") and "0.90 of 2 CPUs" in lines[-1]


def _series(fig):
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == SERIES_GID]


def test_stretch_figure_a_panel_per_batch_a_line_per_mode():
    rows = designed_rows(noisy={(6, 512, "colocated")})
    fig = stretch_figure(rows)
    lines = _series(fig)
    assert len(fig.axes) == 2 and len(lines) == 4  # colocated and protected in each batch's panel
    colocated_1 = next(line for line in lines if line.get_label() == "colocated (process)")
    assert list(colocated_1.get_xdata()) == [64, 512] and list(colocated_1.get_ydata()) == [4.0, 8.0]
    assert all(ax.get_xscale() == "log" for ax in fig.axes)
    hollow = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "noisy" and len(c.get_offsets())]
    assert len(hollow) == 1 and "1 NOISY point(s)" in fig.get_suptitle()
    alone = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "alone"]
    assert [list(line.get_ydata()) for line in alone] == [[1.0, 1.0]] * 2


def test_user_rate_figure_has_every_mode_and_the_targets():
    fig = user_rate_figure(designed_rows())
    lines = _series(fig)
    assert len(lines) == 6 and {line.get_label() for line in lines} == {
        "alone", "colocated (process)", "protected (disjoint cores)"}
    protected_6 = [line for line in lines if line.get_label() == "protected (disjoint cores)"][1]
    assert np.allclose(protected_6.get_ydata(), [1e3 / 99] * 2)
    targets = [line.get_ydata()[0] for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "target"]
    assert targets == [3.0, 10.0, 3.0, 10.0] and fig.axes[0].get_yscale() == "log"


def test_figures_say_when_there_is_nothing_to_draw(tmp_path):
    rows = designed_rows(failed={(b, p, m) for b in (1, 6) for p in (64, 512) for m in MECHANISMS})
    for draw in (stretch_figure, user_rate_figure, chunk_figure):
        assert "no data" in draw(rows).axes[0].texts[0].get_text()
    paths = write_interference_figures(designed_rows(), tmp_path)
    assert [p.name for p in paths] == ["interference_stretch.png", "interference_users.png"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_the_report_gets_an_interference_section(tmp_path):
    rows = designed_rows(failed={(1, 512, "protected")})
    empty = write_report(conform(pd.DataFrame()), tmp_path / "empty", found={"interference": [rows.iloc[0:0]]})
    assert 'id="interference"' not in empty["html"].read_text()
    written = write_report(conform(pd.DataFrame()), tmp_path / "report", found={"interference": [rows]})
    page = written["html"].read_text()
    assert 'id="interference"' in page and page.count('<figure id="interference_') == 2
    assert "out of memory: boom" in page and "kept by alone, protected (disjoint cores)" in page
    assert all(written[name].is_file() for name in ("interference_stretch", "interference_users"))


def test_cli_report_on_an_interference_folder(tmp_path, capsys):
    folder = write_folder(tmp_path / "interference-run", designed_rows())
    assert main(["report", str(folder), "--out", str(tmp_path / "out")]) == 0
    assert 'id="interference"' in (tmp_path / "out" / "report.html").read_text()
    assert f"interference: {folder}" in capsys.readouterr().out


# the hybrid form: (ITL p99, mean, TTFT) in ms per (batch, chunk) at prompt 512; decode-only 10 ms at batch 1, 20 at 8
HYBRID = {(1, "64"): (40.0, 14.0, 400.0), (1, "256"): (90.0, 30.0, 320.0), (1, "whole"): (300.0, 300.0, 300.0),
          (8, "64"): (60.0, 25.0, 500.0), (8, "256"): (120.0, 45.0, 420.0), (8, "whole"): (380.0, 380.0, 380.0)}


def designed_hybrid_rows(model_layers=32) -> pd.DataFrame:
    rows = []
    for (batch, chunk), (p99, mean, ttft) in HYBRID.items():
        iterations = {"64": 8, "256": 2, "whole": 1}[chunk]
        head, whole = 1.0, 1.0 + (mean - 1.0) * model_layers / 2
        rows.append({"device": "cpu", "model": "m-test", "layers": 2, "dtype": "float32", "batch": batch,
                     "context": 300, "prompt": 512, "mode": "hybrid",
                     "mechanism": "whole prompt" if chunk == "whole" else "chunked", "chunk": chunk,
                     "chunk_tokens": 512 if chunk == "whole" else int(chunk), "iterations": iterations,
                     "samples": 4 * iterations,
                     "itl_mean_ms": mean, "itl_p50_ms": 0.8 * mean, "itl_p90_ms": 0.9 * p99, "itl_p99_ms": p99,
                     "itl_max_ms": p99, "decode_only_ms": 10.0 * (1 + (batch == 8)), "ttft_ms": ttft,
                     "chunk_cost": ttft / HYBRID[(batch, "whole")][2], "prefill_alone_ms": 250.0,
                     "decode_tokens_per_s": batch * iterations * 1e3 / ttft, "model_layers": model_layers,
                     "head_ms": head, "model_itl_ms": whole, "tokens_per_s_per_user": 1e3 / whole,
                     "whole_model": f"scaled from 2 of {model_layers} layers", "status": "ok", "reason": ""})
    return conform_interference(pd.DataFrame(rows))


def test_hybrid_rows_print_per_chunk_with_their_tail_ttft_and_whole_model_basis():
    rows = pd.concat([designed_rows(), designed_hybrid_rows()], ignore_index=True)
    text = interference_summary(rows)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Hybrid iteration: one prompt's arrival"))
    assert "@L: of the layers timed, model_: the whole model" in lines[start]
    header, table = lines[start + 1].split(), [line.split() for line in lines[start + 2:start + 8]]
    assert header[:8] == ["batch", "prompt", "chunk", "iterations", "arrivals", "samples", "decode_only@L", "mean@L"]
    # rows of schema 3: a p99 from 32, 8 or 4 samples is no p99, the tail is the max of N (never a bare "p99")
    assert [(r[0], r[2], r[5], r[9], " ".join(r[10:13])) for r in table] == [
        ("1", "64", "32", "40", "max of 32"), ("1", "256", "8", "90", "max of 8"),
        ("1", "whole", "4", "300", "max of 4"), ("8", "64", "32", "60", "max of 32"),
        ("8", "256", "8", "120", "max of 8"), ("8", "whole", "4", "380", "max of 4")]
    assert "400 [–]" in lines[start + 2] and "1.33" in lines[start + 2]  # TTFT without an interval says so
    assert "Spatial sharing: the decode step beside a looped prefill (ITL in ms over the decode steps)" in lines
    found = verdicts(designed_hybrid_rows()).set_index(["batch", "prompt", "target"])
    # whole model of 32 layers scaled from 2: ITL 1 + (mean - 1) x 16 ms; chunk 64 at batch 1: 209 ms, 4.8 tok/s
    assert found.loc[(1, 512, 3.0), "kept"] == ["hybrid (chunk 64)"]
    assert found.loc[(1, 512, 3.0), "basis"] == "scaled from 2 of 32 layers"
    assert "  batch 8, prompt 512, 3 tok/s (scaled from 2 of 32 layers): kept by none; lost by hybrid (chunk 64), " \
           "hybrid (chunk 256), hybrid (whole prompt)" in interference_summary(designed_hybrid_rows()).splitlines()
    assert "  batch 6, prompt 512, 3 tok/s (2 layers timed, not scaled to the model): kept by alone, protected " \
           "(disjoint cores); lost by colocated (process)" in lines


def test_chunk_figure_draws_the_tail_and_ttft_per_chunk_and_batch(tmp_path):
    rows = designed_hybrid_rows()
    fig = chunk_figure(rows)
    assert len(fig.axes) == 4  # ITL and TTFT for each of the two batches
    series = {(ax_i, line.get_label()): list(line.get_ydata()) for ax_i, ax in enumerate(fig.axes)
              for line in ax.get_lines() if line.get_gid() == SERIES_GID}
    assert series[(0, "prompt 512 tail (p99, or max of N)")] == [40.0, 90.0, 300.0]
    assert series[(0, "prompt 512 mean")] == [14, 30, 300]
    assert series[(3, "prompt 512")] == [500.0, 420.0, 380.0]  # batch 8's TTFT
    assert [t.get_text() for t in fig.axes[3].get_xticklabels()] == ["64", "256", "whole"]
    # row-major: batch 1's and batch 8's ITL panels, then their TTFT panels
    only = [line.get_ydata()[0] for line in fig.axes[1].get_lines() if line.get_gid() == "decode_only"]
    separated = [line.get_ydata()[0] for line in fig.axes[2].get_lines() if line.get_gid() == "separated"]
    assert only == [20.0] and separated == [250.0]
    paths = write_interference_figures(rows, tmp_path)
    assert [p.name for p in paths] == ["interference_chunks.png"]
