"""`phasebench selfcheck`: a GPU session in one budgeted command (or its dry run at host sizes), in at most 8 files."""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

from ..sweep.measure import one_line
from ..sweep.runner import now as _now
from .child_process import allowance
from .selfcheck_plan import GPU, HOST, STEPS, SelfcheckPlan
from .selfcheck_steps import STEP_FUNCTIONS, StepContext, StepOutcome

MAX_FILES, MAX_BYTES = 8, 16 << 20  # what one device call brings back
MIN_STEP_S = 2.0  # a step offered less is skipped, and says so
# what DIR holds: the summary, the live log, the HTML report, the merged JUnit report, and everything else packed
SUMMARY, LOG, REPORT, TESTS, ARCHIVE = "summary.json", "selfcheck.log", "report.html", "tests.xml", "results.tar.gz"
OURS = (SUMMARY, LOG, ARCHIVE, REPORT, TESTS)  # the last two are in the archive too: left out first for room


def choose_plan(cuda_available: bool, dry_run: bool, total_s: float | None) -> SelfcheckPlan:
    """The GPU plan where CUDA is and no dry run was asked for, else the host dry run; scaled to `total_s`."""
    plan = GPU if cuda_available and not dry_run else HOST
    return plan if total_s is None else plan.with_total(total_s)


def default_tests_dir() -> Path | None:
    """`tests/` of the working directory (a checkout or the device's copy of it), else of the checkout this
    package was installed from in editable mode."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "tests" / "conftest.py").is_file():
            return root / "tests"
    return None


def others_in(out: Path) -> list[str]:
    """Files in `out` the self-check did not write (a console log teed there, say): they count toward the 8."""
    return sorted(p.name for p in out.iterdir() if p.name not in OURS and p.name != ".phasebench-write-test")


def _pack(work: Path, out: Path, summary: dict) -> None:
    """Copy the report and test results beside the log (as many as the files already there leave room for), pack
    the rest of `work` into one archive under MAX_BYTES (largest files left out first, and named), then write the
    summary that lists the files."""
    others = others_in(out)
    room = MAX_FILES - len(others) - 3  # the summary, the log and the archive always
    copies = ((REPORT, work / "report" / "report.html"), (TESTS, work / "tests.xml"))
    for name, src in copies[:max(0, room)]:
        if src.is_file():
            shutil.copyfile(src, out / name)
    for name, _ in copies[max(0, room):]:  # a file that appeared since: ours goes, its copy stays in the archive
        (out / name).unlink(missing_ok=True)
    files = sorted((p for p in work.rglob("*") if p.is_file() and "cache" not in p.relative_to(work).parts),
                   key=lambda p: p.stat().st_size)
    left_out = []
    while True:
        archive = out / ARCHIVE
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:  # rewritten after every step: fast over small
            for path in files:
                tar.add(path, arcname=str(Path("selfcheck") / path.relative_to(work)))
        if archive.stat().st_size <= MAX_BYTES or not files:
            break
        dropped = files.pop()  # the largest
        left_out.append(f"{dropped.relative_to(work)} ({dropped.stat().st_size} B)")
    summary["left_out"] = left_out  # this packing's: every pack starts again from the whole folder
    summary["others"] = others
    if others:
        note = f"{len(others)} file(s) in {out} not written by the self-check count toward the {MAX_FILES}"
        only_packed = [name for name, _ in copies[max(0, room):]]
        if only_packed:
            note += f"; {' and '.join(only_packed)} only in {ARCHIVE}"
        if room < 0:
            note += f"; {len(others) + 3} files in all, over the {MAX_FILES} a device call brings back"
        summary["others_note"] = note
    summary["files"] = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file() and p.name != SUMMARY}
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))


def run_selfcheck(out: Path, plan: SelfcheckPlan, *, work: Path, tests_dir: Path | None, steps=STEPS,
                  echo=None) -> dict:
    """Run the plan's steps in order, each within its allowance, the summary and archive rewritten after each one
    (a run that dies keeps what it measured); returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    summary = {"selfcheck": plan.name, "device": plan.device, "dtype": plan.dtype, "started": _now(),
               "finished": None, "budget_s": plan.total_s, "work": str(work), "steps": [], "command": sys.argv}
    with (out / LOG).open("a") as log:
        ctx = StepContext(plan, work, log, echo=echo, tests_dir=tests_dir)
        chosen = [s for s in STEPS if s in steps]
        for index, name in enumerate(chosen):
            spent = time.monotonic() - start
            mine = allowance(plan.total_s - plan.reserve_s - spent, [plan.budgets[s] for s in chosen[index:]])
            print(f"== {name}: up to {mine:.0f} s ({spent:.0f} s of {plan.total_s:.0f} s spent)", flush=True)
            log.write(f"\n== {name} (allowance {mine:.1f} s) {_now()}\n")
            log.flush()
            began = time.monotonic()
            if mine < MIN_STEP_S:
                outcome = StepOutcome("skipped", f"budget: {mine:.1f} s left for it, under the {MIN_STEP_S:g} s "
                                                 "a step needs")
            else:
                try:
                    outcome = STEP_FUNCTIONS[name](ctx, mine)
                except Exception as err:  # one broken step must not lose the others
                    outcome = StepOutcome("failed", one_line(err))
            record = {"name": name, "status": outcome.status, "reason": outcome.reason, "budget_s": plan.budgets[name],
                      "allowance_s": round(mine, 1), "elapsed_s": round(time.monotonic() - began, 1)}
            summary["steps"].append(record)
            summary[name] = outcome.digest
            print(f"   {name}: {outcome.status} in {record['elapsed_s']:.0f} s" +
                  (f" ({outcome.reason})" if outcome.reason else ""), flush=True)
            summary["elapsed_s"] = round(time.monotonic() - start, 1)
            _pack(work, out, summary)
        summary["finished"] = _now()
        summary["elapsed_s"] = round(time.monotonic() - start, 1)
        log.write(f"\n== done in {summary['elapsed_s']:.0f} s {_now()}\n")
    _pack(work, out, summary)
    return summary


def format_summary(summary: dict, out: Path) -> list[str]:
    """The closing lines: each step, the ceilings against the datasheet, the tests, the best figure per suite and
    impl, and the files written."""
    lines = [f"\nselfcheck {summary['selfcheck']} on {summary['device']}: {summary.get('elapsed_s', 0):.0f} s of "
             f"{summary['budget_s']:.0f} s"]
    for step in summary["steps"]:
        lines.append(f"  {step['name']:<9} {step['status']:<8} {step['elapsed_s']:6.1f} s of {step['allowance_s']:6.1f}"
                     + (f"  {step['reason']}" if step["reason"] else ""))
    ceil = summary.get("ceilings") or {}
    if ceil.get("peak_gbps"):
        ratios = ceil.get("measured_over_datasheet") or {}
        streams = [f"{name} {ceil[key]:.1f}" for name, key in (("read", "read_gbps"), ("write", "write_gbps"),
                                                                ("copy", "peak_gbps")) if ceil.get(key)]
        lines.append(f"ceilings: {', '.join(streams)} GB/s"
                     + (f" (read {ratios['read']:.2f}x datasheet)" if "read" in ratios else ""))
        for dtype, tf in ceil["peak_tflops"].items():
            ratio = ratios.get(f"matmul {dtype}")
            lines.append(f"  matmul {dtype}: {tf:.3f} TFLOP/s" + (f" ({ratio:.2f}x datasheet)" if ratio else ""))
    tests = summary.get("tests") or {}
    if "tests" in tests:
        lines.append(f"tests: {tests['passed']} passed, {tests['failures']} failed, {tests['errors']} errors, "
                     f"{tests['skipped']} skipped")
        lines += [f"  FAILED {name}" for name in tests["failed"][:10]]
    for suite, found in (summary.get("suites") or {}).items():
        counts = ", ".join(f"{n} {s}" for s, n in (found.get("status") or {}).items())
        lines.append(f"suite {suite}: {counts or found.get('skipped') or found.get('status')}")
        for best in found.get("best", []):
            if not best["best_pct_roofline"] == best["best_pct_roofline"]:  # NaN: no row to judge
                lines.append(f"  {best['impl']:<8} {best['phase']:<16} no quiet ok row (noisy rows are left out)")
                continue
            lines.append(f"  {best['impl']:<8} {best['phase']:<16} best {best['best_pct_roofline']:.1f}% of roofline, "
                         f"median {best['median_tflops']:.4g} TFLOP/s, {best['median_gbps']:.4g} GB/s")
    for row in (summary.get("interference") or {}).get("interference", []):
        if row.get("mode") == "hybrid" and row.get("status") == "ok":
            lines.append(f"interference: batch {row['batch']} prompt {row['prompt']} hybrid (chunk {row['chunk']}): "
                         f"ITL {row.get('itl_tail') or 'p99'} {row.get('itl_tail_ms', row['itl_p99_ms']):.3g} ms "
                         f"(decode-only {row['decode_only_ms']:.3g}), TTFT "
                         f"{row['ttft_ms']:.4g} ms")
        elif row.get("mode") != "alone" and row.get("status") == "ok":
            lines.append(f"interference: batch {row['batch']} prompt {row['prompt']} {row['mode']} "
                         f"({row['mechanism']}): decode x{row['stretch']:.2f}, prefill x{row['prefill_slowdown']:.2f}")
    ncu = summary.get("ncu") or {}
    if ncu.get("gbps"):
        lines.append(f"ncu: Triton decode kernels {ncu['kernel_us_per_call']:.1f} us per call, {ncu['gbps']:.0f} GB/s "
                     f"(mean of {ncu['case']['calls']} profiled calls; each launch in summary.json)")
    lines.append(f"files in {out}: " + ", ".join(f"{name} ({size / 1e6:.2f} MB)"
                                                 for name, size in (summary.get("files") or {}).items()))
    if summary.get("others_note"):
        lines.append(summary["others_note"])
    if summary.get("left_out"):
        lines.append(f"left out of {ARCHIVE} (over {MAX_BYTES >> 20} MiB): {', '.join(summary['left_out'])}")
    return lines
