"""Which device, dtype, cases and implementations a command line selects (shared by the CLI and pytest bench)."""

from __future__ import annotations


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
    from .cases import DTYPES, parse_shape, suite_cases
    from .models import model_config

    dtype = args.dtype or default_dtype(device)
    if dtype not in DTYPES:
        raise UsageError(f"dtype: unknown dtype {dtype!r}, choose from {', '.join(DTYPES)}")
    try:
        models = [model_config(m).name for m in args.model or ()]
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        if args.shape:
            model = models[0] if models else None
            return [parse_shape(text, dtype, model) for text in args.shape], "custom"
        return suite_cases(args.suite, device.type, dtype, tuple(models) or None), args.suite
    except ValueError as err:
        raise UsageError(str(err)) from None


def load_plugins(specs) -> None:
    """Import each plugin module so what it registers can be named with --impl."""
    from ..kernels import load_plugin

    for spec in specs or ():
        try:
            load_plugin(spec)
        except ValueError as err:
            raise UsageError(str(err)) from None


def resolve_impls(names, device) -> list[str]:
    from ..kernels import IMPLS, available_impls

    if not names:
        return available_impls(device)
    for name in names:
        if name not in IMPLS:
            raise UsageError(f"impl: unknown implementation {name!r}, choose from {', '.join(IMPLS)}")
    return list(dict.fromkeys(names))
