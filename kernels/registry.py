"""The registry of every operator's implementations and what each one supports."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from .errors import Unsupported


@dataclass
class CompileRecord:
    """What a compiled call's first run cost (kernels.inductor fills it): `seconds` (compile and one run,
    untimed), `graphs` (graphs Dynamo compiled for it: 0 where an earlier call's served it), `cache` (cold: Inductor
    compiled; disk: its FX graph cache served every graph; memory: nothing was compiled), `build_s` (what the plan
    built beforehand, outside the call: a flex block mask), `mode` (torch.compile's)."""

    mode: str
    build_s: float = 0.0
    seconds: float | None = None
    graphs: int = 0
    cache: str = ""

    @property
    def done(self) -> bool:
        return self.seconds is not None

    def columns(self) -> dict:
        """A result row's compile columns."""
        return {"compile_s": self.seconds, "compile_graphs": self.graphs, "compile_cache": self.cache,
                "build_s": self.build_s}


@dataclass(frozen=True)
class PlannedCall:
    """A planned call of any operator (what `prepare`, `prepare_linear` and `prepare_elementwise` return): the impl,
    the concrete backend that will serve it and a thunk that runs it; a compiled implementation's `compiled` records
    what its first run cost (compiling included: kernels.inductor)."""

    impl: str
    backend: str
    run: Callable[[], torch.Tensor]
    compiled: CompileRecord | None = None


COMPUTE_DTYPES = ("float16", "bfloat16", "float32", "float64")  # what an implementation's arithmetic may run in


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_compute(found, who: str) -> str:
    """A compute declaration's answer: dtype names joined by '+', each a floating dtype; else a one-line ValueError."""
    if not isinstance(found, str) or not found or not set(found.split("+")) <= set(COMPUTE_DTYPES):
        raise ValueError(f"compute: {who} must name the dtype(s) its arithmetic runs in ({', '.join(COMPUTE_DTYPES)},"
                         f" joined by '+' for equal shares), got {found!r}")
    return found


@dataclass(frozen=True)
class Impl:
    """One implementation name and the requests it declares it can serve."""

    name: str
    summary: str
    devices: frozenset[str]
    dtypes: frozenset[torch.dtype]
    plan: Callable[..., PlannedCall]  # a validated request of its operator (AttentionRequest, LinearRequest, ...)
    causal: bool = True
    gqa: bool = True
    ragged: bool = True
    paged: bool = False  # reads K/V through a block table (pools of pages)
    # attention: honours a sliding window (window_left) / a per-head sink logit (sinks); a route that cannot serve one
    # it declares raises Unsupported when planned
    window: bool = False
    sinks: bool = False
    max_head_dim: int = 256
    # reads an fp8 KV cache (attention's K/V, MLA's latent: float8_e4m3fn codes with scales); `fp8_refusal` says why
    # an implementation without it refuses one (SDPA takes no fp8 K/V with scales)
    fp8_kv: bool = False
    fp8_refusal: str = ""
    # returns None when usable on a device type, else why not (e.g. a package is missing)
    unavailable: Callable[[str], str | None] = field(default=lambda device_type: None)
    # the concrete backend name(s) it would use on a device type, for `phasebench list`
    backends: Callable[[str], str] = field(default=lambda device_type: "")
    op: str = "attention"  # the operator whose calling convention `plan` serves
    # The precision its multiply-adds run in, whose matmul ceiling is its rows' compute roof: a dtype name, or a
    # function (device type, the request's dtype, the case's fields such as m and scheme) -> a name; names joined by
    # '+' take equal shares of the FLOPs (naive attention: fp32 scores, P.V in the input dtype). None: the request's
    # dtype (what a kernel that multiplies its inputs as they come computes in).
    compute: str | Callable[[str, torch.dtype, Mapping], str] | None = None
    # compiled on its first call (torch.compile): the quick suite leaves it out unless it is named
    compiles: bool = False

    def compute_dtype(self, device_type: str, dtype: torch.dtype, fields: Mapping | None = None) -> str:
        """The precision of this implementation's arithmetic on a request of `dtype` on `device_type` (see compute)."""
        if self.compute is None:
            return dtype_name(dtype)
        found = self.compute if isinstance(self.compute, str) else self.compute(device_type, dtype, dict(fields or {}))
        return check_compute(found, f"{self.op} implementation {self.name!r}")

    def why_not(self, device_type: str) -> str | None:
        if device_type not in self.devices:
            return f"{self.name} does not run on {device_type} (runs on {', '.join(sorted(self.devices))})"
        return self.unavailable(device_type)

    def check(self, req) -> None:
        """Raise Unsupported when the request is outside what this implementation declares."""
        reason = self.why_not(req.device_type)
        if reason is None and req.dtype not in self.dtypes:
            reason = f"{self.name} does not support dtype {req.dtype} on {req.device_type}"
        if reason is None and getattr(req, "kv_fp8", False) and not self.fp8_kv:
            reason = self.fp8_refusal or f"{self.name} does not read an fp8 KV cache (float8_e4m3fn with scales)"
        if reason is None and self.op == "attention":
            reason = self._attention_limits(req)
        if reason is not None:
            raise Unsupported(reason)

    def _attention_limits(self, req) -> str | None:  # an AttentionRequest
        reason = None
        if req.head_dim > self.max_head_dim:
            reason = f"{self.name} supports head dims up to {self.max_head_dim}, got {req.head_dim}"
        if reason is None and req.causal and not self.causal:
            reason = f"{self.name} does not support causal masks"
        if reason is None and req.kv_heads != req.q_heads and not self.gqa:
            reason = f"{self.name} does not support GQA/MQA"
        if reason is None and req.ragged and not self.ragged:
            reason = f"{self.name} does not support ragged cache_seqlens"
        if reason is None and req.paged and not self.paged:
            reason = f"{self.name} does not read a paged KV cache (block_table)"
        if reason is None and req.windowed and not self.window:
            reason = f"{self.name} cannot honour a sliding window (window_left={req.window_left})"
        if reason is None and req.sinks is not None and not self.sinks:
            reason = f"{self.name} has no attention-sink term (sinks)"
        return reason


OPS: dict[str, dict[str, Impl]] = {}  # operator -> its implementations by name
CALLERS: dict[str, Callable] = {}  # operator -> how a planned request calls a user's function (plugins)
BUILTINS: set[tuple[str, str]] = set()  # (operator, name) pairs a plugin may not take


def add_operator(op: str, call_plugin: Callable) -> dict[str, Impl]:
    """Declare an operator: its implementations' table, and `call_plugin(fn, req)`, which calls a user's
    function with the operator's calling convention. Each operator package declares itself once."""
    if op in OPS:
        raise ValueError(f"op: operator {op!r} is declared already")
    CALLERS[op] = call_plugin
    return OPS.setdefault(op, {})


def add_builtin(impl: Impl) -> Impl:
    """Register one of phasebench's own implementations."""
    impls_of(impl.op)[impl.name] = impl
    BUILTINS.add((impl.op, impl.name))
    return impl


def impls_of(op: str) -> dict[str, Impl]:
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op: unknown operator {op!r}, choose from {', '.join(OPS)}") from None


def get_impl(name: str, op: str = "attention") -> Impl:
    impls = impls_of(op)
    try:
        return impls[name]
    except (KeyError, TypeError):
        raise ValueError(f"impl: unknown implementation {name!r} of {op}, choose from {', '.join(impls)}") from None


def _device_type(device) -> str:
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        try:
            return torch.device(device).type
        except RuntimeError:
            raise ValueError(f"device: unknown device {device!r}, expected e.g. 'cpu' or 'cuda'") from None
    raise ValueError(f"device: must be a str or torch.device, got {type(device).__name__}")


def available_impls(device="cpu", op: str = "attention") -> list[str]:
    """Names of the implementations of `op` that can run on `device` here."""
    dev = _device_type(device)
    return [name for name, impl in impls_of(op).items() if impl.why_not(dev) is None]


def describe_impls(device="cpu", op: str = "attention") -> list[dict]:
    """One dict per registered implementation: availability, backend(s) or the reason it is missing."""
    dev = _device_type(device)
    rows = []
    for name, impl in impls_of(op).items():
        reason = impl.why_not(dev)
        rows.append({"impl": name, "available": reason is None, "backend": impl.backends(dev) if reason is None else "",
                     "reason": reason or "", "summary": impl.summary})
    return rows
