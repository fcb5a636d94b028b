"""The sweep verbs beyond one process: `run --shard K/N`, `run --ray`, and `merge`."""

from __future__ import annotations

import sys
from pathlib import Path

from ..sweep.selection import UsageError
from .options import DEFAULT_ROUNDS, check_writable, isolation_of, out_dir_for, selection_of


def run_command(args) -> str:
    """This `phasebench run`'s selection and the options its measurement depends on (what --resume checks: the timer's
    sample time, interval target, warm operands, CUDA graphs) as a command line, for the resume hints of shards."""
    import shlex

    timer = [*(["--sample-time", str(args.sample_time)] if args.sample_time is not None else []),
             *(["--ci-target", str(args.ci_target)] if args.ci_target is not None else []),
             *(["--warm"] if args.warm else []), *(["--cuda-graph"] if args.cuda_graph else []),
             *(["--rounds", str(args.rounds)] if args.rounds not in (None, DEFAULT_ROUNDS) else [])]
    return shlex.join(["phasebench", "run", *selection_of(args).argv(), *timer])


def shard_of_run(args, cases, impls, device, timer, out: Path, suite: str):
    """--shard K/N: the shard's cases, its folder marked with its sweep (shard.json); all cases and None without."""
    from ..sweep.runner import default_timer, measurement_options
    from ..sweep.spread.shards import SHARD_JSON, ShardError, mark_shard, parse_shard, plan_shard

    if not args.shard:
        if args.resume and (out / SHARD_JSON).is_file():
            raise UsageError(f"resume: {out} is a shard folder; give its --shard K/N as well (see {out / SHARD_JSON})")
        return cases, None
    try:
        k, n = parse_shard(args.shard)
        options = measurement_options(device, timer or default_timer(device),
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
    from ..sweep.spread.ray_runner import RaySweep, probe_head, run_sweep

    probe_head(args.ray)  # before anything is written
    out = out_dir_for(args).resolve()
    check_writable(out)

    return run_sweep(RaySweep(selection_of(args).portable(), out, address=args.ray or None, workers=args.workers,
                              cuda_graph=args.cuda_graph, resume=args.resume, retry_failed=args.retry_failed,
                              refresh_ceilings=args.refresh_ceilings, command=run_command(args),
                              isolation=isolation_of(args), rounds=args.rounds))


def cmd_merge(args) -> int:
    from ..sweep.spread.shards import ShardError, merge

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


def add_merge_verb(verbs) -> None:
    """The `merge` verb and its options."""
    merge = verbs.add_parser("merge", help="join the shard folders of one sweep into one result set")
    merge.add_argument("shards", nargs="+", metavar="DIR",
                       help="shard folders (`phasebench run --shard K/N --out DIR`)")
    merge.add_argument("--out", required=True, help="folder for the merged results")
    merge.add_argument("--partial", action="store_true", help="merge even with shards missing or unfinished")
    merge.set_defaults(func=cmd_merge)
