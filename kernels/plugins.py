"""Users' own kernels: `register(op, name, fn, ...)` puts a function behind an operator's calling convention."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .inductor import first_call_recorded
from .registry import CALLERS, OPS, CompileRecord, Impl, PlannedCall, check_compute, dtype_name

DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
               "float64": torch.float64}
DEFAULT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

def _dtypes(dtypes: Iterable) -> frozenset[torch.dtype]:
    out = set()
    for d in dtypes:
        if isinstance(d, str) and d.removeprefix("torch.") in DTYPE_NAMES:
            d = DTYPE_NAMES[d.removeprefix("torch.")]
        if not isinstance(d, torch.dtype):
            raise ValueError(f"dtypes: expected torch dtypes or names such as 'bfloat16', got {d!r}")
        out.add(d)
    return frozenset(out)


def _compute(compute):
    """A plugin's compute declaration: None (its inputs' dtype), a dtype or its name, or a function as Impl takes."""
    if compute is None or callable(compute):
        return compute
    if isinstance(compute, torch.dtype):
        compute = dtype_name(compute)
    return check_compute(compute.removeprefix("torch.") if isinstance(compute, str) else compute, "a plugin")


def register(op: str, name: str, fn: Callable, *, devices: Iterable[str] = ("cpu", "cuda"),
             dtypes: Iterable = DEFAULT_DTYPES, summary: str = "", paged: bool = False, window: bool = False,
             sinks: bool = False, compute=None, compiles: bool = False) -> Impl:
    """Register `fn` as implementation `name` of `op`; it is then gated and timed like the built-ins.

    `fn` takes the operator's arguments (attention: `fn(q, k, v, *, causal, scale, cache_seqlens)`;
    linear: `fn(x, w)`), returns its output, and may raise `Unsupported` for a valid request it cannot serve.
    `paged=True` (attention): `fn` also serves paged caches, called as `fn(q, k_pool, v_pool, *, causal, scale,
    cache_seqlens, block_table)`; without it, paged requests are skipped as unsupported. `window=True` and
    `sinks=True` (attention) likewise: `fn` also takes `window_left=` (FlashInfer's sliding window) and `sinks=`
    (float32 [Hq]), passed only to requests that have them; without them such requests are skipped.
    `compute`: the precision its multiply-adds run in, whose matmul ceiling is its rows' compute roof: a dtype or
    its name ("float32" for a kernel that upcasts bf16 inputs), or `fn(device_type, dtype, case_fields) -> name`;
    by default the inputs' dtype.
    `compiles=True`: `fn` compiles on its first call (torch.compile): the harness makes that call untimed before the
    gate, records its cost in the row's compile columns and flags a row that compiles again while it is sampled; like
    the built-in `flex` and `compiled`, the quick suite then leaves it out unless it is named.
    """
    from .registry import BUILTINS

    if op not in OPS or op not in CALLERS:
        raise ValueError(f"op: unknown operator {op!r}, choose from {', '.join(OPS)}")
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"name: must be letters, digits, '_' or '-', got {name!r}")
    if (op, name) in BUILTINS:
        raise ValueError(f"name: {name!r} is a built-in {op} implementation; choose another name")
    if not callable(fn):
        raise ValueError(f"fn: must be callable, got {type(fn).__name__}")
    for flag, value in (("paged", paged), ("window", window), ("sinks", sinks)):
        if not isinstance(value, bool) or (value and op != "attention"):
            raise ValueError(f"{flag}: must be a bool, and True only for attention, got {value!r} for {op}")
    if not isinstance(compiles, bool):
        raise ValueError(f"compiles: must be a bool, got {compiles!r}")
    devices = frozenset(devices)
    if not devices or not devices <= {"cpu", "cuda"}:
        raise ValueError(f"devices: must be a non-empty subset of cpu, cuda, got {sorted(devices)}")
    compute = _compute(compute)
    call = CALLERS[op]
    backend = f"plugin:{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', name)}"

    def plan(req) -> PlannedCall:
        if not compiles:
            return PlannedCall(name, backend, lambda: call(fn, req))
        record = CompileRecord(mode="plugin")
        return PlannedCall(name, backend, first_call_recorded(lambda: call(fn, req), record), record)

    impl = Impl(op=op, name=name, summary=summary or (fn.__doc__ or "").strip().split("\n")[0] or "a registered plugin",
                devices=devices, dtypes=_dtypes(dtypes), plan=plan, max_head_dim=1 << 16, paged=paged,
                window=window, sinks=sinks, backends=lambda device_type: backend, compute=compute,
                compiles=compiles)
    OPS[op][name] = impl
    return impl


def load_plugin(spec: str) -> None:
    """Import a plugin module by name (`my_kernels`) or path (`./my_kernels.py`); one-line ValueError on failure."""
    try:
        if spec.endswith(".py") or "/" in spec:
            path = Path(spec)
            if not path.is_file():
                raise FileNotFoundError(f"no such file {spec}")
            mod_name = f"phasebench_plugin_{path.stem}"
            loader = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = module
            loader.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except ValueError as err:  # a clash or bad registration inside the plugin
        raise ValueError(f"plugin: {spec}: {str(err).splitlines()[0]}") from None
    except Exception as err:
        text = str(err).strip().splitlines()
        raise ValueError(f"plugin: cannot import {spec!r}: {type(err).__name__}: {text[0] if text else ''}") from None
