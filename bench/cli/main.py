"""The `phasebench` command line: one verb per job, each importing its module only when it runs."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import sys
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..spec.store.files import FolderWarning, WriteError
from ..spec.store.folder_lock import FolderBusy, holding
from ..sweep.selection import (
    UsageError,
    build_cases,
    case_ops,
    default_dtype,
    load_plugins,
    resolve_device,
    resolve_impls,
)
from . import STARTED
from .interference_verb import add_interference_verb
from .options import (
    DEFAULT_ROUNDS,
    WARM_HELP,
    add_case_arguments,
    add_isolation_arguments,
    add_sampling_arguments,
    check_counts,
    check_seconds,
    check_writable,
    ci_target_of,
    isolation_of,
    out_dir_for,
    rounds_of,
    selection_of,
)
from .phases_verb import add_phases_verb
from .results import add_compare_verb, add_report_verb
from .session import add_session_verbs
from .sweeps import add_merge_verb, cmd_run_ray, shard_of_run


def package_version() -> str:
    try:
        return version("phasebench")
    except PackageNotFoundError:
        return "unknown"


def described(m) -> str:
    """What a preset's line adds to its dims: its mixture, its attention kind and the format it is served in."""
    from ..spec.quant import served_format

    out = ""
    if m.is_moe:
        out += f" ({m.experts} experts of that intermediate, top {m.top_k}" + (
            f", shared {m.shared_intermediate}" if m.shared_intermediate else "") + (
            f", the first {m.dense_layers} layers dense of {m.dense_intermediate}" if m.dense_layers else "") + ")"
    if m.attention == "mla":
        out += (f"; MLA: {m.q_heads} heads of {m.qk_head_dim} (value {m.head_dim}) over a {m.latent_dim}-wide latent"
                + (f", q_lora {m.q_lora_rank}" if m.q_lora_rank else ""))
    elif m.attention == "window":
        out += f"; window_left {m.window_left} on every other layer"
    out += ", sinks" if m.sinks else ""
    served = served_format(m.name)
    return out + (f"; served: {served.label}" if served.projections or served.experts else "")


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
        print(f"  {name:<16} {m.hidden}/{m.intermediate}/{m.layers}/{m.q_heads}/{m.kv_heads}/{m.head_dim}/{m.vocab}"
              f"{described(m)}")
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
    args.rounds = rounds_of(args)
    ci_target = ci_target_of(args)
    from ...kernels.inductor import fresh_cache_dir

    fresh_cache_dir()  # before any worker starts: they inherit it (Ray's workers say in run.json whose they used)
    if args.ray is not None or args.workers is not None:
        load_plugins(args.plugin)
        if args.time_budget is not None or args.sample_time is not None or args.ci_target is not None:
            raise UsageError("time-budget, sample-time, ci-target: not with --ray (each shard times by its own rule)")
        return cmd_run_ray(args)
    isolation = isolation_of(args, start=True)
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    cases, suite = build_cases(selection_of(args), device)
    impls = resolve_impls(args.impl, device, case_ops(cases), compiled=suite != "quick")
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

    timer = default_timer(device, cuda_graph=args.cuda_graph, sample_time=args.sample_time, warm=args.warm,
                          ci_target=ci_target)
    with holding(out):  # one writer per folder, from before shard.json or a row is written
        cases, shard = shard_of_run(args, cases, impls, device, timer, out, suite)
        try:
            df = run(RunConfig(cases, impls, device, out, suite=suite, resume=args.resume,
                               retry_failed=args.retry_failed, timer=timer, refresh_ceilings=args.refresh_ceilings,
                               on_row=Progress(), capture=capture, profiled=args.cuda_profiler_range,
                               time_budget_s=args.time_budget, started=STARTED, isolation=isolation,
                               retry_noisy=args.retry_noisy, rounds=args.rounds, combine_rounds=True))
        except ResumeError as err:
            raise UsageError(str(err)) from None
        if shard is not None:
            from ..sweep.spread.shards import finish_shard

            finish_shard(out, shard)
    print(format_table(df))
    for line in closing_lines(df, out):
        print(line)
    return 0


STREAM_WORDS = {"read": "read-only: the fastest of dot, sum and a GEMV, the roof of decode and GEMV",
                "write": "write-only: a fill",
                "copy": "copy: bytes read + written (peak_gbps, the one figure before schema 5)"}


def cmd_ceilings(args) -> int:
    from ..instruments.ceiling_measures import CEILING_STATISTIC
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
    for stream, what in STREAM_WORDS.items():
        gbps = {"read": ceil.read_gbps, "write": ceil.write_gbps, "copy": ceil.copy_gbps}[stream]
        ds = f"   {sheet.peak_gbps:10.1f} GB/s datasheet ({sheet.name})" if sheet and stream == "read" else ""
        print(f"  {stream + ' bandwidth':<16} {gbps:10.1f} GB/s measured{ds}   {what}")
        measured = ceil.bandwidth.get(stream)
        if measured:
            kernels = ", ".join(f"{k} {v:.4g}" for k, v in measured.get("kernels", {}).items())
            print(f"      {kernels} GB/s on 2 buffers of {measured.get('buffer_bytes', 0) / 2**20:.0f} MiB; at "
                  f"{measured.get('measured_at')}, took {measured.get('duration_s', 0):.1f} s; "
                  f"{describe(measured.get('conditions') or {})}")
    for d, tf in ceil.peak_tflops.items():
        ds = f"   {sheet.peak_tflops[d]:10.1f} TFLOP/s datasheet" if sheet and d in sheet.peak_tflops else ""
        size = f" at {ceil.matmul_n[d]}^3" if d in ceil.matmul_n else ""
        print(f"  matmul {d:<9} {tf:10.4g} TFLOP/s measured{size}{ds}   ridge {ceil.ridge(d):.3g} FLOP/B (read)")
    for level, found in ceil.levels.items():
        print(f"  resident in the {level.upper()} ({found['bytes'] / 2**20:g} MiB): read {found['read_gbps']:.1f}, "
              f"write {found['write_gbps']:.1f}, copy {found['copy_gbps']:.1f} GB/s (the roof of a warm row that fits)")
        calls = [(s, b) for s, b in (found.get("bandwidth") or {}).items() if "passes" in b]
        if calls:
            print("      a call: " + ", ".join(f"{s} {b['passes']} passes of {b['buffer_bytes'] / 2**10:.0f} KiB "
                                               f"(dispatch {b['overhead_pct']:.2g}% of it)" for s, b in calls))
    print(f"  caches: {ceil.caches.get('source', '')}; every ceiling the {CEILING_STATISTIC}")
    print("  a row's roof: min(matmul peak, FLOPs / (read bytes / read GB/s + write bytes / write GB/s))")
    for warning in ceil.warnings:
        print(f"  warning: {warning}")
    return 0


def cmd_profile(args) -> int:
    check_seconds(args, "case_timeout")
    isolation = isolation_of(args, start=args.tool == "torch" or args.tool is None)
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    cases, suite = build_cases(selection_of(args), device)
    impls = resolve_impls(args.impl, device, case_ops(cases), compiled=suite != "quick")
    from ...profiles import capture

    tool = args.tool or ("nsys" if device.type == "cuda" and capture.nsys_path() else "torch")
    if tool == "nsys" and (device.type != "cuda" or not capture.nsys_path()):
        raise UsageError("tool: nsys needs a CUDA device and `nsys` on the PATH; use --tool torch")
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("profile-%Y%m%d-%H%M%S")
    check_writable(out)
    if tool == "nsys":
        program = [sys.executable, "-m", "phasebench.bench.cli", "run", *selection_of(args).argv(),
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
    add_sampling_arguments(run, "default 0.5 s on CUDA, 0.3 s on the host")
    run.add_argument("--warm", action="store_true", help=WARM_HELP)
    add_isolation_arguments(run)
    run.add_argument("--rounds", type=int, metavar="N",
                     help="measure the sweep N times, each round after the first in a fresh worker process and a "
                          "shuffled order after a probe of the ceilings; each row's figure and interval come from its "
                          f"rounds, with the interval a repeat of the run lands in (default {DEFAULT_ROUNDS}, env "
                          "PHASEBENCH_ROUNDS; 1, and with --no-isolate: no between-run interval)")
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

    add_merge_verb(verbs)

    prof = verbs.add_parser("profile", help="profile cases with nsys (CUDA) or torch.profiler, tables per case")
    add_case_arguments(prof)
    prof.add_argument("--tool", choices=("nsys", "torch"),
                      help="nsys (default where CUDA and nsys exist) or torch (torch.profiler)")
    prof.add_argument("--out", help="profile folder (default: a new ./results/profile-<timestamp>/)")
    add_isolation_arguments(prof)
    prof.set_defaults(func=cmd_profile)

    add_report_verb(verbs)
    add_phases_verb(verbs)
    add_compare_verb(verbs)

    ceil = verbs.add_parser("ceilings", help="measured bandwidth and matmul peaks (cached per machine)")
    ceil.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    ceil.add_argument("--dtype", nargs="+", help="matmul dtypes (default: float32 on CPU; all three on CUDA)")
    ceil.add_argument("--json", action="store_true", help="print one JSON object")
    ceil.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    ceil.set_defaults(func=cmd_ceilings)
    add_interference_verb(verbs)
    add_session_verbs(verbs)
    return parser


def _kept(args) -> str:
    """What a run stopped by a write that failed keeps, and how to go on."""
    if args.verb != "run" or not getattr(args, "out", None):
        return ""
    return (f"; the rows written before it are kept in {args.out}, and `--resume --out {args.out}` (with the same "
            "options) goes on once the folder can be written again")


def _show_warning(verb, default, message, category, *rest, **kw):
    """A reader's note about a folder (a torn row left out, results.csv read for a torn results.parquet) in one
    line; other warnings as Python shows them."""
    if issubclass(category, FolderWarning):
        print(f"phasebench {verb}: note: {message}", file=sys.stderr)
    else:
        default(message, category, *rest, **kw)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = functools.partial(_show_warning, args.verb, warnings.showwarning)
            return args.func(args)
    except (UsageError, FolderBusy) as err:
        print(f"phasebench {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except WriteError as err:  # a full disk or a read-only folder, mid-run: what was written before stays
        print(f"phasebench {args.verb}: error: {err}{_kept(args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"phasebench {args.verb}: interrupted; rows written so far are kept", file=sys.stderr)
        return 130

