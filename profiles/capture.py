"""Profile capture of phasebench cases: nsys around the measured region, or torch.profiler, into tables."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from . import nsys, torch_trace
from .nvtx_ranges import mirror_to_torch_profiler
from .summary import attribute, summarize

TOOLS = ("nsys", "torch")


def nsys_path() -> str | None:
    return shutil.which("nsys")


def ncu_path() -> str | None:
    """Nsight Compute's CLI: on the PATH, else where the CUDA toolkit or a standalone install puts it."""
    import glob

    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


NCU_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats")


def ncu_command(ncu: str, report_stem: Path, program: list[str], kernels: str | None = None) -> list[str]:
    """`ncu` on the launches a program makes between cudaProfilerStart and Stop, clocks left as they are (the
    card's settings are never changed), a few sections rather than the full set, kernels matching a regex."""
    sections = [arg for name in NCU_SECTIONS for arg in ("--section", name)]
    only = ["--kernel-name", f"regex:{kernels}"] if kernels else []
    return [ncu, "--profile-from-start", "off", "--clock-control", "none", *sections, *only, "--force-overwrite",
            "-o", str(report_stem), *program]


def nsys_command(report_stem: Path, program: list[str]) -> list[str]:
    """`nsys profile` that records CUDA and NVTX between cudaProfilerStart and Stop, then exports SQLite."""
    return ["nsys", "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--export=sqlite", "--force-overwrite=true", "-o", str(report_stem), *program]


def run_nsys(report_stem: Path, program: list[str]) -> Path:
    """Run `program` under nsys; returns the SQLite export (exported afterwards if nsys did not)."""
    proc = subprocess.run(nsys_command(report_stem, program), stdin=subprocess.DEVNULL)
    sqlite = report_stem.with_suffix(".sqlite")
    rep = report_stem.with_suffix(".nsys-rep")
    if not sqlite.exists() and rep.exists():
        subprocess.run(["nsys", "export", "--type=sqlite", f"--output={sqlite}", "--force-overwrite=true", str(rep)],
                       stdin=subprocess.DEVNULL, check=False)
    if not sqlite.exists():
        raise RuntimeError(f"nsys produced no SQLite export (exit status {proc.returncode}); see its output above")
    return sqlite


@contextlib.contextmanager
def cuda_profiler_range():
    """cudaProfilerStart/Stop around the block: what `nsys --capture-range=cudaProfilerApi` records."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


@contextlib.contextmanager
def torch_profiler_capture(trace_path: Path, cuda: bool):
    """torch.profiler (CPU, plus CUDA where present) around the block, ranges mirrored as record_function."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    mirror_to_torch_profiler(True)
    try:
        with profile(activities=activities) as prof:
            yield
    finally:
        mirror_to_torch_profiler(False)
    prof.export_chrome_trace(str(trace_path))


def read_profile(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernels, ranges) of an nsys SQLite export or a torch.profiler Chrome trace."""
    path = Path(path)
    if path.suffix == ".sqlite":
        return nsys.read_kernels(path), nsys.read_nvtx(path)
    return torch_trace.read_kernels(path), torch_trace.read_ranges(path)


def _flat(df: pd.DataFrame) -> pd.DataFrame:
    """Tables as files: the nesting path becomes text so CSV and parquet both hold it."""
    out = df.copy()
    if "nvtx_path" in out:
        out["nvtx_path"] = [" > ".join(p) if isinstance(p, (tuple, list)) else "" for p in out["nvtx_path"]]
    return out


def write_tables(profile_path: Path, out_dir: Path) -> pd.DataFrame:
    """Parse a profile, write kernels / ranges / summary as parquet and CSV beside it, return the summary."""
    kernels, ranges = read_profile(profile_path)
    kernels = kernels.assign(case_key=attribute(kernels))
    summary = summarize(kernels, ranges)
    for name, table in (("kernels", kernels), ("ranges", ranges), ("summary", summary)):
        flat = _flat(table)
        flat.to_parquet(out_dir / f"{name}.parquet", index=False)
        flat.to_csv(out_dir / f"{name}.csv", index=False)
    return summary


def format_summary(summary: pd.DataFrame) -> str:
    """Per (case, impl): kernel count, kernel time, range wall time, L2 flush kernels and launch overhead, in µs."""
    if summary.empty:
        return "(no timed ranges found in the profile)"
    def shape(r) -> str:
        if r.op in ("linear", "qlinear"):
            return f"m{r.m} n{r.n} k{r.k}" + (f" {r.scheme}" if r.op == "qlinear" else "")
        return f"b{r.batch} h{r.q_heads}/{r.kv_heads} q{r.q_len} k{r.kv_len} d{r.head_dim}"

    view = pd.DataFrame({
        "op": summary["op"], "impl": summary["impl"], "phase": summary["phase"],
        "shape": [shape(r) for r in summary.itertuples()],
        "ranges": summary["ranges"], "kernels": summary["kernel_count"],
        "kernel us": (summary["kernel_time_ns"] / 1e3).round(1), "wall us": (summary["wall_ns"] / 1e3).round(1),
        "l2 flush us": (summary["flush_kernel_ns"] / 1e3).round(1),  # the flush kernels' GPU time
        "overhead us": (summary["launch_overhead_ns"] / 1e3).round(1),
    })
    return view.to_string(index=False)
