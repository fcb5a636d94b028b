"""The verbs of a GPU session: `env` (what the machine is), `selfcheck` (everything to measure, in one budgeted
command) and `wheels` (what to carry to a machine without a package index)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..sweep.selection import UsageError, resolve_device
from .options import check_seconds, check_writable


def cmd_env(args) -> int:
    from ..sweep.metadata import environment, format_environment

    env = environment(resolve_device(args.device))
    if args.json:
        text = json.dumps(env, indent=1, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    print("\n".join(format_environment(env)), file=sys.stderr if args.json == "-" else sys.stdout)
    return 0


def cmd_selfcheck(args) -> int:
    import tempfile

    import torch

    from ..session.selfcheck import (
        MAX_FILES,
        OURS,
        choose_plan,
        default_tests_dir,
        format_summary,
        others_in,
        run_selfcheck,
    )
    from ..session.selfcheck_plan import STEPS

    check_seconds(args, "budget")
    unknown = sorted(set(args.steps or ()) - set(STEPS))
    if unknown:
        raise UsageError(f"steps: unknown step(s) {', '.join(unknown)}, choose from {', '.join(STEPS)}")
    cuda = torch.cuda.is_available()
    try:
        plan = choose_plan(cuda, args.dry_run, args.budget)
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out)
    check_writable(out)
    ours = [p.name for p in out.iterdir() if p.name in OURS]
    if ours:
        raise UsageError(f"out: {out} holds a self-check's files already ({', '.join(sorted(ours))}); use another "
                         f"folder")
    others = others_in(out)
    if len(others) > MAX_FILES - 3:
        raise UsageError(f"out: {out} holds {len(others)} other files; the self-check needs 3 of the {MAX_FILES} "
                         f"files a device call brings back")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="phasebench-selfcheck-"))
    tests_dir = Path(args.tests) if args.tests else default_tests_dir()
    if plan.device == "cuda":
        why = f"{torch.cuda.get_device_name(0)} found by torch {torch.__version__}"
    else:
        why = "--dry-run asked for" if args.dry_run else f"torch {torch.__version__} sees no CUDA device"
    print(f"plan: {'gpu' if plan.device == 'cuda' else 'cpu dry run'} ({why}); {plan.name} in {plan.total_s:.0f} s; "
          f"{out} (files), {work} (all results)" + (f"; {len(others)} file(s) there already count toward the "
                                                    f"{MAX_FILES}" if others else ""), flush=True)
    summary = run_selfcheck(out, plan, work=work, tests_dir=tests_dir, steps=tuple(args.steps or STEPS),
                            echo=sys.stdout if args.verbose else None)
    print("\n".join(format_summary(summary, out)))
    # a step cut short by its budget kept what it measured and said so; only a failure sets the exit status
    return 1 if any(s["status"] == "failed" for s in summary["steps"]) else 0


def cmd_wheels(args) -> int:
    from ..session.wheels import TARGET_MISSING, make_wheels

    out = Path(args.out)
    check_writable(out)
    try:
        wheels, how = make_wheels(out, tuple(args.package) if args.package is not None else TARGET_MISSING,
                                  args.python_version, download=not args.no_download)
    except (ValueError, RuntimeError) as err:
        raise UsageError(str(err).removeprefix("wheels: ")) from None
    print(f"phasebench's wheel built {how}")
    for wheel in wheels:
        print(f"  {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)")
    print(f"commit {(out / 'COMMIT').read_text().strip()}; on the machine, from the repository root:\n"
          f"  python3 -m pip install -q --no-index --no-deps --target /tmp/site {out}/*.whl && "
          f"export PYTHONPATH=/tmp/site PHASEBENCH_GIT_COMMIT=$(cat {out}/COMMIT)\n"
          f"  python3 -m phasebench.bench.cli selfcheck --out $OUT")
    return 0


def add_session_verbs(verbs) -> None:
    from ..session.selfcheck_plan import GPU, HOST  # plain data, no torch

    check = verbs.add_parser("selfcheck", help="everything a GPU session should measure, in one budgeted command "
                                               "writing at most 8 files (a dry run at host sizes without CUDA)")
    check.add_argument("--out", required=True, help="folder for the (at most 8) files: summary, log, report, tests, "
                                                    "an archive of every result")
    check.add_argument("--dry-run", action="store_true", help="host sizes on the CPU, even where CUDA is")
    check.add_argument("--budget", type=float, metavar="S",
                       help=f"total seconds (default {GPU.total_s:g} on a GPU, {HOST.total_s:g} for the dry run); "
                            "every step scaled alike")
    check.add_argument("--steps", nargs="+", metavar="STEP",
                       help="only these steps (env tests ceilings suites interference phases profile ncu report), e.g. "
                            "to rerun what failed")
    check.add_argument("--tests", metavar="DIR", help="the tests folder (default: ./tests of a checkout)")
    check.add_argument("--work", metavar="DIR", help="where the steps write (default: a new temporary folder)")
    check.add_argument("--verbose", action="store_true", help="echo every step's output (always in the log)")
    check.set_defaults(func=cmd_selfcheck)

    env = verbs.add_parser("env", help="the environment: GPU, driver, clocks, versions, flash-attn, profilers")
    env.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    env.add_argument("--json", metavar="FILE", help="also write it all as JSON (- for stdout)")
    env.set_defaults(func=cmd_env)

    wheels = verbs.add_parser("wheels", help="phasebench's wheel and those of the packages a GPU image lacks, to "
                                             "carry to a machine without a package index")
    wheels.add_argument("--out", required=True, help="folder for the wheels and a COMMIT file (e.g. .whl)")
    wheels.add_argument("--package", nargs="*", metavar="NAME[==V]",
                        help="packages to download besides phasebench (default: nvtx, at the version installed "
                             "here); none with an empty list")
    wheels.add_argument("--python-version", default="3.12", help="the target's Python (default 3.12)")
    wheels.add_argument("--no-download", action="store_true", help="only build phasebench's own wheel")
    wheels.set_defaults(func=cmd_wheels)
