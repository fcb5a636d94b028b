"""NVTX ranges in the "phasebench" domain through the `nvtx` package; a no-op when no profiler listens."""

from __future__ import annotations

import contextlib

try:
    import nvtx as _nvtx
except Exception:  # not installed or broken: annotations become no-ops
    _nvtx = None

DOMAIN = "phasebench"

_NULL = contextlib.nullcontext()
_active: bool | None = None  # decided on first use; a profiler attaches at process start, not later


def enabled() -> bool:
    """True when a profiler (e.g. nsys) collects NVTX ranges in this process."""
    global _active
    if _active is None:
        try:
            # without an attached tool, nvtx hands out a dummy domain whose calls do nothing
            _active = _nvtx is not None and type(_nvtx.get_domain(DOMAIN)).__name__ != "DummyDomain"
        except Exception:
            _active = False
    return _active


_record_function = None  # torch.profiler.record_function while a torch.profiler capture runs


def mirror_to_torch_profiler(on: bool) -> None:
    """Also open each range as a torch.profiler `record_function`, for captures without nsys."""
    global _record_function
    if on:
        from torch.profiler import record_function  # imported only when a torch capture asks for it

        _record_function = record_function
    else:
        _record_function = None


def nvtx_range(name: str, payload=None, color=None):
    """Context manager: one push/pop range `name` in the phasebench domain (payload: an int or float)."""
    active = _active if _active is not None else enabled()
    if _record_function is not None:
        stack = contextlib.ExitStack()
        stack.enter_context(_record_function(name))
        if active:
            stack.enter_context(_nvtx.annotate(name, color=color, domain=DOMAIN, payload=payload))
        return stack
    if not active:
        return _NULL
    return _nvtx.annotate(name, color=color, domain=DOMAIN, payload=payload)
