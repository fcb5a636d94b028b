"""`phasebench selfcheck`: the plans as data, the packing into at most 8 files, and the dry run end to end."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch
from phasebench.bench.session import selfcheck
from phasebench.bench.session.child_process import ChildResult
from phasebench.bench.session.selfcheck_plan import GPU, HOST, STEPS
from phasebench.bench.session.selfcheck_steps import StepContext, _junit_counts, merge_junit, step_suites

from ...conftest import run_cli

SUITES = ("prefill", "chunked", "verify", "decode", "decode-linear", "prefill-linear", "paged")


def test_plans_fit_their_totals_and_name_every_step():
    for plan in (GPU, HOST):
        assert set(plan.budgets) == set(STEPS) and set(plan.minimum_s) == set(STEPS) - {"suites"}
        assert sum(plan.budgets.values()) + plan.reserve_s <= plan.total_s
        assert set(plan.suites) == set(SUITES) and sum(plan.suites.values()) == pytest.approx(1)
    assert GPU.total_s <= 8 * 60 and HOST.total_s <= 250 and GPU.device == "cuda" and HOST.device == "cpu"
    assert set(GPU.models) == {"llama-3-8b", "llama-3-70b"} and GPU.dtype == "bfloat16"
    half = GPU.with_total(210)
    assert half.total_s == 210 and sum(half.budgets.values()) + half.reserve_s <= 210
    assert half.budgets["suites"] / half.budgets["tests"] == pytest.approx(GPU.budgets["suites"] / GPU.budgets["tests"])
    with pytest.raises(ValueError, match="reserve"):
        GPU.with_total(10)


@pytest.mark.parametrize("plan", [GPU, HOST], ids=["gpu", "host"])
@pytest.mark.parametrize("scale", [1.0, 0.7])
def test_every_share_covers_its_start_up_and_teardown(plan, scale):
    scaled = plan.with_total(plan.total_s * scale)
    assert scaled.shortfalls() == []
    assert plan.with_total(plan.total_s * 0.3).shortfalls()  # the check can fail: a third of the budget is too little


def test_choose_plan():
    assert selfcheck.choose_plan(True, False, None) is GPU
    assert selfcheck.choose_plan(True, True, None) is HOST and selfcheck.choose_plan(False, False, None) is HOST
    assert selfcheck.choose_plan(False, False, 60).total_s == 60


def test_pack_leaves_the_largest_files_out_to_stay_under_the_limit(tmp_path, monkeypatch):
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "suites" / "decode").mkdir(parents=True)
    (work / "cache").mkdir()
    out.mkdir()
    gen = torch.Generator().manual_seed(1)
    noise = torch.randint(0, 256, (300_000,), generator=gen, dtype=torch.uint8).numpy().tobytes()  # incompressible
    (work / "suites" / "decode" / "results.csv").write_text("impl,latency_ms\nnaive,1.5\n")
    (work / "profile.json").write_bytes(noise)
    (work / "cache" / "ceilings.json").write_text("{}")
    (work / "tests.xml").write_text("<testsuites/>")
    (out / selfcheck.LOG).write_text("log\n")
    monkeypatch.setattr(selfcheck, "MAX_BYTES", 100_000)
    summary = {"steps": []}
    selfcheck._pack(work, out, summary)
    assert sorted(p.name for p in out.iterdir()) == sorted([selfcheck.ARCHIVE, selfcheck.LOG, selfcheck.SUMMARY,
                                                            selfcheck.TESTS])
    with tarfile.open(out / selfcheck.ARCHIVE) as tar:
        names = tar.getnames()
    assert "selfcheck/suites/decode/results.csv" in names and "selfcheck/profile.json" not in names
    assert not any("cache" in n for n in names)  # the ceilings cache is the steps' scratch, not a result
    assert summary["left_out"] == ["profile.json (300000 B)"]
    selfcheck._pack(work, out, summary)  # after the next step: the same archive, the list not repeated
    assert summary["left_out"] == ["profile.json (300000 B)"]
    assert json.loads((out / selfcheck.SUMMARY).read_text())["files"][selfcheck.ARCHIVE] <= 100_000
    # files the self-check did not write (a console log teed there) count toward the 8: they are kept, ours make room
    (out / "console.log").write_text("")
    selfcheck._pack(work, out, summary)
    assert (out / selfcheck.TESTS).is_file() and summary["others"] == ["console.log"]
    assert "1 file(s)" in summary["others_note"] and "only in" not in summary["others_note"]
    for i in range(4):
        (out / f"stray-{i}.txt").write_text("")
    selfcheck._pack(work, out, summary)
    assert not (out / selfcheck.TESTS).exists() and (out / "console.log").is_file()
    assert len(list(out.iterdir())) == selfcheck.MAX_FILES and f"{selfcheck.TESTS} only in" in summary["others_note"]


def test_junit_files_merge_and_count(tmp_path):
    one, two = tmp_path / "a.xml", tmp_path / "b.xml"
    one.write_text('<testsuites><testsuite name="pytest" tests="3"><testcase classname="t.a" name="ok"/>'
                   '<testcase classname="t.a" name="bad"><failure message="boom"/></testcase>'
                   '<testcase classname="t.a" name="gpu"><skipped message="no CUDA device"/></testcase>'
                   '</testsuite></testsuites>')
    two.write_text('<testsuite name="pytest" tests="2"><testcase classname="t.b" name="err"><error/></testcase>'
                   '<testcase classname="t.b" name="gpu2"><skipped message="no CUDA device"/></testcase></testsuite>')
    merged = tmp_path / "tests.xml"
    merge_junit([one, two, tmp_path / "missing.xml"], merged)
    counts = _junit_counts([merged])
    assert counts == _junit_counts([one, two])
    assert [counts[k] for k in ("tests", "passed", "failures", "errors", "skipped")] == [5, 1, 1, 1, 2]
    assert counts["failed"] == ["t.a::bad", "t.b::err"] and counts["skip_reasons"] == {"no CUDA device": 2}
    cut = tmp_path / "cut.xml"  # a pytest killed while writing its report
    cut.write_text(one.read_text()[:90])
    partial = _junit_counts([cut, two])
    assert partial["unreadable"] == ["cut.xml"] and partial["tests"] == 2
    merge_junit([cut, two], merged)
    assert _junit_counts([merged])["tests"] == 2


@pytest.mark.parametrize("ends, status", [(["overran"] * 7, "partial"), (["ok"] * 6 + ["overran"], "partial"),
                                          (["failed"] * 7, "failed"), (["ok"] * 7, "ok")])
def test_suites_stopped_at_their_allowance_are_partial_not_failed(tmp_path, ends, status):
    """A busy host stops every suite's run at its allowance: that is the budget's doing, not a failure."""
    ctx = StepContext(plan=HOST, work=tmp_path, log=io.StringIO())
    order = iter(ends)

    def child(command, allowance_s, cwd=None):
        end = next(order)
        return ChildResult(tuple(command), 1 if end == "failed" else 0, allowance_s, end == "overran", "")

    ctx.child = child
    outcome = step_suites(ctx, 200.0)
    assert outcome.status == status and [outcome.digest[s]["run"] for s in SUITES] == ends
    assert status == "ok" or outcome.reason == "not ok: " + ", ".join(
        f"{s} ({end})" for s, end in zip(SUITES, ends, strict=True) if end != "ok")


@pytest.fixture(scope="session")
def dry_run(tmp_path_factory):
    """`phasebench selfcheck --dry-run` once: its exit status, its folder and its work folder."""
    root = tmp_path_factory.mktemp("selfcheck")
    out, work = root / "out", root / "work"
    out.mkdir(parents=True)
    (out / "console.log").write_text("a log teed into the folder before the self-check starts\n")
    # half as much time again as the plan: a slower host (CI) still runs every step; no test judges the timing
    proc = run_cli("selfcheck", "--dry-run", "--out", str(out), "--work", str(work), "--budget",
                   f"{HOST.total_s * 1.5:g}", timeout=900)
    return proc, out, work


def finished(steps: dict, name: str) -> bool:
    """A step that ended on its own: everything it writes is promised. One stopped at its allowance (`overran`: a
    slow or busy host) promises only what it writes first on the stop."""
    return steps[name]["status"] != "overran"


@pytest.mark.slow
def test_dry_run_writes_at_most_eight_small_files(dry_run):
    proc, out, _ = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    files = list(out.iterdir())
    assert len(files) <= selfcheck.MAX_FILES and all(f.is_file() and f.stat().st_size <= 16 << 20 for f in files)
    steps = {s["name"]: s for s in json.loads((out / selfcheck.SUMMARY).read_text())["steps"]}
    report = {selfcheck.REPORT} if finished(steps, "report") else set()
    assert {selfcheck.SUMMARY, selfcheck.LOG, selfcheck.TESTS, selfcheck.ARCHIVE, "console.log", *report} \
        <= {f.name for f in files} <= {selfcheck.SUMMARY, selfcheck.LOG, selfcheck.REPORT, selfcheck.TESTS,
                                       selfcheck.ARCHIVE, "console.log"}
    assert proc.stdout.splitlines()[0].startswith("plan: cpu dry run (--dry-run asked for)")
    assert "1 file(s) there already count toward the 8" in proc.stdout.splitlines()[0]
    if report:
        assert "<html" in (out / selfcheck.REPORT).read_text()[:500].lower()


@pytest.mark.slow
def test_dry_run_ran_every_step(dry_run):
    proc, out, _ = dry_run
    summary = json.loads((out / selfcheck.SUMMARY).read_text())
    assert summary["selfcheck"] == "host-dry-run" and summary["device"] == "cpu"
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == list(STEPS)
    assert all(s["allowance_s"] <= summary["budget_s"] for s in steps.values())
    # a step or suite the budget cut short is `overran` or `partial`: it kept what it measured; none failed
    assert all(s["status"] in ("ok", "partial", "overran", "skipped") for s in steps.values()), steps
    assert not finished(steps, "report") or steps["report"]["status"] == "ok"
    if finished(steps, "env"):
        assert steps["env"]["status"] == "ok" and summary["env"]["versions"]["torch"] == torch.__version__
    if finished(steps, "ncu"):  # no ncu here: the program it would profile ran alone
        assert steps["ncu"]["status"] == "skipped" and "ran alone: ok" in steps["ncu"]["reason"]
    if finished(steps, "ceilings"):
        assert summary["ceilings"]["peak_gbps"] > 0 and summary["ceilings"]["peak_tflops"]["float32"] > 0
    tests = summary["tests"]
    if not finished(steps, "tests"):
        assert tests["failures"] == 0 and tests["errors"] == 0  # what ran before the stop
    elif torch.cuda.is_available():  # beside a GPU the dry run lists the CUDA set without running it
        assert steps["tests"]["status"] == "ok" and tests["collected_only"] > 0
    else:  # here every CUDA test is collected and skips with its reason
        assert steps["tests"]["status"] == "ok"
        assert tests["tests"] > 100 and tests["skipped"] == tests["tests"] and tests["failures"] == 0
        assert tests["skip_reasons"].get("no CUDA device", 0) > 0
    for suite in SUITES:  # what the budget promises: a run that ended on its own time wrote a row at least
        found = summary["suites"][suite]
        if "skipped" in found:  # the suites before it left it less than a run needs: said so
            assert "s left for it, under the" in found["skipped"], (suite, found)
            continue
        assert found["run"] in ("ok", "overran"), (suite, found)
        assert found["run"] == "overran" or found["rows"] >= 1, (suite, found)  # stopped in its first row: none
        if "rows" in found:
            assert found["status"].get("ok", 0) + found["budget_skips"] == found["rows"], (suite, found)
    prefill = summary["suites"]["prefill"]
    assert prefill["run"] == "overran" or prefill["status"].get("ok", 0) >= 1
    if finished(steps, "phases"):
        assert {row["phase"] for row in summary["phases"]["reference"]} == {"prefill", "decode"}
    measured = summary["interference"].get("interference", [])  # written first on a stop (unless it came in imports)
    if measured or finished(steps, "interference"):
        assert {(r["batch"], r["prompt"]) for r in measured} == {(4, 64)}
    if finished(steps, "interference"):  # the hybrid form; the decode step alone, beside a prefill, protected
        assert {r["mode"] for r in measured} == {"alone", "colocated", "protected", "hybrid"}
        assert {str(r["chunk"]) for r in measured if r["mode"] == "hybrid"} == {"32", "whole"}
        if finished(steps, "phases"):
            assert {r["option"] for r in summary["phases"]["colocated"]} == {"separated", "co-located", "protected"}
    assert not finished(steps, "profile") or summary["profile"]["summary"]
    assert summary["files"][selfcheck.ARCHIVE] > 0
    for step in STEPS:
        assert f"== {step} (allowance" in (out / selfcheck.LOG).read_text()
    assert "selfcheck host-dry-run on cpu" in proc.stdout and "suite decode:" in proc.stdout


@pytest.mark.slow
def test_dry_run_archive_holds_every_result_and_loads(dry_run, tmp_path):
    _, out, _ = dry_run
    with tarfile.open(out / selfcheck.ARCHIVE) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path, filter="data")
    summary = json.loads((out / selfcheck.SUMMARY).read_text())
    steps, suites = {s["name"]: s for s in summary["steps"]}, summary["suites"]
    # what each step promises (finished): its files, or, stopped at its allowance, what it writes first on the stop
    # (the interference rows; the figures after them may be lost with the rest of a step that overran)
    promised = {"env": ["env.json"], "ceilings": ["ceilings.json"], "tests": ["tests.xml"],
                "phases": ["phases/phases.json"], "profile": ["profile/summary.csv", "profile/trace.json"],
                "ncu": ["ncu/case.json"], "interference": ["interference/interference.csv", "interference/run.json",
                                                           "interference/interference_users.png"]}
    kept_on_stop = {"interference": 2 if summary["interference"].get("interference") else 0}
    measured = [s for s in SUITES if suites[s].get("rows")]
    wanted = [f"suites/{s}/results.parquet" for s in measured]
    for step, files in promised.items():
        wanted += files[:kept_on_stop.get(step, 0)] if steps[step]["status"] == "overran" else files
    for name in wanted:
        assert f"selfcheck/{name}" in names, name
    import phasebench.analysis as pa

    assert "prefill" in measured or suites["prefill"]["run"] == "overran"  # the first suite has the most time
    if measured:
        df = pa.load(*(tmp_path / "selfcheck" / "suites" / s for s in measured))
        assert set(df["suite"]) == set(measured) and set(df["device_kind"]) == {"cpu"}
        linear = {"decode-linear", "prefill-linear"} & set(measured)
        assert set(df["op"]) == {"attention", "linear"} - (set() if linear else {"linear"})


@pytest.mark.slow
def test_a_subset_of_steps_and_bad_arguments(tmp_path):
    proc = run_cli("selfcheck", "--dry-run", "--steps", "env", "ceilings", "--out", str(tmp_path / "o"),
                   "--work", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "o" / selfcheck.SUMMARY).read_text())
    assert [s["name"] for s in summary["steps"]] == ["env", "ceilings"]
    again = run_cli("selfcheck", "--dry-run", "--out", str(tmp_path / "o"))
    assert again.returncode == 2 and "holds a self-check's files already" in again.stderr
    assert len(again.stderr.splitlines()) == 1
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for i in range(6):
        (crowded / f"f{i}").write_text("")
    full = run_cli("selfcheck", "--dry-run", "--out", str(crowded))
    assert full.returncode == 2 and "holds 6 other files" in full.stderr and len(full.stderr.splitlines()) == 1
    bad = run_cli("selfcheck", "--steps", "env", "nonsense", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "unknown step(s) nonsense" in bad.stderr
    budget = run_cli("selfcheck", "--budget", "0", "--out", str(tmp_path / "y"))
    assert budget.returncode == 2 and "budget: must be a positive" in budget.stderr
