"""Read kernels (or top-level CPU ops) and user annotations from a torch.profiler Chrome trace."""

from __future__ import annotations

import gzip
import json
import zlib
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from ._nesting import Nesting
from .nsys import KERNEL_COLUMNS

RANGE_COLUMNS = ["name", "start_ns", "end_ns", "duration_ns", "pid", "tid", "kind"]
KINDS = ("auto", "kernel", "cpu_op")

# trace categories, lower-cased; older kineto wrote "Kernel", "Runtime", "Operator"
_KERNEL = {"kernel"}
_LAUNCH = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
_CPU_OP = {"cpu_op", "operator"}
_ANNOTATION = {"user_annotation", "gpu_user_annotation"}


def _ns(value) -> int:
    """Trace times are microseconds whatever displayTimeUnit says; floats are parsed as Decimal."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000
    return int((Decimal(str(value)) * 1000).to_integral_value(ROUND_HALF_EVEN))


def _load(path) -> list:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{path}: broken gzip data ({exc})") from None
    try:
        # Decimal keeps the sub-microsecond digits that a float would round away
        trace = json.loads(data, parse_float=Decimal)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON trace ({' '.join(str(exc).split())})") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return events


def _complete(events, cats) -> pd.DataFrame:
    """The complete ("X") events of some categories: name, start, end, pid, tid, group, args, cat."""
    rows = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or str(ev.get("cat", "")).lower() not in cats:
            continue
        try:
            start, dur = _ns(ev["ts"]), _ns(ev.get("dur", 0))
        except (KeyError, ArithmeticError, ValueError, TypeError):
            continue  # an event without a usable time cannot be placed
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        pid, tid = ev.get("pid"), ev.get("tid")
        rows.append((str(ev.get("name", "")), start, start + dur, pid, tid, f"{pid}|{tid}", args,
                     str(ev.get("cat")).lower()))
    df = pd.DataFrame(rows, columns=["name", "start", "end", "pid", "tid", "group", "args", "cat"])
    df = df.astype({"start": np.int64, "end": np.int64, "name": object})
    return df.sort_values(["start", "end"], ascending=[True, False], kind="stable").reset_index(drop=True)


def _ints(values) -> pd.arrays.IntegerArray:
    def num(v):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer, Decimal, float, str)):
            return None
        try:
            return int(v)
        except (ValueError, ArithmeticError):
            return None
    return pd.array([num(v) for v in values], dtype="Int64")


def _arg(df, key, i=None):
    """One arg of every event (`i`: an item of a list arg such as grid); older kineto lower-cased keys."""
    out = []
    for args in df["args"]:
        value = args.get(key, args.get(key.lower()))
        if i is not None:
            value = value[i] if isinstance(value, list) and len(value) > i else None
        out.append(value)
    return out


def _top_level(ops) -> pd.DataFrame:
    """CPU ops not nested in another CPU op of the same thread (nested ones would be counted twice)."""
    if ops.empty:
        return ops
    ops = ops.sort_values(["group", "start", "end"], ascending=[True, True, False], kind="stable")
    reach = ops.groupby("group", sort=False)["end"].cummax().groupby(ops["group"], sort=False).shift()
    nested = reach.notna() & (ops["start"] < reach) & (ops["end"] <= reach)
    return ops[~nested].sort_values(["start", "end"], ascending=[True, False], kind="stable")


def _first_by(key_values):
    """key -> position of the earliest event carrying that key (events are sorted by start, then file order)."""
    out = {}
    for pos, key in enumerate(key_values):
        if key is not None and key not in out:
            out[key] = pos
    return out


def read_kernels(path, kind: str = "auto") -> pd.DataFrame:
    """GPU kernels (kind="kernel") or top-level CPU ops (kind="cpu_op") of a trace, one row each.

    kind="auto" takes the GPU kernels when the trace has any, else the CPU ops. Columns are those
    of nsys.read_kernels (KERNEL_COLUMNS); nvtx_range is the innermost user annotation (record_function)
    open on the launching thread at the launch call, nvtx_path every one open there, outermost first.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(KINDS)}")
    events = _load(path)
    kernels = _complete(events, _KERNEL) if kind != "cpu_op" else None
    if kind == "cpu_op" or (kind == "auto" and kernels.empty):
        kind, rows = "cpu_op", _top_level(_complete(events, _CPU_OP)).reset_index(drop=True)
        q_group, q_time = rows["group"].to_numpy(object), rows["start"].to_numpy(np.int64)
        pid, tid, corr = rows["pid"], rows["tid"], [None] * len(rows)
        device = stream = [None] * len(rows)
    else:
        kind, rows = "kernel", kernels
        corr = _arg(rows, "correlation")
        launches = _complete(events, _LAUNCH)
        by_corr = _first_by(_arg(launches, "correlation"))
        # without a correlation match, a launch by the same op (its External id) is as good for the range
        by_ext = _first_by(_arg(launches, "External id"))
        q_group, q_time, pid, tid = [], [], [], []
        for k, (c, ext) in enumerate(zip(corr, _arg(rows, "External id"), strict=True)):
            pos = by_corr.get(c, by_ext.get(ext))
            if pos is None:  # no launch known: look for a gpu_user_annotation on the kernel's own stream
                q_group.append(rows["group"].iat[k])
                q_time.append(rows["start"].iat[k])
                pid.append(None)
                tid.append(None)
            else:
                q_group.append(launches["group"].iat[pos])
                q_time.append(launches["start"].iat[pos])
                pid.append(launches["pid"].iat[pos])
                tid.append(launches["tid"].iat[pos])
        q_group, q_time = np.asarray(q_group, dtype=object), np.asarray(q_time, dtype=np.int64)
        device = [d if d is not None else p for d, p in zip(_arg(rows, "device"), rows["pid"], strict=True)]
        stream = [s if s is not None else t for s, t in zip(_arg(rows, "stream"), rows["tid"], strict=True)]
    start, end = rows["start"].to_numpy(np.int64), rows["end"].to_numpy(np.int64)
    df = pd.DataFrame({"name": rows["name"].to_numpy(object), "demangled_name": rows["name"].to_numpy(object),
                       "start_ns": start, "end_ns": end, "duration_ns": end - start,
                       "device_id": _ints(device), "stream_id": _ints(stream)})
    for axis, i in (("x", 0), ("y", 1), ("z", 2)):
        df[f"grid_{axis}"] = _ints(_arg(rows, "grid", i))
        df[f"block_{axis}"] = _ints(_arg(rows, "block", i))
    df["registers_per_thread"] = _ints(_arg(rows, "registers per thread"))
    df["static_shared_bytes"] = df["dynamic_shared_bytes"] = pd.array([pd.NA] * len(rows), dtype="Int64")
    df["shared_bytes"] = _ints(_arg(rows, "shared memory"))  # kineto reports static + dynamic together
    df["correlation_id"] = _ints(corr)
    df["pid"], df["tid"] = _ints(pid), _ints(tid)
    notes = _complete(events, _ANNOTATION)
    nest = Nesting(notes["group"].to_numpy(object), notes["start"], notes["end"], notes["name"].to_numpy(object))
    idx = nest.innermost(q_group, q_time)
    names = notes["name"].to_numpy(object)
    df["nvtx_range"] = pd.Series([names[i] if i >= 0 else None for i in idx], dtype=object)
    df["nvtx_path"] = pd.Series(nest.paths(idx), dtype=object)
    df = df.sort_values(["start_ns", "device_id", "stream_id", "correlation_id"], kind="stable")
    df = df.reset_index(drop=True)[KERNEL_COLUMNS]
    df.attrs.update({"source": "torch_trace", "kind": kind})
    return df


def read_ranges(path, gpu: bool = False) -> pd.DataFrame:
    """User annotations (record_function ranges) on CPU threads, sorted by start; with gpu=True also
    their gpu_user_annotation copies on the GPU streams. Columns: RANGE_COLUMNS (kind = trace category)."""
    notes = _complete(_load(path), {"user_annotation", "gpu_user_annotation"} if gpu else {"user_annotation"})
    start, end = notes["start"].to_numpy(np.int64), notes["end"].to_numpy(np.int64)
    df = pd.DataFrame({"name": notes["name"].to_numpy(object), "start_ns": start, "end_ns": end,
                       "duration_ns": end - start, "pid": _ints(notes["pid"]), "tid": _ints(notes["tid"]),
                       "kind": notes["cat"].to_numpy(object)}, columns=RANGE_COLUMNS)
    df.attrs.update({"source": "torch_trace"})
    return df
