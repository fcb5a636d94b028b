"""Which device, dtype, cases and implementations a command line selects (shared by the CLI and pytest bench)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path


class UsageError(ValueError):
    """A bad selection: printed as one line, exit status 2, no traceback."""


def resolve_device(name: str | None):
    """The named device, or the best one here (CUDA if present, else the host)."""
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"device: unknown device {name!r}, expected cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise UsageError(f"device: {name} does not exist here ({count} CUDA device(s))")
        return torch.device("cuda", device.index or 0)
    if device.type != "cpu":
        raise UsageError(f"device: {name} is not supported here, use cpu or cuda")
    return device


def default_dtype(device) -> str:
    return "bfloat16" if device.type == "cuda" else "float32"


def build_cases(args, device):
    from ..ops import operators
    from ..ops.attention.cases import DTYPES, parse_shape
    from ..ops.linear.cases import parse_linear_shape
    from ..spec.models import model_config
    from .suites import suite_cases

    dtype = args.dtype or default_dtype(device)
    if dtype not in DTYPES:
        raise UsageError(f"dtype: unknown dtype {dtype!r}, choose from {', '.join(DTYPES)}")
    try:
        models = [model_config(m).name for m in args.model or ()]
    except ValueError as err:
        raise UsageError(str(err)) from None
    ops = tuple(getattr(args, "op", None) or ())
    for op in ops:
        if op not in operators():
            raise UsageError(f"op: unknown operator {op!r}, choose from {', '.join(operators())}")
    try:
        if args.shape:
            model = models[0] if models else None
            cases = [parse_linear_shape(text, dtype, model) if text.startswith("m=") or ",m=" in text
                     else parse_shape(text, dtype, model) for text in args.shape]
            return [c for c in cases if not ops or c.op in ops], "custom"
        return suite_cases(args.suite, device.type, dtype, tuple(models) or None, ops or None), args.suite
    except ValueError as err:
        raise UsageError(str(err)) from None


def case_ops(cases) -> tuple[str, ...]:
    """The operators of the selected cases, in first-seen order."""
    return tuple(dict.fromkeys(c.op for c in cases)) or ("attention",)


def load_plugins(specs) -> None:
    """Import each plugin module so what it registers can be named with --impl."""
    from ...kernels import load_plugin

    for spec in specs or ():
        try:
            load_plugin(spec)
        except ValueError as err:
            raise UsageError(str(err)) from None


def resolve_impls(names, device, ops=("attention",)) -> list[str]:
    """The named impls (each must exist for one of `ops`), or every impl of those ops available here."""
    from ...kernels import OPS, available_impls

    if not names:
        found = [name for op in ops for name in available_impls(device, op=op)]
        return list(dict.fromkeys(found))
    known = {name for op in ops for name in OPS[op]}
    for name in names:
        if name not in known:
            raise UsageError(f"impl: unknown implementation {name!r} for {'/'.join(ops)}, "
                             f"choose from {', '.join(sorted(known))}")
    return list(dict.fromkeys(names))


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


def add_isolation_arguments(verb) -> None:
    """--no-isolate and --case-timeout, for every verb that measures cases."""
    verb.add_argument("--no-isolate", action="store_true",
                      help="measure in this process (default: in a worker process that a crash, a hang or a lost "
                           "CUDA context costs one failed row, replaced after it dies)")
    verb.add_argument("--case-timeout", type=float, metavar="S",
                      help="seconds a (case, impl) may take in the worker before it is recorded failed and the worker "
                           "replaced (default: 300 for an impl's first row, then 10x its longest row, at least 60; "
                           "0: no limit)")


def isolation_of(args, start: bool = False):
    """Where the verb measures, from the command line (the worker imports the plugins again); `start` spawns the
    worker's interpreter at once, so that its imports overlap the verb's own."""
    from .worker import Isolation, prestart

    isolation = Isolation(not args.no_isolate, tuple(args.plugin or ()), args.case_timeout)
    if start:
        prestart(isolation)
    return isolation


def check_writable(path: Path) -> None:
    """Fail before measuring anything when the results cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".phasebench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"out: cannot write to {path}: {err.strerror or err}") from None


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
