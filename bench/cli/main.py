"""The `phasebench` command line: one verb per job, each importing its module only when it runs."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..sweep.selection import (
    UsageError,
    add_isolation_arguments,
    build_cases,
    case_argv,
    case_ops,
    check_counts,
    check_seconds,
    check_writable,
    default_dtype,
    isolation_of,
    load_plugins,
    out_dir_for,
    resolve_device,
    resolve_impls,
)
from . import STARTED
from .interference import add_interference_verb
from .results import cmd_compare, cmd_phases, cmd_report
from .session import add_session_verbs
from .sweeps import cmd_merge, cmd_run_ray, shard_of_run


def package_version() -> str:
    try:
        return version("phasebench")
    except PackageNotFoundError:
        return "unknown"






def cmd_list(args) -> int:
    import torch

    from ...kernels import OPS, describe_impls
    from ..spec.models import MODELS
    from ..sweep.suites import SUITES, suite_cases

    print("suites (cases on this machine's best device, by operator):")
    best = resolve_device(None)
    for name in SUITES:
        cases = suite_cases(name, best.type, default_dtype(best))
        counts = ", ".join(f"{sum(c.op == op for c in cases)} {op}" for op in OPS if any(c.op == op for c in cases))
        print(f"  {name:<15} {counts}")
    print("model presets (hidden / intermediate / layers / q heads / kv heads / head dim / vocab):")
    for name, m in MODELS.items():
        print(f"  {name:<12} {m.hidden}/{m.intermediate}/{m.layers}/{m.q_heads}/{m.kv_heads}/{m.head_dim}/{m.vocab}")
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        for op in OPS:
            print(f"{op} implementations on {device}:")
            for row in describe_impls(device, op=op):
                where = row["backend"] if row["available"] else f"unavailable: {row['reason']}"
                print(f"  {row['impl']:<15} {where}")
    return 0


def cmd_run(args) -> int:
    check_seconds(args, "time_budget", "sample_time", "case_timeout")
    check_counts(args, "retry_noisy", minimum=0)
    if args.ray is not None or args.workers is not None:
        load_plugins(args.plugin)
        if args.time_budget is not None or args.sample_time is not None:
            raise UsageError("time-budget, sample-time: not with --ray (each shard has its own clock)")
        return cmd_run_ray(args)
    isolation = isolation_of(args, start=True)
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    cases, suite = build_cases(args, device)
    impls = resolve_impls(args.impl, device, case_ops(cases))
    out = out_dir_for(args)
    if args.resume and not args.out:
        raise UsageError("resume: needs --out DIR of the run to resume")
    if args.retry_failed and not args.resume:
        raise UsageError("retry-failed: goes with --resume --out DIR")
    check_writable(out)

    from ..sweep.console import Progress, closing_lines, format_table
    from ..sweep.results import ResumeError
    from ..sweep.runner import RunConfig, run

    print(f"phasebench run: {len(cases)} cases x {len(impls)} impls on {device} -> {out}", file=sys.stderr)
    capture = None
    if args.cuda_profiler_range:
        if device.type != "cuda":
            raise UsageError("cuda-profiler-range: needs a CUDA device")
        from ...profiles.capture import cuda_profiler_range as capture
    if args.cuda_graph and device.type != "cuda":
        raise UsageError("cuda-graph: needs a CUDA device")
    from ..sweep.runner import default_timer

    timer = default_timer(device, cuda_graph=args.cuda_graph, sample_time=args.sample_time, warm=args.warm)
    cases, shard = shard_of_run(args, cases, impls, device, timer, out, suite)
    try:
        df = run(RunConfig(cases, impls, device, out, suite=suite, resume=args.resume, retry_failed=args.retry_failed,
                           timer=timer, refresh_ceilings=args.refresh_ceilings, on_row=Progress(), capture=capture,
                           profiled=args.cuda_profiler_range, time_budget_s=args.time_budget, started=STARTED,
                           isolation=isolation, retry_noisy=args.retry_noisy))
    except ResumeError as err:
        raise UsageError(str(err)) from None
    if shard is not None:
        from ..sweep.shards import finish_shard

        finish_shard(out, shard)
    print(format_table(df))
    for line in closing_lines(df, out):
        print(line)
    return 0


def cmd_ceilings(args) -> int:
    from ..instruments.conditions import describe
    from ..instruments.roofline import ceilings
    from ..ops.attention.cases import DTYPES

    device = resolve_device(args.device)
    dtypes = args.dtype or (["float32"] if device.type == "cpu" else ["float32", "float16", "bfloat16"])
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"dtype: unknown dtype {d!r}, choose from {', '.join(DTYPES)}")
    ceil = ceilings(device, tuple(dtypes), refresh=args.refresh)
    if args.json:
        print(json.dumps(ceil.to_json()))
        return 0
    print(f"device: {ceil.device} ({ceil.kind})")
    print(f"  source: {ceil.provenance()}")
    print(f"  conditions: {describe(ceil.conditions)}")
    for d, later in ceil.added.items():
        print(f"  matmul {d} added at {later['measured_at']}, took {later['duration_s']:.1f} s: "
              f"{describe(later.get('conditions') or {})}")
    sheet = ceil.datasheet
    print(f"  copy bandwidth   {ceil.peak_gbps:10.1f} GB/s measured"
          + (f"   {sheet.peak_gbps:10.1f} GB/s datasheet ({sheet.name})" if sheet else ""))
    for d, tf in ceil.peak_tflops.items():
        ds = f"   {sheet.peak_tflops[d]:10.1f} TFLOP/s datasheet" if sheet and d in sheet.peak_tflops else ""
        size = f" at {ceil.matmul_n[d]}^3" if d in ceil.matmul_n else ""
        print(f"  matmul {d:<9} {tf:10.4g} TFLOP/s measured{size}{ds}   ridge {ceil.ridge(d):.3g} FLOP/B")
    for warning in ceil.warnings:
        print(f"  warning: {warning}")
    return 0


def add_case_arguments(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--suite", default="quick",
                      help="quick (default), prefill, chunked, decode, verify, ragged, paged, decode-linear, "
                           "prefill-linear, full")
    verb.add_argument("--op", nargs="+", metavar="OP", help="only cases of these operators: attention, linear")
    verb.add_argument("--impl", nargs="+", metavar="I",
                      help="implementations (default: all available here); each case runs those its operator has")
    verb.add_argument("--model", nargs="+", metavar="M", help="model presets for the suite (or heads for --shape)")
    verb.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    verb.add_argument("--dtype", help="float32, float16 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    verb.add_argument("--plugin", action="append", metavar="MODULE",
                      help="import MODULE (or a .py file) first, so the kernels it registers can be named with --impl")
    verb.add_argument("--shape", action="append", metavar="K=V,...",
                      help="a case by hand, e.g. batch=1,q_heads=32,kv_heads=8,q_len=1,kv_len=65536,head_dim=128")


def cmd_profile(args) -> int:
    check_seconds(args, "case_timeout")
    isolation = isolation_of(args, start=args.tool == "torch" or args.tool is None)
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    cases, suite = build_cases(args, device)
    impls = resolve_impls(args.impl, device, case_ops(cases))
    from ...profiles import capture

    tool = args.tool or ("nsys" if device.type == "cuda" and capture.nsys_path() else "torch")
    if tool == "nsys" and (device.type != "cuda" or not capture.nsys_path()):
        raise UsageError("tool: nsys needs a CUDA device and `nsys` on the PATH; use --tool torch")
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("profile-%Y%m%d-%H%M%S")
    check_writable(out)
    if tool == "nsys":
        program = [sys.executable, "-m", "phasebench.bench.cli", "run", *case_argv(args),
                   "--out", str(out / "run"), "--cuda-profiler-range", *isolation.argv()]
        profile_path = capture.run_nsys(out / "profile", program)
    else:
        from ..sweep.console import Progress
        from ..sweep.runner import PROFILE_TIMER, RunConfig, run

        profile_path = out / "trace.json"
        run(RunConfig(cases, impls, device, out / "run", suite=suite, timer=PROFILE_TIMER, on_row=Progress(),
                      profiled=True, detect_contention=False, isolation=isolation,
                      capture=functools.partial(capture.torch_profiler_capture, profile_path, device.type == "cuda")))
    summary = capture.write_tables(profile_path, out)
    print(capture.format_summary(summary))
    print(f"\nprofile: {profile_path}; tables: {out}/kernels, ranges, summary (.parquet, .csv); rows: {out}/run")
    return 0


WARM_HELP = ("host: time each op with warm caches (default: the weights and the KV cache cold, read from memory "
             "as a forward pass streams them)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phasebench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"phasebench {package_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    listing = verbs.add_parser("list", help="suites, model presets, implementations here and their backends")
    listing.set_defaults(func=cmd_list)

    run = verbs.add_parser("run", help="measure cases x impls and write results (default: quick suite, best device)")
    add_case_arguments(run)
    run.add_argument("--out", help="results folder (default: a new ./results/<timestamp>/)")
    run.add_argument("--resume", action="store_true", help="skip the rows already in --out")
    run.add_argument("--retry-failed", action="store_true", help="with --resume: measure failed and skipped rows again")
    run.add_argument("--refresh-ceilings", action="store_true", help="re-measure the roofline ceilings")
    run.add_argument("--cuda-graph", action="store_true",
                     help="time CUDA-graph replays of each call (no host launch cost inside the events)")
    run.add_argument("--sample-time", type=float, metavar="S",
                     help="seconds of timed samples per case and impl (default 0.5 on CUDA, 0.3 on the host)")
    run.add_argument("--warm", action="store_true", help=WARM_HELP)
    add_isolation_arguments(run)
    run.add_argument("--retry-noisy", type=int, default=0, metavar="N",
                     help="after the sweep, measure the rows timed on a busy machine again, up to N times each; a "
                          "quiet row replaces its noisy one (default 0)")
    run.add_argument("--time-budget", type=float, metavar="S",
                     help="wall seconds for the whole command, start-up included: cases are taken spread over the "
                          "sweep, and the rows that would overrun are recorded as skipped (--resume --retry-failed "
                          "measures them later)")
    run.add_argument("--cuda-profiler-range", action="store_true",
                     help="wrap the cases in cudaProfilerStart/Stop (for nsys --capture-range=cudaProfilerApi)")
    run.add_argument("--shard", metavar="K/N", help="only shard K of N of the sweep (1-based), split by case")
    run.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                     help="shard the sweep over Ray workers, one per GPU, and merge (no ADDRESS: a local Ray)")
    run.add_argument("--workers", type=int, metavar="N",
                     help="with --ray: at most N workers (CPU workers where there are no GPUs)")
    run.set_defaults(func=cmd_run)

    merge = verbs.add_parser("merge", help="join the shard folders of one sweep into one result set")
    merge.add_argument("shards", nargs="+", metavar="DIR",
                       help="shard folders (`phasebench run --shard K/N --out DIR`)")
    merge.add_argument("--out", required=True, help="folder for the merged results")
    merge.add_argument("--partial", action="store_true", help="merge even with shards missing or unfinished")
    merge.set_defaults(func=cmd_merge)

    prof = verbs.add_parser("profile", help="profile cases with nsys (CUDA) or torch.profiler, tables per case")
    add_case_arguments(prof)
    prof.add_argument("--tool", choices=("nsys", "torch"),
                      help="nsys (default where CUDA and nsys exist) or torch (torch.profiler)")
    prof.add_argument("--out", help="profile folder (default: a new ./results/profile-<timestamp>/)")
    add_isolation_arguments(prof)
    prof.set_defaults(func=cmd_profile)

    report = verbs.add_parser("report", help="roofline and phase figures (PNG) and an HTML page from results")
    report.add_argument("results", nargs="*", help="run folders, results files, pytest-benchmark JSON, "
                                                   "`phasebench phases` and `phasebench interference` folders, in "
                                                   "any mix "
                                                   "(default: every folder under ./results/)")
    report.add_argument("--out", default="report", help="folder for the PNGs and report.html (default: ./report)")
    report.add_argument("--include-profiled", action="store_true",
                        help="keep rows measured under a profiler (`phasebench profile`); left out by default")
    report.add_argument("--compare", action="store_true",
                        help="compare the two result sets given even when they share no measurement (by default "
                             "two result sets get a comparison section only when they share one)")
    report.set_defaults(func=cmd_report)

    phases = verbs.add_parser("phases", help="TTFT, TPOT and tokens/s of a model composed from measured kernels, "
                                             "checked against a real forward pass")
    phases.add_argument("--model", default="llama-3-8b",
                        help="a preset or name=...,hidden=...,... (default llama-3-8b)")
    phases.add_argument("--prompt", nargs="+", type=int, metavar="P", help="prompt lengths (TTFT)")
    phases.add_argument("--batch", nargs="+", type=int, metavar="B", help="decode batches (TPOT, the batch sweep)")
    phases.add_argument("--context", type=int, help="tokens already in each decode sequence's cache")
    phases.add_argument("--chunk", nargs="+", type=int, metavar="C", help="chunked-prefill chunk sizes")
    phases.add_argument("--chunk-batch", type=int, help="decode batch running beside the chunked prompt")
    phases.add_argument("--reference-layers", type=int, help="layers of the real forward pass timed as a check")
    phases.add_argument("--reference-batch", nargs="+", type=int, metavar="B",
                        help="decode batches the real forward pass checks (default 1 and 8 on the host, 1 and 16 "
                             "on a GPU; the prefill check is the longest prompt)")
    phases.add_argument("--reference", nargs="+", choices=("phasebench", "transformers"), metavar="IMPL",
                        help="real forward passes to check the composition against: phasebench's decoder (always) "
                             "and transformers' LlamaForCausalLM with random weights where installed")
    phases.add_argument("--reference-rounds", type=int, metavar="N",
                        help="rounds of the check's ops, each between two timings of the real forward pass, so "
                             "that both sides see the same machine (default 5; 1 with --time-budget)")
    phases.add_argument("--impl", nargs="+", metavar="OP=IMPL", help="e.g. attention=triton linear=triton")
    phases.add_argument("--page-size", type=int, metavar="P",
                        help="decode and chunk attention read a paged KV cache, pages of P tokens (default 0: "
                             "contiguous); the prompt's own attention stays contiguous")
    phases.add_argument("--sample-time", type=float, metavar="S",
                        help="seconds of timed samples per op (default 0.5 on CUDA, 0.25 on the host)")
    phases.add_argument("--warm", action="store_true", help=WARM_HELP)
    phases.add_argument("--time-budget", type=float, metavar="S",
                        help="wall seconds for the whole command: the ops that would overrun are recorded skipped "
                             "(the scenarios that need them left blank), time kept for the reference and tables")
    add_isolation_arguments(phases)
    phases.add_argument("--retry-noisy", type=int, default=2, metavar="N",
                        help="measure the ops timed on a busy machine again at the end, up to N times each (default "
                             "2): the composition takes quiet rows only")
    phases.add_argument("--reuse", nargs="+", metavar="RESULTS", help="measured rows to reuse (measure the rest)")
    phases.add_argument("--interference", nargs="+", metavar="DIR",
                        help="`phasebench interference` folders: their measured stretches (of this device and the "
                             "model's layer count; the table says why others are not used) replace the co-located "
                             "estimate and give the protected one")
    phases.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    phases.add_argument("--dtype", help="float32, float16 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    phases.add_argument("--plugin", action="append", metavar="MODULE", help="import MODULE first (its kernels)")
    phases.add_argument("--out", help="folder (default: a new ./results/phases-<timestamp>/)")
    phases.set_defaults(func=cmd_phases)

    comp = verbs.add_parser("compare", help="pair the same measurements of two result sets: ratio of medians with "
                                            "a confidence interval, faster / slower / within noise")
    comp.add_argument("base", help="base results: a run folder, results file or pytest-benchmark JSON")
    comp.add_argument("new", nargs="?", help="new results (with --by impl, default: BASE again)")
    comp.add_argument("--by", choices=("run", "impl", "device", "timer"), default="run",
                      help="what differs between the sides (default run: the same cases measured twice)")
    comp.add_argument("--base-impl", metavar="I", help="with --by impl: the base implementation")
    comp.add_argument("--new-impl", metavar="J", help="with --by impl: the implementation compared against it")
    comp.add_argument("--threshold", default="5%", help="smallest change called faster or slower (default 5%%)")
    comp.add_argument("--confidence", type=float, default=0.95, help="of the intervals (default 0.95)")
    comp.add_argument("--fail-on-regression", action="store_true",
                      help="exit 1 when a pair is slower beyond the threshold with confidence, a row that was ok is "
                           "not (incorrect, failed, skipped), or an ok row of BASE is missing from NEW (for CI)")
    comp.add_argument("--allow-missing", action="store_true",
                      help="with --fail-on-regression: rows missing from NEW do not fail it")
    comp.add_argument("--out", help="folder for comparison.csv, comparison.png and a report.html")
    comp.set_defaults(func=cmd_compare)

    ceil = verbs.add_parser("ceilings", help="measured bandwidth and matmul peaks (cached per machine)")
    ceil.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    ceil.add_argument("--dtype", nargs="+", help="matmul dtypes (default: float32 on CPU; all three on CUDA)")
    ceil.add_argument("--json", action="store_true", help="print one JSON object")
    ceil.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    ceil.set_defaults(func=cmd_ceilings)
    add_interference_verb(verbs)
    add_session_verbs(verbs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except UsageError as err:
        print(f"phasebench {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"phasebench {args.verb}: interrupted; rows written so far are kept", file=sys.stderr)
        return 130

