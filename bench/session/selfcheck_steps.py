"""The self-check's steps: each runs phasebench's own verbs as budgeted child processes, then digests what they
wrote for the summary."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .child_process import ChildResult, allowance, run_child
from .selfcheck_plan import SelfcheckPlan

CLI = (sys.executable, "-m", "phasebench.bench.cli")
MIN_PASS_S = 5.0  # a pytest pass offered less could not even collect
NCU_IMPORT_S = 45.0  # `ncu --import` of one report: its start alone has taken tens of seconds on a busy machine
# what ncu prints where the driver keeps the GPU's counters from this user or this container
NCU_NO_COUNTERS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "Failed to initialize the profiler")


@dataclass
class StepContext:
    """What every step sees: the plan, the staging folder, the log, the tests folder, and what env found."""

    plan: SelfcheckPlan
    work: Path
    log: TextIO
    echo: TextIO | None = None
    tests_dir: Path | None = None
    env: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.plan.device == "cuda"

    def child(self, command, allowance_s: float, cwd: Path | None = None) -> ChildResult:
        return run_child(command, allowance_s, self.log, echo=self.echo, cwd=cwd,
                         env={"PHASEBENCH_CACHE": str(self.work / "cache"), "PYTHONUNBUFFERED": "1"})


@dataclass
class StepOutcome:
    """A step's status (ok, failed, overran, skipped), why, and its digest for summary.json."""

    status: str
    reason: str = ""
    digest: dict = field(default_factory=dict)


def outcome_of(result: ChildResult, digest: dict | None = None) -> StepOutcome:
    if result.overran:
        return StepOutcome("overran", f"stopped after its allowance ({result.elapsed_s:.0f} s); what it wrote is "
                                      "kept", digest or {})
    if result.returncode != 0:
        last = [line for line in result.tail.splitlines() if line.strip()]
        return StepOutcome("failed", f"exit status {result.returncode}: {last[-1] if last else ''}"[:300], digest or {})
    return StepOutcome("ok", "", digest or {})


def step_env(ctx: StepContext, allowance_s: float) -> StepOutcome:
    path = ctx.work / "env.json"
    result = ctx.child([*CLI, "env", "--device", ctx.plan.device, "--json", str(path)], allowance_s)
    if path.is_file():
        ctx.env.update(json.loads(path.read_text()))
    return outcome_of(result, {k: ctx.env.get(k) for k in ("versions", "device", "flash_attn", "tools",
                                                           "triton_mode", "git_commit")})


def _junit_root(path: Path) -> ET.Element | None:
    """The parsed report, or None where it is missing or cut short (a pytest killed while writing it)."""
    try:
        return ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None


def _junit_counts(paths: list[Path]) -> dict:
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": [], "skip_reasons": {},
              "unreadable": [p.name for p in paths if p.is_file() and _junit_root(p) is None]}
    for path in paths:
        root = _junit_root(path)
        if root is None:
            continue
        for case in root.iter("testcase"):
            counts["tests"] += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            for kind in ("failure", "error"):
                if case.find(kind) is not None:
                    counts[kind + "s"] += 1
                    counts["failed"].append(name)
            skip = case.find("skipped")
            if skip is not None:
                counts["skipped"] += 1
                reason = (skip.get("message") or "").split("\n")[0][:120]
                counts["skip_reasons"][reason] = counts["skip_reasons"].get(reason, 0) + 1
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed"] = counts["failed"][:50]
    return counts


def merge_junit(paths: list[Path], out: Path) -> None:
    """The test suites of several JUnit files under one <testsuites> root."""
    root = ET.Element("testsuites")
    for path in paths:
        tree = _junit_root(path)
        if tree is not None:
            root.extend(tree.iter("testsuite") if tree.tag == "testsuites" else [tree])
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)


def step_tests(ctx: StepContext, allowance_s: float) -> StepOutcome:
    """The CUDA test set (`-m cuda`): in parallel where pytest-xdist is installed, then the tests that time the GPU
    (`gpu_exclusive`) alone. On a host without CUDA every one of them skips with its reason."""
    if ctx.tests_dir is None or not ctx.tests_dir.is_dir():
        return StepOutcome("skipped", "no tests folder: run from the repository root or give --tests DIR")
    out = ctx.work / "tests"
    out.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pytest", str(ctx.tests_dir), "-p", "no:cacheprovider", "-q", "-rfE"]
    if importlib.util.find_spec("pytest_timeout"):
        base += ["--timeout", "300"]  # one hung test must not take the step
    if not ctx.cuda and ctx.env.get("cuda_available"):  # a dry run beside a GPU: the set is listed, not run
        passes = [("cuda", "cuda", ["--collect-only"], 1.0)]
    elif ctx.cuda and importlib.util.find_spec("xdist"):  # Triton compiles in parallel; GPU timing tests run alone
        passes = [("parallel", "cuda and not gpu_exclusive", ["-n", str(min(8, max(2, (os.cpu_count() or 2) // 2)))],
                   0.85), ("exclusive", "cuda and gpu_exclusive", [], 0.15)]
    else:
        passes = [("cuda", "cuda", [], 1.0)]
    results, paths, starved = [], [], []
    for index, (name, marks, extra, _) in enumerate(passes):
        left = allowance_s - sum(r.elapsed_s for r in results)
        mine = allowance(left, [share for *_, share in passes[index:]])
        if mine < MIN_PASS_S:
            starved.append(f"{name} ({marks}) not run: {mine:.0f} s left for it")
            continue
        paths.append(out / f"{name}.xml")
        results.append(ctx.child([*base, "-m", marks, *extra, f"--junitxml={paths[-1]}"], mine,
                                 cwd=ctx.tests_dir.parent))
    merge_junit(paths, ctx.work / "tests.xml")
    counts = _junit_counts(paths)
    counts["not_run"] = starved
    if passes[0][2] == ["--collect-only"]:
        found = re.findall(r"(\d+)(?:/\d+)? tests? collected", results[0].tail)
        counts["collected_only"] = int(found[-1]) if found else None
    bad = [r for r in results if r.overran or r.returncode not in (0, 5)]  # 5: that pass selected no test
    if not bad and starved:
        return StepOutcome("partial", "; ".join(starved), counts)
    if not bad:
        return StepOutcome("ok", "", counts)
    worst = outcome_of(bad[0], counts)
    if worst.status == "failed" and bad[0].returncode == 1:
        worst.reason = f"{counts['failures']} failed, {counts['errors']} errors of {counts['tests']} tests"
    return worst


def step_ceilings(ctx: StepContext, allowance_s: float) -> StepOutcome:
    result = ctx.child([*CLI, "ceilings", "--device", ctx.plan.device, "--refresh", "--json", "--dtype",
                        *ctx.plan.ceiling_dtypes], allowance_s)
    found = [line for line in result.tail.splitlines() if line.startswith("{")]
    if not found:
        return outcome_of(result)
    ceil = json.loads(found[-1])
    (ctx.work / "ceilings.json").write_text(json.dumps(ceil, indent=1))
    sheet = ceil.get("datasheet") or {}
    ratios = {}
    if sheet:  # a datasheet's bandwidth is what the memory reads at: the read stream compares with it
        ratios["read"] = ceil.get("read_gbps", ceil["peak_gbps"]) / sheet["peak_gbps"]
        ratios.update({f"matmul {d}": tf / sheet["peak_tflops"][d] for d, tf in ceil["peak_tflops"].items()
                       if d in sheet["peak_tflops"]})
    return outcome_of(result, {"peak_gbps": ceil["peak_gbps"], "read_gbps": ceil.get("read_gbps"),
                               "write_gbps": ceil.get("write_gbps"), "peak_tflops": ceil["peak_tflops"],
                               "datasheet": sheet or None, "measured_over_datasheet": ratios,
                               "warnings": ceil.get("warnings", []), "conditions": ceil.get("conditions", {})})


def suite_dirs(ctx: StepContext) -> list[Path]:
    """The suites' result folders that hold rows."""
    root = ctx.work / "suites"
    return [root / s for s in ctx.plan.suites if (root / s / "results.csv").is_file()]


def _suite_digest(folder: Path) -> dict:
    from ...analysis import load, status_table, summary_table

    df = load(folder)
    run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {}
    best = summary_table(df, by=("op", "phase", "impl"))
    return {"rows": len(df), "status": df["status"].value_counts().to_dict(),
            "budget_skips": int(df["reason"].fillna("").str.startswith("time budget").sum()),
            "status_by_impl": status_table(df, by=("impl",)).to_dict("records"),
            "best": best.to_dict("records"), "autotune": run.get("autotune", [])}


def suite_impls(plan: SelfcheckPlan, suite: str) -> list[str]:
    """The impls a suite runs with in the self-check: the plan's, else every one available on its device (those that
    compile on their first call only where the plan asks for them)."""
    if suite in plan.suite_impls:
        return list(plan.suite_impls[suite])
    from ..sweep.selection import case_ops, resolve_impls
    from ..sweep.suites import suite_cases

    ops = case_ops(suite_cases(suite, plan.device, plan.dtype, plan.models))
    return resolve_impls((), plan.device, ops, compiled=plan.compiled)


def step_suites(ctx: StepContext, allowance_s: float) -> StepOutcome:
    """Each suite as its own `phasebench run` with a time budget from its share: a cut-off suite still spreads its
    rows over the sweep and records the rest as skipped, and time one suite leaves goes to the next."""
    plan, digest, results = ctx.plan, {}, []
    suites = list(plan.suites.items())
    for index, (suite, _) in enumerate(suites):
        left = allowance_s - sum(r.elapsed_s for r in results)
        mine = allowance(left, [share for _, share in suites[index:]])
        need = plan.startup_s + plan.teardown_s + 1  # start-up, one row, and writing its results
        if mine < need:
            digest[suite] = {"skipped": f"{mine:.1f} s left for it, under the {need:g} s a run needs"}
            continue
        out = ctx.work / "suites" / suite
        impls = suite_impls(plan, suite)
        result = ctx.child([*CLI, "run", "--suite", suite, "--impl", *impls, "--model", *plan.models, "--device",
                            plan.device, "--dtype", plan.dtype, "--sample-time", str(plan.sample_time),
                            "--time-budget", f"{mine - plan.teardown_s:.1f}", "--out", str(out)],
                           mine)
        results.append(result)
        digest[suite] = {"run": outcome_of(result).status, "elapsed_s": round(result.elapsed_s, 1),
                         "allowance_s": round(mine, 1)}
        if (out / "results.csv").is_file():
            digest[suite].update(_suite_digest(out))
    short = [s for s, d in digest.items() if d.get("run") != "ok"]  # failed, stopped at its allowance, or not run
    if not short:
        return StepOutcome("ok", "", digest)
    failed = [s for s in short if digest[s].get("run") == "failed"]
    return StepOutcome("failed" if len(failed) == len(suites) else "partial",
                       "not ok: " + ", ".join(f"{s} ({digest[s].get('run', 'not run')})" for s in short), digest)


def _csv_records(folder: Path, names) -> dict:
    """The tables `folder/NAME.csv` that exist, as lists of records."""
    import pandas as pd

    return {name: pd.read_csv(folder / f"{name}.csv").to_dict("records")
            for name in names if (folder / f"{name}.csv").is_file()}


def interference_dir(ctx: StepContext) -> Path | None:
    found = ctx.work / "interference"
    return found if (found / "interference.csv").is_file() else None


def step_interference(ctx: StepContext, allowance_s: float) -> StepOutcome:
    """A decode step alone, beside a prefill (a second stream and a second process) and protected from it."""
    out = ctx.work / "interference"
    result = ctx.child([*CLI, "interference", *ctx.plan.interference_args, "--device", ctx.plan.device, "--dtype",
                        ctx.plan.dtype, "--out", str(out)], allowance_s)
    return outcome_of(result, _csv_records(out, ("interference",)))


def step_phases(ctx: StepContext, allowance_s: float) -> StepOutcome:
    out = ctx.work / "phases"
    reuse = [str(p) for p in suite_dirs(ctx)]
    measured = interference_dir(ctx)
    result = ctx.child([*CLI, "phases", *ctx.plan.phases_args, "--device", ctx.plan.device, "--dtype",
                        ctx.plan.dtype, "--sample-time", str(ctx.plan.sample_time), "--out", str(out),
                        "--time-budget", f"{allowance_s - ctx.plan.teardown_s:.1f}",
                        *(["--reuse", *reuse] if reuse else []),
                        *(["--interference", str(measured)] if measured else [])], allowance_s)
    return outcome_of(result, _csv_records(out, ("prefill", "decode", "chunked", "colocated", "reference")))


def step_profile(ctx: StepContext, allowance_s: float) -> StepOutcome:
    out = ctx.work / "profile"
    shapes = [arg for shape in ctx.plan.profile_shapes for arg in ("--shape", shape)]
    result = ctx.child([*CLI, "profile", "--tool", "torch", "--impl", "naive", "flash", "triton", "--model",
                        *ctx.plan.models, *shapes, "--device",
                        ctx.plan.device, "--dtype", ctx.plan.dtype, "--out", str(out)], allowance_s)
    return outcome_of(result, _csv_records(out, ("summary",)))


def step_ncu(ctx: StepContext, allowance_s: float) -> StepOutcome:
    """ncu on the Triton split-KV decode kernels of one case; without ncu (or CUDA) the program it would profile
    runs alone, so the step still proves its path."""
    from ...profiles.capture import ncu_command, ncu_path

    out = ctx.work / "ncu"
    out.mkdir(parents=True, exist_ok=True)
    target = [sys.executable, "-m", "phasebench.bench.session.ncu_target", "--shape", ctx.plan.ncu_shape, "--model",
              *ctx.plan.models, "--impl", "triton", "--device", ctx.plan.device, "--dtype", ctx.plan.dtype,
              "--json", str(out / "case.json")]
    ncu = ncu_path() if ctx.cuda else None
    if ncu is None:
        result = ctx.child(target, allowance_s)
        done = outcome_of(result)
        why = "no CUDA device" if not ctx.cuda else "ncu not found (PATH, /usr/local/cuda, /opt/nvidia/nsight-compute)"
        return StepOutcome("skipped" if done.status == "ok" else done.status,
                           f"{why}; the program it profiles ran alone: {done.status} {done.reason}".strip())
    report = out / "decode"
    began = time.monotonic()
    result = ctx.child(ncu_command(ncu, report, target, kernels="split_kv_kernel|reduce_kernel"), allowance_s * 0.85)
    rep = report.with_suffix(".ncu-rep")
    refused = next((m for m in NCU_NO_COUNTERS if m in result.tail), None)
    if not rep.is_file() and refused:  # the machine's limit, not ours: said, and the session goes on
        return StepOutcome("skipped", f"ncu cannot read the GPU's counters here ({refused}); see the log")
    if not rep.is_file():
        return outcome_of(result) if not result.ok else StepOutcome("failed", "ncu wrote no report")
    with (out / "details.csv").open("w") as csv_file:
        subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "details"], stdout=csv_file,
                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=max(NCU_IMPORT_S, allowance_s - (time.monotonic() - began)))
    return outcome_of(result, ncu_digest(out))


def ncu_digest(out: Path) -> dict:
    """Per launch the digest columns, and the case's achieved GB/s over the summed kernel time of one call."""
    from ...profiles.ncu import NcuFormatError, digest, read_details

    try:
        launches = digest(read_details(out / "details.csv"))
    except (NcuFormatError, OSError) as err:
        return {"error": str(err)}
    info = json.loads((out / "case.json").read_text()) if (out / "case.json").is_file() else {}
    found = {"launches": launches.to_dict("records"), "case": info}
    if info and len(launches) and launches["duration_us"].notna().all():
        per_call_s = launches["duration_us"].sum() / 1e6 / info["calls"]
        found["kernel_us_per_call"] = per_call_s * 1e6
        found["gbps"] = info["bytes"] / per_call_s / 1e9
    return found


def step_report(ctx: StepContext, allowance_s: float) -> StepOutcome:
    sources = [str(p) for p in suite_dirs(ctx)]
    if (ctx.work / "phases" / "phases.json").is_file():
        sources.append(str(ctx.work / "phases"))
    if interference_dir(ctx) is not None:
        sources.append(str(interference_dir(ctx)))
    if not sources:
        return StepOutcome("skipped", "no results to report")
    result = ctx.child([*CLI, "report", *sources, "--out", str(ctx.work / "report")], allowance_s)
    return outcome_of(result)


STEP_FUNCTIONS = {"env": step_env, "tests": step_tests, "ceilings": step_ceilings, "suites": step_suites,
                  "interference": step_interference, "phases": step_phases, "profile": step_profile, "ncu": step_ncu,
                  "report": step_report}

