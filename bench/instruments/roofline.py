"""Roofline ceilings measured on this machine (read, write and copy bandwidth, matmul FLOP/s per dtype), cached on a
GPU behind a probe, with datasheets; a row's roof from them (bench.spec.roof)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..spec.roof import copy_floor_s, level_warnings, memory_figures, roof, row_roof
from .ceiling_measures import (
    CEILING_STATISTIC,
    STREAMS,
    TORCH_DTYPES,
    StreamBuffers,
    best_matmul,
    cache_sizes,
    matmul_size,
    measure_levels,
    measure_matmul,
    measure_stream,
    measure_streams,
    with_provenance,
)
from .conditions import driver_version, load_warnings
from .timing import TimerConfig

DATASHEET_RANGE = (0.3, 1.1)  # measured / datasheet outside this gets a warning
__all__ = ["TORCH_DTYPES", "Ceilings", "ceilings", "matmul_size", "measure_matmul", "measure_stream"]


@dataclass(frozen=True)
class Datasheet:
    """Vendor figures: dense tensor-core TFLOP/s per dtype (fp32 without TF32) and memory GB/s."""

    name: str
    peak_gbps: float
    peak_tflops: dict[str, float]


# Public datasheet figures, dense (no sparsity), fp32 accumulate.
DATASHEETS = [
    ("H200", Datasheet("NVIDIA H200 SXM", 4800, {"bfloat16": 989, "float16": 989, "float32": 67})),
    ("H100 PCIe", Datasheet("NVIDIA H100 PCIe", 2000, {"bfloat16": 756, "float16": 756, "float32": 51})),
    ("H100", Datasheet("NVIDIA H100 SXM", 3350, {"bfloat16": 989, "float16": 989, "float32": 67})),
    ("A100-SXM4-80GB", Datasheet("NVIDIA A100 SXM 80GB", 2039, {"bfloat16": 312, "float16": 312, "float32": 19.5})),
    ("A100 80GB PCIe", Datasheet("NVIDIA A100 PCIe 80GB", 1935, {"bfloat16": 312, "float16": 312, "float32": 19.5})),
    ("A100", Datasheet("NVIDIA A100 40GB", 1555, {"bfloat16": 312, "float16": 312, "float32": 19.5})),
    ("L4", Datasheet("NVIDIA L4", 300, {"bfloat16": 121, "float16": 121, "float32": 30.3})),
    ("RTX 4090", Datasheet("NVIDIA GeForce RTX 4090", 1008, {"bfloat16": 165.2, "float16": 165.2, "float32": 82.6})),
]


def datasheet_for(device_name: str) -> Datasheet | None:
    """The first datasheet whose key appears in the device name (more specific keys come first)."""
    for key, sheet in DATASHEETS:
        if key.lower() in device_name.lower():
            return sheet
    return None


@dataclass
class Ceilings:
    """Measured peaks of one device: read-only, write-only and copy bandwidth past the last-level cache (L2 on a
    GPU), and matmul TFLOP/s per dtype.

    `read_gbps` is a reduction's (torch.dot, or torch.sum where faster), the ceiling of what reads (a decode, a
    GEMV); `write_gbps` a fill's; `copy_gbps` (also `peak_gbps`, the one figure before schema 5) a copy's, counting
    the bytes read plus written. A row's memory roof is its own floor at these (`roof`, bench.spec.roof).

    Provenance: `source` is "measured" (in this call) or "cached"; `measured_at` (UTC ISO time), `age_s` (seconds
    since then, at the call), `duration_s` and `conditions` (see `conditions.watch`) describe the measurement of the
    bandwidths and the dtypes measured with them; `bandwidth` holds each stream's own (its kernels' GB/s, the one
    kept, the buffer size, when, how long, conditions); `added` holds the same for each dtype measured later into
    the cache entry; `warnings` are one-line doubts about the figures (far from the datasheet, a cache level's own
    below a farther level's, measured under load).
    `levels` holds the host's streams resident in its L2 and last-level cache (ceiling_measures.measure_levels), the
    roof of a warm row whose footprint fits one; `caches` the cache sizes (l2_bytes, llc_bytes, source).
    """

    device: str
    kind: str
    peak_gbps: float
    peak_tflops: dict[str, float] = field(default_factory=dict)
    datasheet: Datasheet | None = None
    source: str = "measured"
    measured_at: str | None = None
    age_s: float = 0.0
    duration_s: float = 0.0
    conditions: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    added: dict[str, dict] = field(default_factory=dict)
    checked: str = ""  # how a cached entry was held against a probe now, or why the figures were measured
    matmul_n: dict[str, int] = field(default_factory=dict)  # the square size of the best of each dtype's matmuls
    read_gbps: float = math.nan  # NaN: not measured (a row's roof then puts its bytes at the copy bandwidth)
    write_gbps: float = math.nan
    bandwidth: dict[str, dict] = field(default_factory=dict)  # stream -> its figures and provenance
    levels: dict[str, dict] = field(default_factory=dict)  # "l2" / "llc" -> bytes, read/write/copy_gbps, bandwidth
    caches: dict = field(default_factory=dict)

    @property
    def copy_gbps(self) -> float:
        """The copy bandwidth (bytes read plus written), the same figure as peak_gbps."""
        return self.peak_gbps

    def to_json(self) -> dict:
        return {"device": self.device, "kind": self.kind, "peak_gbps": self.peak_gbps,
                "read_gbps": self.read_gbps, "write_gbps": self.write_gbps, "copy_gbps": self.copy_gbps,
                "peak_tflops": dict(self.peak_tflops),
                "datasheet": asdict(self.datasheet) if self.datasheet else None,
                "source": self.source, "measured_at": self.measured_at, "age_s": self.age_s,
                "duration_s": self.duration_s, "conditions": dict(self.conditions),
                "bandwidth": {s: dict(p) for s, p in self.bandwidth.items()},
                "warnings": list(self.warnings), "added": {d: dict(p) for d, p in self.added.items()},
                "checked": self.checked, "matmul_n": dict(self.matmul_n), "statistic": CEILING_STATISTIC,
                "levels": {k: dict(v) for k, v in self.levels.items()}, "caches": dict(self.caches)}

    def roof(self, dtype: str, flops: float, read_bytes: float | None, write_bytes: float | None,
             nbytes: float) -> tuple[float, float, str, str]:
        """(roof_tflops, roof_s, bound, roof_model) of one row: its floor read_bytes / read_gbps + write_bytes /
        write_gbps (bench.spec.roof.memory_floor_s) against the dtype's matmul peak; without the split (None) or
        the read and write ceilings, all `nbytes` at the copy bandwidth, roof_model "copy"."""
        nan = math.nan
        found = row_roof(flops, nan if read_bytes is None else read_bytes, nan if write_bytes is None else write_bytes,
                         nbytes, self.peak_tflops[dtype], self.read_gbps, self.write_gbps, self.copy_gbps)
        return float(found[0]), float(found[1]), str(found[2]), str(found[3])

    def roof_tflops(self, dtype: str, intensity: float) -> float:
        """The copy roof at an intensity, min(peak, intensity · copy GB/s), as every row had before schema 5."""
        return float(roof(intensity, copy_floor_s(1.0, self.copy_gbps), self.peak_tflops[dtype])[0])

    def ridge(self, dtype: str, stream: str = "read") -> float:
        """Intensity (FLOP/B) where a bandwidth slope (read by default: decode's) meets the compute ceiling."""
        gbps = {"read": self.read_gbps, "write": self.write_gbps, "copy": self.copy_gbps}[stream]
        return self.peak_tflops[dtype] * 1000 / gbps

    def provenance(self) -> str:
        """One line: measured now or cached (and how long ago), when and for how long."""
        when = f"at {self.measured_at}, took {self.duration_s:.1f} s"
        if self.source == "measured":
            return f"measured now ({when}); {self.checked}"
        return f"cached, measured {_age(self.age_s)} ago ({when}); {self.checked}"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device: torch.device) -> str:
    """Identifies a machine and device for the cache: name, memory, cores, torch and host."""
    parts = [device_name(device), device.type, torch.__version__, platform.node(), str(os.cpu_count())]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        parts += [str(props.total_memory), str(props.multi_processor_count), str(device.index or 0)]
    else:
        parts.append(str(torch.get_num_threads()))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


HOST_KEEP_ENV = "PHASEBENCH_HOST_CEILINGS"  # a folder: the host's ceilings measured once there, then reused


def host_keep_dir() -> Path | None:
    """The folder named by PHASEBENCH_HOST_CEILINGS, where the host keeps its ceilings for every run, or None."""
    value = os.environ.get(HOST_KEEP_ENV)
    return Path(value) if value else None


def cache_dir() -> Path:
    if os.environ.get("PHASEBENCH_CACHE"):
        return Path(os.environ["PHASEBENCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phasebench"


CEILING_TIMER = TimerConfig(warmup_s=0.2, budget_s=1.0, min_samples=5, max_samples=200, flush_l2=False)
# the host measures its ceilings in every run: a shorter timer keeps that near a second per figure
HOST_CEILING_TIMER = TimerConfig(warmup_s=0.1, budget_s=0.4, min_samples=3, max_samples=100, flush_l2=False)
# a stream keeps its best sample (ceiling_measures.measure_stream): five of them at least, on the host's long calls
HOST_STREAM_TIMER = TimerConfig(warmup_s=0.1, budget_s=0.3, min_samples=5, max_samples=100, flush_l2=False)
# a resident stream's call makes passes for about 1 ms (ceiling_measures.resident_passes): dozens in a short budget
HOST_LEVEL_TIMER = TimerConfig(warmup_s=0.02, budget_s=0.06, min_samples=5, max_samples=1000, flush_l2=False)


def on_device(device: torch.device):
    """Make `device` current: events, synchronize() and Triton launches act on the current device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def versions(device: torch.device) -> dict:
    """What the figures depend on besides the fingerprint: torch and, on CUDA, its CUDA and the GPU driver."""
    found = {"torch": torch.__version__}
    if device.type == "cuda":
        found.update(cuda=torch.version.cuda, driver=driver_version(device))
    return found


def _read_entry(path: Path, current: dict) -> dict | None:
    """The cache entry at `path` if it is whole and was measured with the `current` versions, else None."""
    try:
        entry = json.loads(path.read_text())
        float(entry["peak_gbps"]), float(entry["measured_at_epoch"]), str(entry["measured_at"])
        if entry.get("versions") != current or not isinstance(entry["peak_tflops"], dict):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    entry.setdefault("added", {})
    return entry


def datasheet_warnings(ceil: Ceilings) -> list[str]:
    """One line per ceiling outside DATASHEET_RANGE times its datasheet figure, where a datasheet exists."""
    sheet = ceil.datasheet
    if sheet is None:
        return []
    # a datasheet's bandwidth is what the memory reads at: it compares with the read stream, not the copy
    checks = [("read bandwidth", ceil.read_gbps, sheet.peak_gbps, "GB/s")] if math.isfinite(ceil.read_gbps) else []
    checks += [(f"matmul {d}", tf, sheet.peak_tflops[d], "TFLOP/s")
               for d, tf in ceil.peak_tflops.items() if d in sheet.peak_tflops]
    low, high = DATASHEET_RANGE
    return [f"{what}: measured {got:.4g} {unit} is {got / want:.2f}x the datasheet {want:.4g} {unit} "
            f"({sheet.name}), outside {low}-{high}x" for what, got, want, unit in checks
            if not low <= got / want <= high]


# ---- serving the ceilings: measured in each host run, cached on a GPU behind a probe ----------------------------

# The host measures its ceilings in each run (a shared host drifts by tens of percent within the hour, and a probe
# there is as noisy as the drift); a process reuses what it measured within HOST_REUSE_S (runs called in a loop).
HOST_REUSE_S = 120.0
# A GPU keeps its cache, held against a short probe in each run (the three streams, a matmul of half the size, a few
# samples): beyond PROBE_TOLERANCE of the probe measured with the entry, the ceilings are measured again.
PROBE_TIMER = TimerConfig(warmup_s=0.02, budget_s=0.1, min_samples=3, max_samples=20, flush_l2=False)
PROBE_TOLERANCE = 0.10
_this_process: dict[str, tuple[float, dict]] = {}  # fingerprint -> (monotonic time, entry) on the host


def stream_probe(device: torch.device) -> dict[str, float]:
    """Quick GB/s of the read, write and copy streams, on one pair of buffers."""
    buffers = StreamBuffers(device)
    return {s: measure_stream(device, s, PROBE_TIMER, buffers)["gbps"] for s in STREAMS}


def probe(device: torch.device, dtypes, sizes: dict[str, int]) -> dict[str, float]:
    """Quick figures to hold a cached entry against: the three streams and a matmul of half the entry's size."""
    return {**stream_probe(device),
            **{d: measure_matmul(device, d, PROBE_TIMER, n=max(sizes[d] // 2, 1)) for d in dtypes}}


def _drift(then: dict, now: dict) -> tuple[str, float]:
    """The figure that moved most between two probes, and by how much (relative)."""
    moves = {k: abs(now[k] / then[k] - 1) for k in now if then.get(k)}
    return max(moves.items(), key=lambda kv: kv[1]) if moves else ("", float("inf"))


def _held(device: torch.device, entry: dict, wanted: list[str]) -> tuple[dict | None, str]:
    """A GPU's cache entry if a probe now agrees with the one taken with it, else None; and what the probe found."""
    if not entry.get("probe") or not entry.get("matmul_n"):
        return None, "measured again: the cached entry has no probe to hold it against"
    if not all(s in entry.get("bandwidth", {}) and s in entry["probe"] and f"{s}_gbps" in entry for s in STREAMS):
        return None, "measured again: the cached entry has no read and write ceilings (written before schema 5)"
    have = [d for d in wanted if d in entry["peak_tflops"] and d in entry["matmul_n"]]
    what, moved = _drift(entry["probe"], probe(device, have, entry["matmul_n"]))
    if moved <= PROBE_TOLERANCE:
        return entry, f"cached entry held: a probe now is within {moved:.0%} of its own ({what})"
    return None, f"measured again: a probe now differs by {moved:.0%} from the cached entry's ({what})"


def _cached(device: torch.device, path: Path, current: dict, wanted: list[str],
            use_file: bool) -> tuple[dict | None, str]:
    if not use_file:
        when, entry = _this_process.get(fingerprint(device), (None, None))
        if entry is not None and time.monotonic() - when <= HOST_REUSE_S:
            return entry, f"measured by this process {time.monotonic() - when:.0f} s ago (host: each run measures)"
        return None, "measured: the host measures its ceilings in each run"
    entry = _read_entry(path, current)
    return _held(device, entry, wanted) if entry is not None else (None, "measured: nothing cached for these versions")


def _kept(path: Path, current: dict) -> tuple[dict | None, str]:
    entry = _read_entry(path, current)
    if entry is None:
        return None, f"measured: none kept in {path.parent} yet ({HOST_KEEP_ENV})"
    if "levels" not in entry:
        return None, f"measured: the entry kept in {path.parent} has no cache-level ceilings (before schema 7)"
    if any("passes" not in (found.get("bandwidth") or {}).get("read", {}) for found in entry["levels"].values()):
        return None, f"measured: the entry kept in {path.parent} has cache-level ceilings of one pass a call"
    return entry, f"kept in {path.parent} ({HOST_KEEP_ENV}), measured {entry['measured_at']}: not measured again"


def _measure_dtype(device: torch.device, dtype: str, timer: TimerConfig, with_probe: bool) -> tuple:
    """(the best TFLOP/s of the matmul sizes tried, its size, the probe's figure at half that size or None)."""
    tflops, n = best_matmul(device, dtype, timer)
    return tflops, n, (measure_matmul(device, dtype, PROBE_TIMER, n=max(n // 2, 1)) if with_probe else None)


def ceilings(device: torch.device, dtypes=("float32",), refresh: bool = False, cached: bool | None = None,
             levels: bool = True) -> Ceilings:
    """Measured ceilings of `device` for `dtypes`. With `cached` (default: on a GPU), from the cache file unless
    `refresh`, the entry is from other torch/CUDA/driver versions, a probe now differs from the entry's by more
    than PROBE_TOLERANCE, or a dtype is missing (then it is measured and added); without (default on the host),
    measured in each run and reused within one process for HOST_REUSE_S. Figures measured on a busy machine (the
    conditions' load warnings) serve this run, with a warning, and are never kept for another. On the host, where
    PHASEBENCH_HOST_CEILINGS names a folder (and `cached` is not False), the ceilings kept there are used without a
    probe, and measured and kept there (with their load warning, if any) when there are none yet. Without `levels` (no
    row will be judged at a cache level) the host measures none, and what it measures is kept for no other call."""
    gpu = device.type == "cuda"
    keep_dir = None if gpu or cached is False else host_keep_dir()
    partial = not (levels or gpu or keep_dir is not None)  # the host's levels left out: keep it for no other call
    use_file, current, name, wanted = gpu if cached is None else cached, versions(device), device_name(device), list(
        dict.fromkeys(dtypes))
    path = (keep_dir or cache_dir()) / f"ceilings-{fingerprint(device)}.json"
    timer = CEILING_TIMER if gpu else HOST_CEILING_TIMER
    with on_device(device):
        if refresh:
            entry, checked = None, "measured: --refresh"
        elif keep_dir is not None:
            entry, checked = _kept(path, current)
        else:
            entry, checked = _cached(device, path, current, wanted, use_file)
        source = "cached" if entry is not None else "measured"
        if entry is None:
            def measure_all():
                streams = measure_streams(device, timer if gpu else HOST_STREAM_TIMER)
                levels = {} if partial else measure_levels(device, HOST_LEVEL_TIMER)
                figures = {d: _measure_dtype(device, d, timer, use_file) for d in wanted}
                return streams, levels, figures, stream_probe(device) if use_file else {}

            (streams, levels, figures, probed), provenance = with_provenance(device, measure_all)
            entry = {"device": name, "kind": device.type, "peak_gbps": streams["copy"]["gbps"], "levels": levels,
                     **{f"{s}_gbps": streams[s]["gbps"] for s in STREAMS}, "bandwidth": streams,
                     "peak_tflops": {d: f[0] for d, f in figures.items()},
                     "matmul_n": {d: f[1] for d, f in figures.items()}, **provenance, "added": {},
                     "versions": current, "probe": {**probed, **{d: f[2] for d, f in figures.items()}}}
        missing = [d for d in wanted if d not in entry["peak_tflops"]]
        for dtype in missing:
            (tflops, n, probed), entry["added"][dtype] = with_provenance(device, lambda d=dtype: _measure_dtype(
                device, d, timer, use_file))
            entry["peak_tflops"][dtype], entry.setdefault("matmul_n", {})[dtype] = tflops, n
            entry.setdefault("probe", {})[dtype] = probed
    busy = load_warnings(entry.get("conditions") or {}) if source == "measured" else []
    busy += [w for d in missing for w in load_warnings(entry["added"][d].get("conditions") or {})]
    if busy and keep_dir is None:
        checked += "; kept for no other run: measured on a busy machine"
    elif (source == "measured" or missing) and not (partial and source == "measured"):
        _keep(device, path, entry, use_file or keep_dir is not None)
    age = round(max(0.0, time.time() - entry["measured_at_epoch"]), 3)
    result = Ceilings(name, device.type, float(entry["peak_gbps"]),
                      {k: float(v) for k, v in entry["peak_tflops"].items()}, datasheet_for(name),
                      source=source, measured_at=entry["measured_at"], age_s=age,
                      duration_s=float(entry.get("duration_s") or 0.0),
                      conditions=dict(entry.get("conditions") or {}), added=dict(entry["added"]), checked=checked,
                      matmul_n=dict(entry.get("matmul_n") or {}), read_gbps=float(entry["read_gbps"]),
                      write_gbps=float(entry["write_gbps"]), bandwidth=dict(entry["bandwidth"]),
                      levels=dict(entry.get("levels") or {}), caches=cache_sizes(device))
    result.warnings = (datasheet_warnings(result) + level_warnings(result.levels, memory_figures(result))
                       + load_warnings(result.conditions))
    for dtype, provenance in result.added.items():
        result.warnings += load_warnings(provenance.get("conditions") or {}, f"matmul {dtype}")
    return result


def _keep(device: torch.device, path: Path, entry: dict, use_file: bool) -> None:
    """The entry to the cache file (a GPU's), or for this process only (the host's)."""
    if not use_file:
        _this_process[fingerprint(device)] = (time.monotonic(), entry)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")  # runs side by side never read half a file
        partial.write_text(json.dumps(entry, indent=1))
        os.replace(partial, path)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
