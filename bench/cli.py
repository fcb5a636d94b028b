"""The `phasebench` command line: one verb per job, each importing its module only when it runs."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .selection import (
    UsageError,
    build_cases,
    case_ops,
    default_dtype,
    load_plugins,
    resolve_device,
    resolve_impls,
)


def package_version() -> str:
    try:
        return version("phasebench")
    except PackageNotFoundError:
        return "unknown"






def cmd_list(args) -> int:
    import torch

    from ..kernels import OPS, describe_impls
    from .models import MODELS
    from .suites import SUITES, suite_cases

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






def out_dir_for(args) -> Path:
    if args.out:
        return Path(args.out)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / stamp


def check_writable(path: Path) -> None:
    """Fail before measuring anything when the results cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".phasebench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"out: cannot write to {path}: {err.strerror or err}") from None


def cmd_run(args) -> int:
    load_plugins(args.plugin)
    if args.ray is not None or args.workers is not None:
        return cmd_run_ray(args)
    device = resolve_device(args.device)
    cases, suite = build_cases(args, device)
    impls = resolve_impls(args.impl, device, case_ops(cases))
    out = out_dir_for(args)
    if args.resume and not args.out:
        raise UsageError("resume: needs --out DIR of the run to resume")
    if args.retry_failed and not args.resume:
        raise UsageError("retry-failed: goes with --resume --out DIR")
    check_writable(out)

    from .console import Progress, closing_lines, format_table
    from .results import ResumeError
    from .runner import RunConfig, run

    print(f"phasebench run: {len(cases)} cases x {len(impls)} impls on {device} -> {out}", file=sys.stderr)
    capture = None
    if args.cuda_profiler_range:
        if device.type != "cuda":
            raise UsageError("cuda-profiler-range: needs a CUDA device")
        from ..profiles.capture import cuda_profiler_range as capture
    timer = None
    if args.cuda_graph:
        if device.type != "cuda":
            raise UsageError("cuda-graph: needs a CUDA device")
        from .runner import CUDA_TIMER
        timer = dataclasses.replace(CUDA_TIMER, cuda_graph=True)
    cases, shard = shard_of_run(args, cases, impls, device, timer, out, suite)
    try:
        df = run(RunConfig(cases, impls, device, out, suite=suite, resume=args.resume, retry_failed=args.retry_failed,
                           timer=timer, refresh_ceilings=args.refresh_ceilings, on_row=Progress(), capture=capture,
                           profiled=args.cuda_profiler_range))
    except ResumeError as err:
        raise UsageError(str(err)) from None
    if shard is not None:
        from .shards import finish_shard

        finish_shard(out, shard)
    print(format_table(df))
    for line in closing_lines(df, out):
        print(line)
    return 0


def run_command(args) -> str:
    """This `phasebench run`'s selection as a command line, for the resume hints of shards."""
    import shlex

    return shlex.join(["phasebench", "run", *case_argv(args), *(["--cuda-graph"] if args.cuda_graph else [])])


def shard_of_run(args, cases, impls, device, timer, out: Path, suite: str):
    """--shard K/N: the shard's cases, its folder marked with its sweep (shard.json); all cases and None without."""
    from .runner import CPU_TIMER, CUDA_TIMER, measurement_options
    from .shards import SHARD_JSON, ShardError, mark_shard, parse_shard, plan_shard

    if not args.shard:
        if args.resume and (out / SHARD_JSON).is_file():
            raise UsageError(f"resume: {out} is a shard folder; give its --shard K/N as well (see {out / SHARD_JSON})")
        return cases, None
    try:
        k, n = parse_shard(args.shard)
        options = measurement_options(device, timer or (CUDA_TIMER if device.type == "cuda" else CPU_TIMER),
                                      args.cuda_profiler_range)
        resume = f"{run_command(args)} --shard {k}/{n} --resume --out {out}"
        mine, info = plan_shard(cases, impls, k, n, options, suite, resume)
        mark_shard(out, info, args.resume)
    except ShardError as err:
        raise UsageError(str(err)) from None
    print(f"phasebench run: shard {k}/{n} of sweep {info.sweep_id}: {len(mine)} of {len(cases)} cases, "
          f"{info.rows} of {info.sweep_rows} rows", file=sys.stderr)
    return mine, info


def cmd_run_ray(args) -> int:
    """--ray [ADDRESS]: the sweep sharded over Ray actors (one per GPU, or --workers N on CPUs), then merged."""
    import importlib.util

    if args.ray is None:
        raise UsageError("workers: goes with --ray")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"workers: must be at least 1, got {args.workers}")
    if args.shard:
        raise UsageError("shard: --ray runs every shard; resume one alone with --shard K/N --resume, without --ray")
    if args.cuda_profiler_range:
        raise UsageError("cuda-profiler-range: not with --ray; profile one shard with --shard K/N")
    if args.resume and not args.out:
        raise UsageError("resume: needs --out DIR of the run to resume")
    if args.retry_failed and not args.resume:
        raise UsageError("retry-failed: goes with --resume --out DIR")
    if importlib.util.find_spec("ray") is None:
        raise UsageError("ray: not installed here; pip install 'phasebench[cluster]'")
    out = out_dir_for(args).resolve()
    check_writable(out)
    from .ray_runner import RaySweep, Selection, run_sweep

    return run_sweep(RaySweep(Selection.from_args(args), out, address=args.ray or None, workers=args.workers,
                              resume=args.resume, retry_failed=args.retry_failed,
                              refresh_ceilings=args.refresh_ceilings, command=run_command(args)))


def cmd_merge(args) -> int:
    from .shards import ShardError, merge

    out = Path(args.out)
    check_writable(out)
    try:
        merged = merge(args.shards, out, partial=args.partial)
    except ShardError as err:
        raise UsageError(str(err)) from None
    sweep = merged["sweep"]
    rows = sum(s["rows"] for s in merged["shards"])
    print(f"merged {len(merged['shards'])} of {sweep['of']} shard(s) of sweep {sweep['id']}, {rows} of "
          f"{sweep['rows']} rows, into {out}")
    if sweep["missing"]:
        missing = ", ".join(f"{k}/{sweep['of']}" for k in sweep["missing"])
        print(f"warning: shard(s) {missing} missing", file=sys.stderr)
    return 0


def parse_op_impls(items) -> dict[str, str]:
    """`attention=triton linear=torch` as a dict; one-line UsageError otherwise."""
    from ..kernels import OPS

    out = {}
    for item in items or ():
        op, sep, impl = item.partition("=")
        if not sep or op not in OPS or impl not in OPS[op]:
            raise UsageError(f"impl: expected OP=IMPL with OP in {', '.join(OPS)} and one of its impls, got {item!r}")
        out[op] = impl
    return out


def cmd_phases(args) -> int:
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    from .models import model_config

    try:
        model = model_config(args.model)
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("phases-%Y%m%d-%H%M%S")
    check_writable(out)
    from ..analysis import phase_model as pm
    from .console import Progress
    from .phases import PhasesConfig, run_phases

    impls = {**pm.DEFAULT_IMPLS, **parse_op_impls(args.impl)}
    cfg = PhasesConfig.defaults(model, device, out, prompts=tuple(args.prompt) if args.prompt else None,
                                batches=tuple(args.batch) if args.batch else None, context=args.context,
                                chunks=tuple(args.chunk) if args.chunk else None, chunk_batch=args.chunk_batch,
                                reference_layers=args.reference_layers, dtype=args.dtype)
    cfg.impls, cfg.on_row = impls, Progress()
    reuse = None
    if args.reuse:
        from ..analysis import load

        try:
            reuse = load(*args.reuse)
        except (ValueError, FileNotFoundError) as err:
            raise UsageError(str(err).splitlines()[0]) from None
    print(f"phasebench phases: {model.name} on {device} ({cfg.dtype}) -> {out}", file=sys.stderr)
    tables = run_phases(cfg, reuse)
    from ..analysis.phases import phases_summary, write_phase_figures

    print(phases_summary(tables))
    figures = write_phase_figures(tables, out)
    print(f"\ntables: {out}/*.csv, phases.json; rows: {out}/ops; figures: {', '.join(p.name for p in figures)}")
    return 0


def cmd_ceilings(args) -> int:
    from .cases import DTYPES
    from .conditions import describe
    from .roofline import ceilings

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
        print(f"  matmul {d:<9} {tf:10.3f} TFLOP/s measured{ds}   ridge {ceil.ridge(d):.1f} FLOP/B")
    for warning in ceil.warnings:
        print(f"  warning: {warning}")
    return 0


def add_case_arguments(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--suite", default="quick",
                      help="quick (default), prefill, chunked, decode, verify, ragged, decode-linear, "
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


def case_argv(args) -> list[str]:
    """The case-selection arguments again, for a `phasebench run` started under nsys."""
    argv = ["--suite", args.suite]
    for flag in ("impl", "model", "op"):
        if getattr(args, flag):
            argv += [f"--{flag}", *getattr(args, flag)]
    for flag in ("device", "dtype"):
        if getattr(args, flag):
            argv += [f"--{flag}", getattr(args, flag)]
    for shape in args.shape or ():
        argv += ["--shape", shape]
    for plugin in args.plugin or ():
        argv += ["--plugin", plugin]
    return argv


def cmd_profile(args) -> int:
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    cases, suite = build_cases(args, device)
    impls = resolve_impls(args.impl, device, case_ops(cases))
    from ..profiles import capture

    tool = args.tool or ("nsys" if device.type == "cuda" and capture.nsys_path() else "torch")
    if tool == "nsys" and (device.type != "cuda" or not capture.nsys_path()):
        raise UsageError("tool: nsys needs a CUDA device and `nsys` on the PATH; use --tool torch")
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("profile-%Y%m%d-%H%M%S")
    check_writable(out)
    if tool == "nsys":
        program = [sys.executable, "-m", "phasebench.bench.cli", "run", *case_argv(args),
                   "--out", str(out / "run"), "--cuda-profiler-range"]
        profile_path = capture.run_nsys(out / "profile", program)
    else:
        from .console import Progress
        from .runner import PROFILE_TIMER, RunConfig, run

        profile_path = out / "trace.json"
        run(RunConfig(cases, impls, device, out / "run", suite=suite, timer=PROFILE_TIMER, on_row=Progress(),
                      profiled=True, detect_contention=False,
                      capture=lambda: capture.torch_profiler_capture(profile_path, device.type == "cuda")))
    summary = capture.write_tables(profile_path, out)
    print(capture.format_summary(summary))
    print(f"\nprofile: {profile_path}; tables: {out}/kernels, ranges, summary (.parquet, .csv); rows: {out}/run")
    return 0


def cmd_report(args) -> int:
    from ..analysis import load, load_phases, report_rows, write_report
    from ..analysis.report import summary_table

    sources = args.results or sorted(p for p in Path("results").glob("*") if p.is_dir())
    if not sources:
        raise UsageError("results: none given and no ./results/ folders; run `phasebench run` first")
    try:
        df = load(*sources)
        # a `phasebench phases` folder: its rows (under ops/) load as above, its tables make the Phases section
        phase_dirs = [Path(p) for p in sources if (Path(p) / "phases.json").is_file()]
        phases = load_phases(phase_dirs[-1]) if phase_dirs else None
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    comparison = None
    runs = [p for p in (args.results or []) if not (Path(p) / "phases.json").is_file()]
    if len(runs) == 2:  # two result sets: the report compares them as `phasebench compare` does
        from ..analysis.compare import compare

        try:
            comparison = compare(runs[0], runs[1])
        except ValueError as err:
            print(f"phasebench report: no comparison: {str(err).splitlines()[0]}", file=sys.stderr)
    out = Path(args.out)
    check_writable(out)
    paths = write_report(df, out, include_profiled=args.include_profiled, phases=phases, comparison=comparison)
    shown = report_rows(df, include_profiled=args.include_profiled)
    print(summary_table(shown).to_string())
    left_out = f" ({len(df) - len(shown)} profiled rows left out)" if len(shown) < len(df) else ""
    if phase_dirs:
        others = f"; {len(phase_dirs) - 1} other phases folder(s) not shown" if len(phase_dirs) > 1 else ""
        print(f"\nphases: {phase_dirs[-1]}{others}")
    print(f"\n{len(shown)} rows from {shown['run_id'].nunique()} run(s){left_out}; report: {paths['html']}")
    return 0


def cmd_compare(args) -> int:
    from ..analysis import load
    from ..analysis.compare import compare, format_comparison, parse_threshold, regressions

    try:
        threshold = parse_threshold(args.threshold)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.new is None and args.by != "impl":
        raise UsageError(f"new: --by {args.by} compares two result sets; give BASE and NEW (or use --by impl)")
    try:
        base = load(args.base)
        new = load(args.new) if args.new else None
        frame = compare(base, new, by=args.by, base_impl=args.base_impl, new_impl=args.new_impl,
                        threshold=threshold, confidence=args.confidence)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    print(format_comparison(frame))
    if args.out:
        from ..analysis import write_report

        out = Path(args.out)
        check_writable(out)
        both = load(args.base, args.new) if args.new else base
        paths = write_report(both, out, title="phasebench comparison", comparison=frame)
        print(f"\ncomparison: {paths['comparison_csv']}, {paths['comparison']}; report: {paths['html']}")
    slower = regressions(frame)
    if args.fail_on_regression and len(slower):
        noisy = int(slower["noisy"].sum())
        print(f"phasebench compare: {len(slower)} pair(s) slower by more than {threshold:.0%} "
              f"with {args.confidence:.0%} confidence" + (f" ({noisy} noisy: timed on a contended device, "
                                                           "re-run before believing them)" if noisy else ""),
              file=sys.stderr)
        return 1
    return 0


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
    prof.set_defaults(func=cmd_profile)

    report = verbs.add_parser("report", help="roofline and phase figures (PNG) and an HTML page from results")
    report.add_argument("results", nargs="*", help="run folders, results files or pytest-benchmark JSON; a "
                                                   "`phasebench phases` folder adds a Phases section "
                                                   "(default: every folder under ./results/)")
    report.add_argument("--out", default="report", help="folder for the PNGs and report.html (default: ./report)")
    report.add_argument("--include-profiled", action="store_true",
                        help="keep rows measured under a profiler (`phasebench profile`); left out by default")
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
    phases.add_argument("--reference-layers", type=int, help="layers of the plain-PyTorch decoder timed as a check")
    phases.add_argument("--impl", nargs="+", metavar="OP=IMPL", help="e.g. attention=triton linear=triton")
    phases.add_argument("--reuse", nargs="+", metavar="RESULTS", help="measured rows to reuse (measure the rest)")
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
                      help="exit 1 when a pair is slower beyond the threshold with confidence (for CI)")
    comp.add_argument("--out", help="folder for comparison.csv, comparison.png and a report.html")
    comp.set_defaults(func=cmd_compare)

    ceil = verbs.add_parser("ceilings", help="measured bandwidth and matmul peaks (cached per machine)")
    ceil.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    ceil.add_argument("--dtype", nargs="+", help="matmul dtypes (default: float32 on CPU; all three on CUDA)")
    ceil.add_argument("--json", action="store_true", help="print one JSON object")
    ceil.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    ceil.set_defaults(func=cmd_ceilings)
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


if __name__ == "__main__":
    sys.exit(main())
