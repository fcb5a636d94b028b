"""The options several verbs share (the case selection, isolation, --warm) and what the CLI makes of them: the
typed Selection and Isolation the rest of bench takes, the checks of seconds and counts, the output folder."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

from ..sweep.selection import Selection, UsageError

# `phasebench run` measures its sweep this many rounds, each in a fresh worker process (bench.sweep.rounds): the rows
# then carry the interval a repeat of the run lands in, which an A/A test holds them to (docs/measuring.md)
DEFAULT_ROUNDS = 3
WARM_HELP = ("host: time each op with warm caches (default: the weights and the KV cache cold, read from memory "
             "as a forward pass streams them)")


def add_case_arguments(verb: argparse.ArgumentParser) -> None:
    """The case selection's options, for every verb that measures a suite's cases (run, profile)."""
    verb.add_argument("--suite", default="quick",
                      help="quick (default), prefill, chunked, decode, verify, ragged, paged, decode-linear, "
                           "decode-quant, prefill-linear, moe-decode, moe-prefill, fp8-kv-decode, full (all: "
                           "`phasebench list`)")
    verb.add_argument("--op", nargs="+", metavar="OP",
                      help="only cases of these operators: attention, linear, qlinear, elementwise, moe")
    verb.add_argument("--impl", nargs="+", metavar="I",
                      help="implementations (default: all available here); each case runs those its operator has")
    verb.add_argument("--model", nargs="+", metavar="M", help="model presets for the suite (or heads for --shape)")
    verb.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    verb.add_argument("--dtype", help="float32, float16 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    verb.add_argument("--plugin", action="append", metavar="MODULE",
                      help="import MODULE (or a .py file) first, so the kernels it registers can be named with --impl")
    verb.add_argument("--shape", action="append", metavar="K=V,...",
                      help="a case by hand, e.g. batch=1,q_heads=32,kv_heads=8,q_len=1,kv_len=65536,head_dim=128")
    verb.add_argument("--weights", metavar="SCHEME",
                      help="pack the routed experts of the suite's moe cases with SCHEME (int8, int4-g128, int4-g32, "
                           "fp8, mxfp4, nvfp4, fp8-b128); their rows carry it in `scheme` and read its packed bytes")


def add_isolation_arguments(verb) -> None:
    """--no-isolate and --case-timeout, for every verb that measures cases."""
    verb.add_argument("--no-isolate", action="store_true",
                      help="measure in this process (default: in a worker process that a crash, a hang or a lost "
                           "CUDA context costs one failed row, replaced after it dies)")
    verb.add_argument("--case-timeout", type=float, metavar="S", default=os.environ.get("PHASEBENCH_CASE_TIMEOUT"),
                      help="seconds a (case, impl) may take in the worker before it is recorded failed and the worker "
                           "replaced (default: 300 for an impl's first row, then 10x its longest row, at least 60; "
                           "0: no limit; env PHASEBENCH_CASE_TIMEOUT)")


def add_sampling_arguments(verb, time_limits: str) -> None:
    """--sample-time and --ci-target: when the samples of a (case, impl) stop (`time_limits`: the defaults' text)."""
    verb.add_argument("--sample-time", type=float, metavar="S",
                      help=f"the time limit of the timed samples per case and impl ({time_limits}); sampling stops "
                           "earlier once the interval of the median is narrow enough (--ci-target)")
    verb.add_argument("--ci-target", metavar="F",
                      help="the relative half-width of the median's 95%% interval that stops sampling, a fraction "
                           "(0.02) or a percentage (2%%); default 1%% on CUDA, 2%% on the host")


def ci_target_of(args) -> float | None:
    """--ci-target as a fraction in (0, 1): '2%' or '0.02' -> 0.02 (None when not given); a one-line UsageError
    otherwise, before anything runs."""
    text = getattr(args, "ci_target", None)
    if text is None:
        return None
    word = str(text).strip()
    try:
        value = float(word[:-1]) / 100 if word.endswith("%") else float(word)
    except ValueError:
        raise UsageError(f"ci-target: expected a fraction (0.02) or a percentage (2%), got {text!r}") from None
    if not 0 < value < 1:
        raise UsageError(f"ci-target: must be above 0 and below 100%, got {text!r}")
    return value


def selection_of(args) -> Selection:
    """The case selection a verb's options give (a verb without one of them selects its default)."""
    return Selection(**{name: getattr(args, name, None) for name in ("op", "impl", "model", "device", "dtype",
                                                                       "shape", "plugin", "weights")},
                     suite=getattr(args, "suite", None) or "quick")


# the workers a run starts with the command, one per round up to this many (each is a fresh interpreter; more would
# slow the command's own start-up on a small host than save later)
PRESTARTED_WORKERS = 3


def rounds_of(args) -> int:
    """`run`'s rounds: --rounds, else PHASEBENCH_ROUNDS, else DEFAULT_ROUNDS; one with --no-isolate, where every round
    would share this process (what differs between processes is what the rounds are for): asked for, refused."""
    check_counts(args, "rounds", minimum=1)
    if args.no_isolate:
        if args.rounds is not None and args.rounds > 1:
            raise UsageError("rounds: each round after the first runs in a fresh worker process, and --no-isolate "
                             "measures in this one; give --rounds 1, or leave out --no-isolate")
        return 1
    if args.rounds is not None:
        return args.rounds
    text = os.environ.get("PHASEBENCH_ROUNDS") or str(DEFAULT_ROUNDS)
    if not text.strip().isdigit() or int(text) < 1:
        raise UsageError(f"rounds: PHASEBENCH_ROUNDS must be a positive whole number, got {text!r}")
    return int(text)


def isolation_of(args, start: bool = False):
    """Where the verb measures, from the command line (the worker imports the plugins again); `start` spawns the
    workers' interpreters at once (one per round of a run, up to PRESTARTED_WORKERS), so that their imports overlap
    the verb's own and no later round waits for one while the machine could be measuring."""
    from ..sweep.worker import Isolation, prestart

    isolation = Isolation(not args.no_isolate, tuple(args.plugin or ()), args.case_timeout)
    if start:
        prestart(isolation, min(max(getattr(args, "rounds", None) or 1, 1), PRESTARTED_WORKERS))
    return isolation


def out_dir_for(args) -> Path:
    if args.out:
        return Path(args.out)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / stamp


def check_seconds(args, *flags: str, zero_ok: tuple[str, ...] = ("case_timeout",)) -> None:
    """Each given option among `flags` (argparse names) a positive number of seconds (or 0 for those in `zero_ok`:
    0 turns the limit off), else a one-line UsageError."""
    for flag in flags:
        value = getattr(args, flag, None)
        if value is None:
            continue
        if flag in zero_ok and not value >= 0:
            raise UsageError(f"{flag.replace('_', '-')}: must be 0 (no limit) or a positive number of seconds")
        if flag not in zero_ok and not value > 0:
            raise UsageError(f"{flag.replace('_', '-')}: must be a positive number of seconds")


def check_counts(args, *flags: str, minimum: int = 1) -> None:
    """Each given option among `flags` (argparse names; an int or a list of ints) at least `minimum`, else a
    one-line UsageError: checked before anything is written."""
    what = "a positive whole number" if minimum == 1 else f"a whole number of at least {minimum}"
    for flag in flags:
        value = getattr(args, flag, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and not item >= minimum:
                raise UsageError(f"{flag.replace('_', '-')}: must be {what}, got {item}")


def check_writable(path: Path) -> None:
    """Fail before measuring anything when the results cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".phasebench-write-test-{os.getpid()}"  # two commands starting at once each probe their own
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"out: cannot write to {path}: {err.strerror or err}") from None
