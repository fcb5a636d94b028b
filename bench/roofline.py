"""Roofline ceilings measured on this machine (copy bandwidth, matmul FLOP/s per dtype), cached, with datasheets."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .timing import TimerConfig, time_call

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
    """Measured peaks of one device: copy bandwidth (read + write) and matmul TFLOP/s per dtype."""

    device: str
    kind: str
    peak_gbps: float
    peak_tflops: dict[str, float] = field(default_factory=dict)
    datasheet: Datasheet | None = None

    def to_json(self) -> dict:
        return {"device": self.device, "kind": self.kind, "peak_gbps": self.peak_gbps,
                "peak_tflops": dict(self.peak_tflops),
                "datasheet": asdict(self.datasheet) if self.datasheet else None}

    def roof_tflops(self, dtype: str, intensity: float) -> float:
        return min(self.peak_tflops[dtype], intensity * self.peak_gbps / 1000)

    def ridge(self, dtype: str) -> float:
        """Intensity (FLOP/B) where the bandwidth slope meets the compute ceiling."""
        return self.peak_tflops[dtype] * 1000 / self.peak_gbps


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


def ceilings(device: torch.device, dtypes=("float32",), refresh: bool = False) -> Ceilings:
    """Measured ceilings of `device` for `dtypes`, from the cache unless `refresh` or a dtype is missing."""
    path = cache_dir() / f"ceilings-{fingerprint(device)}.json"
    cached = None
    if path.exists() and not refresh:
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
    name = device_name(device)
    with on_device(device):
        if cached is not None:
            result = Ceilings(name, device.type, float(cached["peak_gbps"]),
                              {k: float(v) for k, v in cached["peak_tflops"].items()}, datasheet_for(name))
        else:
            result = Ceilings(name, device.type, measure_bandwidth(device, CEILING_TIMER), {}, datasheet_for(name))
        missing = [d for d in dtypes if d not in result.peak_tflops]
        for dtype in missing:
            result.peak_tflops[dtype] = measure_matmul(device, dtype, CEILING_TIMER)
    if cached is None or missing:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result.to_json(), indent=1))
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    return result
