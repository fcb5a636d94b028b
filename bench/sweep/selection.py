"""Which device, dtype, cases and implementations a run selects (Selection), resolved on a device: shared by the
CLI, the pytest-benchmark suite, Ray's workers and the ncu target, none of which passes a command line here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


class UsageError(ValueError):
    """A bad selection: printed as one line, exit status 2, no traceback."""


@dataclass(frozen=True)
class Selection:
    """What a run measures: a suite's cases (or `shape`s written by hand, `K=V,...` as `--shape` takes them) of
    the operators `op` (all when empty) for the model presets `model` (the suite's when empty), in `dtype` (None:
    the device's default) on `device` (None: the best here), with the implementations `impl` (all available
    when empty), after importing the `plugin` modules (names or .py paths) that register kernels; `weights` (a
    `--weights` choice) packs the routed experts of the moe cases with that scheme."""

    suite: str = "quick"
    op: tuple[str, ...] = ()
    impl: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    device: str | None = None
    dtype: str | None = None
    shape: tuple[str, ...] = ()
    plugin: tuple[str, ...] = ()
    weights: str | None = None

    def __post_init__(self):  # lists (argparse's nargs) or None (an option not given) become tuples
        for name in ("op", "impl", "model", "shape", "plugin"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))

    def argv(self) -> list[str]:
        """The same selection as `phasebench run` options (e.g. for a run started under nsys)."""
        argv = ["--suite", self.suite]
        for flag in ("impl", "model", "op"):
            if getattr(self, flag):
                argv += [f"--{flag}", *getattr(self, flag)]
        for flag in ("device", "dtype", "weights"):
            if getattr(self, flag):
                argv += [f"--{flag}", getattr(self, flag)]
        for shape in self.shape:
            argv += ["--shape", shape]
        for plugin in self.plugin:
            argv += ["--plugin", plugin]
        return argv

    def portable(self) -> Selection:
        """The plugin files by absolute path, so that a worker started in another folder finds them too."""
        return dataclasses.replace(self, plugin=tuple(str(Path(p).resolve()) if Path(p).is_file() else p
                                                      for p in self.plugin))


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
    """bfloat16 on CUDA, float32 on the host."""
    return "bfloat16" if device.type == "cuda" else "float32"


def build_cases(selection: Selection, device) -> tuple[list, str]:
    """The selected cases on `device` and the suite they came from ("custom" for shapes written by hand); a
    one-line UsageError for an unknown dtype, model, operator or a bad shape."""
    from ..ops import operators
    from ..ops.attention.cases import DTYPES, parse_shape
    from ..ops.linear.cases import parse_linear_shape
    from ..spec.models import model_config
    from .suites import suite_cases

    dtype = selection.dtype or default_dtype(device)
    if dtype not in DTYPES:
        raise UsageError(f"dtype: unknown dtype {dtype!r}, choose from {', '.join(DTYPES)}")
    try:
        models = [model_config(m).name for m in selection.model]
    except ValueError as err:
        raise UsageError(str(err)) from None
    ops = selection.op
    for op in ops:
        if op not in operators():
            raise UsageError(f"op: unknown operator {op!r}, choose from {', '.join(operators())}")
    try:
        if selection.shape:
            model = models[0] if models else None
            cases = [parse_linear_shape(text, dtype, model) if text.startswith("m=") or ",m=" in text
                     else parse_shape(text, dtype, model) for text in selection.shape]
            return [c for c in cases if not ops or c.op in ops], "custom"
        cases = suite_cases(selection.suite, device.type, dtype, tuple(models) or None, ops or None)
        return with_weights(cases, selection.weights, selection.suite), selection.suite
    except ValueError as err:
        raise UsageError(str(err)) from None


def with_weights(cases: list, weights: str | None, suite: str) -> list:
    """The cases with their routed experts packed by the `--weights` choice (moe cases only; None: as they are); a
    one-line UsageError for an unknown choice or a selection without a moe case."""
    if not weights:
        return cases
    from ..spec.quant import WEIGHT_CHOICES

    if weights not in WEIGHT_CHOICES:
        raise UsageError(f"weights: unknown scheme {weights!r}, choose from {', '.join(WEIGHT_CHOICES)}")
    if not any(c.op == "moe" for c in cases):
        raise UsageError(f"weights: packs the routed experts of moe cases, and suite {suite} selects none here "
                         "(moe-decode and moe-prefill have them)")
    scheme = WEIGHT_CHOICES[weights]
    return [dataclasses.replace(c, scheme=scheme) if c.op == "moe" else c for c in cases]


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


def resolve_impls(names, device, ops=("attention",), compiled: bool = True) -> list[str]:
    """The named impls (each must exist for one of `ops`), or every impl of those ops available here (without
    `compiled`, those that compile on their first call are left out unless named: the quick suite's)."""
    from ...kernels import OPS, available_impls

    if not names:
        found = [name for op in ops for name in available_impls(device, op=op)
                 if compiled or not OPS[op][name].compiles]
        return list(dict.fromkeys(found))
    known = {name for op in ops for name in OPS[op]}
    for name in names:
        if name not in known:
            raise UsageError(f"impl: unknown implementation {name!r} for {'/'.join(ops)}, "
                             f"choose from {', '.join(sorted(known))}")
    return list(dict.fromkeys(names))
