"""Roofline ceilings measured on this machine (copy bandwidth, matmul FLOP/s per dtype), cached, with datasheets."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from .conditions import driver_version, load_warnings, watch
from .timing import TimerConfig, time_call

DATASHEET_RANGE = (0.3, 1.1)  # measured / datasheet outside this gets a warning
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    """Measured peaks of one device: copy bandwidth (read + write) and matmul TFLOP/s per dtype.

    Provenance: `source` is "measured" (in this call) or "cached"; `measured_at` (UTC ISO time),
    `age_s` (seconds since then, at the call), `duration_s` and `conditions` (see
    `conditions.watch`) describe the measurement of the bandwidth and the dtypes measured with it;
    `added` holds the same for each dtype measured later into the cache entry; `warnings` are one-line
    doubts about the figures (far from the datasheet, measured under load).
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

    def to_json(self) -> dict:
        return {"device": self.device, "kind": self.kind, "peak_gbps": self.peak_gbps,
                "peak_tflops": dict(self.peak_tflops),
                "datasheet": asdict(self.datasheet) if self.datasheet else None,
                "source": self.source, "measured_at": self.measured_at, "age_s": self.age_s,
                "duration_s": self.duration_s, "conditions": dict(self.conditions),
                "warnings": list(self.warnings), "added": {d: dict(p) for d, p in self.added.items()}}

    def roof_tflops(self, dtype: str, intensity: float) -> float:
        return min(self.peak_tflops[dtype], intensity * self.peak_gbps / 1000)

    def ridge(self, dtype: str) -> float:
        """Intensity (FLOP/B) where the bandwidth slope meets the compute ceiling."""
        return self.peak_tflops[dtype] * 1000 / self.peak_gbps

    def provenance(self) -> str:
        """One line: measured now or cached (and how long ago), when and for how long."""
        when = f"at {self.measured_at}, took {self.duration_s:.1f} s"
        if self.source == "measured":
            return f"measured now ({when})"
        return f"cached, measured {_age(self.age_s)} ago ({when})"


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


def cache_dir() -> Path:
    if os.environ.get("PHASEBENCH_CACHE"):
        return Path(os.environ["PHASEBENCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phasebench"


def _copy_size_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(min(2 << 30, free // 4))
    return 256 << 20  # far beyond the last-level cache of any host CPU


def measure_bandwidth(device: torch.device, cfg: TimerConfig) -> float:
    """GB/s of a large device copy, counting the bytes read plus the bytes written."""
    n = _copy_size_bytes(device) // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, cfg)
    return 2 * n * 4 / (timing.median_ms / 1e3) / 1e9


def measure_matmul(device: torch.device, dtype: str, cfg: TimerConfig) -> float:
    """TFLOP/s of a large square matmul in `dtype` (fp32 without TF32)."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
    timing = time_call(lambda: torch.matmul(a, b), device, cfg)
    return 2 * n**3 / (timing.median_ms / 1e3) / 1e12


CEILING_TIMER = TimerConfig(warmup_s=0.2, budget_s=1.0, min_samples=5, max_samples=200, flush_l2=False)


def on_device(device: torch.device):
    """Make `device` current: events, synchronize() and Triton launches act on the current device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def versions(device: torch.device) -> dict:
    """What the figures depend on besides the fingerprint: torch and, on CUDA, its CUDA and the GPU driver."""
    found = {"torch": torch.__version__}
    if device.type == "cuda":
        found.update(cuda=torch.version.cuda, driver=driver_version(device))
    return found


def _measure(device: torch.device, fn) -> tuple:
    """`fn()` and its provenance: when (UTC), how long and under what conditions it ran."""
    with watch(device) as conditions:
        epoch, start = time.time(), time.perf_counter()
        value = fn()
        duration = time.perf_counter() - start
    when = datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")
    return value, {"measured_at": when, "measured_at_epoch": epoch, "duration_s": round(duration, 3),
                   "conditions": conditions}


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
    checks = [("copy bandwidth", ceil.peak_gbps, sheet.peak_gbps, "GB/s")]
    checks += [(f"matmul {d}", tf, sheet.peak_tflops[d], "TFLOP/s")
               for d, tf in ceil.peak_tflops.items() if d in sheet.peak_tflops]
    low, high = DATASHEET_RANGE
    return [f"{what}: measured {got:.4g} {unit} is {got / want:.2f}x the datasheet {want:.4g} {unit} "
            f"({sheet.name}), outside {low}-{high}x" for what, got, want, unit in checks
            if not low <= got / want <= high]


def ceilings(device: torch.device, dtypes=("float32",), refresh: bool = False) -> Ceilings:
    """Measured ceilings of `device` for `dtypes`, from the cache unless `refresh`, the cache entry is from
    other torch/CUDA/driver versions, or a dtype is missing from it (then that dtype is measured and added)."""
    path = cache_dir() / f"ceilings-{fingerprint(device)}.json"
    current = versions(device)
    entry = None if refresh else _read_entry(path, current)
    source = "cached" if entry is not None else "measured"
    name = device_name(device)
    wanted = list(dict.fromkeys(dtypes))
    with on_device(device):
        if entry is None:
            def measure_all():
                gbps = measure_bandwidth(device, CEILING_TIMER)
                return gbps, {d: measure_matmul(device, d, CEILING_TIMER) for d in wanted}

            (gbps, tflops), provenance = _measure(device, measure_all)
            entry = {"device": name, "kind": device.type, "peak_gbps": gbps, "peak_tflops": tflops,
                     **provenance, "added": {}, "versions": current}
        missing = [d for d in wanted if d not in entry["peak_tflops"]]
        for dtype in missing:
            measure = functools.partial(measure_matmul, device, dtype, CEILING_TIMER)
            entry["peak_tflops"][dtype], entry["added"][dtype] = _measure(device, measure)
    if source == "measured" or missing:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(entry, indent=1))
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    age = round(max(0.0, time.time() - entry["measured_at_epoch"]), 3)
    result = Ceilings(name, device.type, float(entry["peak_gbps"]),
                      {k: float(v) for k, v in entry["peak_tflops"].items()}, datasheet_for(name),
                      source=source, measured_at=entry["measured_at"], age_s=age,
                      duration_s=float(entry.get("duration_s") or 0.0),
                      conditions=dict(entry.get("conditions") or {}), added=dict(entry["added"]))
    result.warnings = datasheet_warnings(result) + load_warnings(result.conditions)
    for dtype, provenance in result.added.items():
        result.warnings += load_warnings(provenance.get("conditions") or {}, f"matmul {dtype}")
    return result
