"""The report page: sections in order (the answer, figures, tables), long tables folded with their counts, a
comparison only where the runs share measurements, every kind of source together, and a section or kind added
in a few lines."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from phasebench.analysis import load, read_sources, write_report
from phasebench.analysis.report import SECTIONS, Kind, Section, comparison_of, problems_table, sources
from phasebench.analysis.report.context import MANY_COLUMNS, table_html
from phasebench.bench.cli.main import main
from phasebench.bench.spec.schema import conform

from .phase_rows import write_phases
from .test_report_headline import phase_tables


def section_ids(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', page)


def test_the_answer_comes_first_then_figures_then_tables(tmp_path, rng, helpers):
    rows = conform(pd.concat([helpers.make_rows(rng), helpers.make_linear_rows(rng)], ignore_index=True))
    paths = write_report(rows, tmp_path, phases=phase_tables())
    page = paths["html"].read_text(encoding="utf-8")
    ids = section_ids(page)
    assert ids == ["headline", "figures", "phases", "linear", "ceilings", "summary", "flagged", "correctness", "status",
                   "runs"]
    headline, figures = page.split('<section id="figures"')[0], page.split('<section id="phases"')[0]
    assert headline.count("<figure") == 1 and 'id="roofline"' in headline  # the roofline beside the headline
    assert re.findall(r"<table(?! class=\"hl\")", figures) == []  # no table but the headline's before the tables
    for name in ("phases_ttft", "phases_decode", "phases_chunk", "phases_breakdown", "linear_sweep", "speedup"):
        assert f'<figure id="{name}"' in figures and paths[name].is_file()
    nav = re.search(r"<nav>(.*?)</nav>", page).group(1)
    assert re.findall(r'href="#([^"]+)"', nav) == ids


def test_long_tables_fold_and_say_how_many_rows(tmp_path, rng, helpers):
    rows = conform(helpers.make_rows(rng, not_ok=False))
    failing = rows.index[:15]
    rows.loc[failing, ["status", "reason"]] = ("failed", "RuntimeError: out of memory")
    page = write_report(rows, tmp_path)["html"].read_text(encoding="utf-8")
    folded = re.search(r"<details>(<summary>Rows that are not ok, one by one \(15 rows\)</summary>)", page)
    assert folded, "15 rows: folded, the count in the summary line"
    reasons = len(problems_table(rows))  # one line per status, op, impl, phase and reason
    assert re.search(rf'<details id="not-ok-rows" open><summary>Rows that are not ok, by reason \({reasons} rows\)',
                     page)
    assert '<a href="#not-ok-rows">15 failed</a>' in page
    assert '<p id="noisy-rows" class="empty"><b>Noisy rows' in page  # an empty list is one line, its anchor kept


@pytest.fixture
def two_runs(tmp_path, rng, helpers):
    """An attention run, a linear run that shares nothing with it, and a second attention run of the same cases."""
    attention = helpers.write_run(tmp_path / "attention", helpers.make_rows(rng, run_id="a1"))
    linear = helpers.write_run(tmp_path / "linear", helpers.make_linear_rows(rng, run_id="l1"))
    again = helpers.make_rows(rng, run_id="a2")
    again = again[~((again["impl"] == "naive") & (again["phase"] == "decode"))]  # naive decode not measured again
    return attention, linear, helpers.write_run(tmp_path / "again", again)


def header(page: str) -> list[str]:
    return [name.replace("<wbr>", "") for name in re.findall(r"<th>(.*?)</th>", page)]


def test_a_wide_table_says_its_one_value_columns_once_and_breaks_its_column_names(rng):
    rows = 7
    varying = {f"figure_{i}": rng.standard_normal(rows) * 10 ** i for i in range(MANY_COLUMNS - 3)}
    table = pd.DataFrame({"device": ["AMD EPYC"] * rows, "impl": rng.choice(["naive", "torch"], rows),
                          "compute_bound": [True] * rows, "model": [None] * rows, "noisy": [0] * rows,
                          **varying, "projection": ["gate_up"] * rows})
    page = table_html(table)
    said = re.search(r'<p class="note">In every row: (.*?)</p>', page).group(1)
    assert said == ("device <b>AMD EPYC</b> · compute_bound <b>yes</b> · model <b>–</b> · "
                    "projection <b>gate_up</b>")
    assert header(page) == ["impl", "noisy", *varying]  # numbers stay columns, constant or not
    assert "<th>figure_<wbr>0</th>" in page and page.count("<tr>") == rows + 1
    narrow = table.drop(columns=list(varying)[:3])  # MANY_COLUMNS columns or fewer: every column stays
    assert "In every row" not in table_html(narrow) and header(table_html(narrow)) == list(narrow.columns)
    one = table.head(1)  # one row: nothing to say once
    assert "In every row" not in table_html(one) and header(table_html(one)) == list(table.columns)


@pytest.mark.slow
def test_a_comparison_only_when_the_runs_share_a_measurement(two_runs, tmp_path, capsys):
    attention, linear, again = two_runs
    frame, why = comparison_of(read_sources(attention, linear))
    assert frame is None and "share no measurement" in why
    assert comparison_of(read_sources(attention, linear), force=True)[0] is not None
    assert comparison_of(read_sources(attention))[0] is None
    frame, why = comparison_of(read_sources(attention, again))
    assert why == "" and (frame["pairing"] == "pair").any()

    assert main(["report", str(attention), str(linear), "--out", str(tmp_path / "apart")]) == 0
    assert "no comparison" in capsys.readouterr().err
    assert 'id="comparison"' not in (tmp_path / "apart" / "report.html").read_text(encoding="utf-8")
    assert main(["report", str(attention), str(again), "--out", str(tmp_path / "shared")]) == 0
    page = (tmp_path / "shared" / "report.html").read_text(encoding="utf-8")
    only = int((frame["pairing"] == "base only").sum())
    assert section_ids(page).index("comparison") < section_ids(page).index("summary")
    assert f"{only} only in base, 0 only in new" in page.split('<section id="figures"')[0]  # in the headline
    assert re.search(rf"<details><summary>Only in base \({only} rows\)</summary>", page)  # folded, counted
    assert '<p class="empty"><b>Only in new</b>: none.</p>' in page


@pytest.mark.slow
def test_compare_forces_the_section_and_needs_two_result_sets(two_runs, tmp_path, capsys):
    attention, linear, _ = two_runs
    assert main(["report", str(attention), str(linear), "--compare", "--out", str(tmp_path / "forced")]) == 0
    page = (tmp_path / "forced" / "report.html").read_text(encoding="utf-8")
    assert 'id="comparison"' in page and "No pairs: no case of one side was measured on the other." in page
    assert 'id="comparison.png"' not in page and (tmp_path / "forced" / "comparison.png").is_file()
    assert main(["report", str(attention), "--compare", "--out", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err
    assert "needs exactly two" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_run_folders_phases_folders_and_pytest_benchmark_json_together(tmp_path, rng, helpers):
    run = helpers.write_run(tmp_path / "run", helpers.make_rows(rng, run_id="r1"))
    bench = helpers.write_pytest_benchmark(tmp_path / "bench.json", helpers.make_rows(rng, not_ok=False), rng)
    phases = write_phases(tmp_path / "phases", phase_tables())
    ops = helpers.make_rows(rng, run_id="ph", device="AMD EPYC 9654", device_kind="cpu", dtype="float32")
    helpers.write_run(phases / "ops", ops)
    helpers.write_run(phases / "check", ops.iloc[:3])  # the reference check's rounds repeat some ops: not counted
    found = read_sources(run, bench, phases)
    assert {kind: [p.name for p in paths] for kind, paths in found.paths.items()} == {
        "results": ["run", "bench.json"], "phases": ["phases"]}
    assert len(found.rows) == len(load(run)) + len(load(bench)) + len(ops)
    assert len(found.of("phases")) == 1 and found.comparable() == [run, bench]
    assert main(["report", str(run), str(bench), str(phases), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert page.count('class="hl-block"') == 4  # GPU events, pytest-benchmark's clock, the CPU run, the phases


def test_one_more_kind_and_its_section_are_a_few_lines(tmp_path, rng, helpers, monkeypatch):
    # what the interference verb's folders will do: a kind that claims them, a section that shows them
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.json").write_text(json.dumps({"stretch": 1.37}))
    kind = Kind("notes", lambda path: (path / "notes.json").is_file(),
                read=lambda path: json.loads((path / "notes.json").read_text()), rows=False)
    monkeypatch.setattr(sources, "KINDS", [kind, *sources.KINDS])

    def notes_section(ctx):
        found = ctx.of("notes")
        return Section("notes", "Notes", [f"<p>stretch {n['stretch']}</p>" for n in found]) if found else None

    run = helpers.write_run(tmp_path / "run", helpers.make_rows(rng))
    given = read_sources(run, notes)
    assert given.paths["notes"] == [notes] and len(given.rows) == len(load(run))
    paths = write_report(given.rows, tmp_path / "out", found=given.found, sections=[*SECTIONS[:2], notes_section,
                                                                                    *SECTIONS[2:]])
    page = paths["html"].read_text(encoding="utf-8")
    assert section_ids(page)[:3] == ["headline", "figures", "notes"] and "<p>stretch 1.37</p>" in page
    assert 'href="#notes"' in page


def test_a_phases_folder_with_nothing_composed_still_makes_a_page(tmp_path, rng, helpers):
    # a busy host: every op of the phases noisy, so no TTFT or TPOT could be composed
    tables = phase_tables()
    for name, column in (("prefill", "ttft_ms"), ("decode", "tpot_ms")):
        tables[name] = tables[name].assign(**{column: float("nan"), "missing": 3})
    tables["decode"] = tables["decode"].assign(tokens_per_s=float("nan"), tokens_per_s_per_user=float("nan"),
                                               saturated=False)
    paths = write_report(conform(helpers.make_rows(rng)), tmp_path, phases=tables)
    page = paths["html"].read_text(encoding="utf-8")
    points = len(tables["prefill"]) + len(tables["decode"])
    assert f"{points} of {points} TTFT and TPOT points left out" in page
    assert paths["phases_ttft"].stat().st_size > 1000 and "No saturation batch" in page
