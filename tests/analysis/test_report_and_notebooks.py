"""`phasebench report` on real runner and pytest-benchmark output, and the notebooks executed headless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from phasebench.analysis import load
from phasebench.bench.cli.main import main

from ..conftest import REPO, run_cli

NOTEBOOKS = sorted((REPO / "analysis").glob("*.ipynb"))
# the sample run folders (result rows); a `phasebench interference` sample holds rows of its own (load_interference)
SAMPLES = sorted(p for p in (REPO / "analysis" / "sample").iterdir() if p.is_dir() and any(p.rglob("results.csv")))


def test_report_on_a_fresh_quick_run(quick_run, tmp_path):
    proc = run_cli("report", str(quick_run), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert "roofline.png" in pngs and len(pngs) >= 5
    assert {"linear_sweep.png", "layer_tokens_per_second.png"} <= pngs  # the quick suite has linear cases
    page = (tmp_path / "report.html").read_text()
    page = page.replace("<wbr>", "")  # column names may break after an underscore
    assert "data:image/png;base64," in page and "best_pct_roofline" in page
    assert "prefill" in proc.stdout and "decode" in proc.stdout


@pytest.mark.slow
def test_report_on_a_pytest_benchmark_json(bench_json, tmp_path):
    assert main(["report", str(bench_json), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "roofline.png").stat().st_size > 1000 and (tmp_path / "report.html").exists()


@pytest.mark.slow
def test_runner_and_benchmark_rows_combine(quick_run, bench_json):
    # What holds on any device: the counts come from the files (the suites differ between CPU and GPU).
    runner_rows = len(load(quick_run))
    with open(quick_run / "results.csv", encoding="utf-8") as handle:
        assert runner_rows == sum(1 for _ in handle) - 1
    entries = json.loads(bench_json.read_text())["benchmarks"]
    bench_rows = sum(1 for entry in entries if "impl" in (entry.get("extra_info") or {}))
    assert bench_rows == len(load(bench_json)) > 0
    df = load(quick_run, bench_json)
    assert len(df) == runner_rows + bench_rows and df.run_id.nunique() == 2
    assert set(df.op) == {"attention", "linear", "qlinear"}
    assert {"naive", "flash", "triton"} <= set(df.impl)
    for run_id, rows in df.groupby("run_id"):
        assert set(rows.op) == {"attention", "linear", "qlinear"}, run_id


def test_report_refuses_a_broken_file(tmp_path, capsys):
    broken = tmp_path / "results.csv"
    broken.write_text("this,is\nnot,a result")
    assert main(["report", str(broken), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and len(err.strip().splitlines()) == 1


def test_committed_samples_load():
    assert SAMPLES, "analysis/sample/ holds the sample result sets"
    df = load(SAMPLES)
    assert (df.status == "ok").sum() > 0 and {"prefill", "decode"} <= set(df.phase)


def test_committed_interference_sample_loads():
    from phasebench.analysis import load_interference

    rows = load_interference(REPO / "analysis" / "sample" / "cpu-interference")
    assert set(rows["mode"]) == {"alone", "colocated", "protected"} and (rows["status"] == "ok").all()
    assert rows["batch"].nunique() >= 2 and rows["prompt"].nunique() >= 2


# The figures each notebook draws, at least.
NOTEBOOK_IMAGES = {
    "roofline.ipynb": 6,  # roofline, phases, tokens/s, two scaling figures, speedup
    "linear.ipynb": 4,  # linear sweep, layer tokens/s, roofline, speedup
    "phases.ipynb": 6,  # TTFT, decode sweep, chunked prefill, decode breakdown, speculation (or its no-data note) x2
    "interference.ipynb": 2,  # the stretch, what each user sees
}
NO_TORCH = 'import sys\nassert not [m for m in sys.modules if m.split(".")[0] in ("torch", "triton")]'


def test_every_notebook_is_checked():
    assert {path.name for path in NOTEBOOKS} == set(NOTEBOOK_IMAGES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path):
    nbformat = pytest.importorskip("nbformat", reason="the notebooks run with the dev extra (nbformat, nbclient)")
    nbclient = pytest.importorskip("nbclient", reason="the notebooks run with the dev extra (nbformat, nbclient)")
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(NO_TORCH))  # whatever the notebook itself checks
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    shown = [o["data"] for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []) if "data" in o]
    images = [data for data in shown if "image/png" in data]
    assert len(images) >= NOTEBOOK_IMAGES[path.name]
    if path.name != "interference.ipynb":  # that one opens with its own answer, interference_summary (no rows)
        assert 'class="hl-block"' in shown[0].get("text/html", "")  # it opens with the report's headline
