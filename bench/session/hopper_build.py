"""Compiles every Triton kernel of phasebench for sm_90 ahead of time: registers, spills, shared memory, wgmma."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.util
import inspect
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

from .hopper_variants import _MODULES, Variant, _label, variants  # noqa: F401  (_label: the tests')

H200_SHARED_BYTES = 232448  # 227 KiB of shared memory per block on Hopper (opt-in maximum)

# Variants allowed to spill registers, by fnmatch pattern on Build.name, each with why it stays.
SPILL_ALLOWED: dict[str, str] = {
    "split_kv_kernel * rows128 * w4 s*": "4-warp tiles serve decode (16 rows, no spill); the autotuner keys on group "
                                         "and q_len, so at 128 verify rows they race the clean 8-warp N64/N128 tiles",
    "split_kv_kernel * rows64 * w4 s*": "as at 128 rows: 64 verify rows are timed against the 8-warp tiles too",
    "split_kv_kernel * D256 rows16 * N64 w4 s2": "8 B each way at head dim 256 only (keyed on BLOCK_D): N64 w4 s3, "
                                                 "N64 w8 s2 and N32 w4 s3 serve D256 without spills",
    "splitk_gemv_kernel bf16 M16 split M16 N128 K64 w4 s4": "4 B each way with Triton 3.6 only, at 72 registers: "
                                                            "a ptxas local-memory choice, not register pressure",
    "split_kv_kernel * N256 w8 s2": "widest decode tile, clean at D128 x 16 rows; at D256 or 128 rows it also "
                                    "overruns shared memory, so the autotuner drops it there",
    "split_kv_kernel bf16 D128 rows16 seqlens page256 N128 w8 s3": "8/4 B at 80 registers with Triton 3.9 (a ptxas "
                                                                   "local-memory choice, not register pressure); the "
                                                                   "N64, N32 and N256 tiles read pages of 256 clean",
    "split_kv_kernel fp32 D128 rows16 seqlens page16 N64 w4 s2": "fp32 (FMA dots, not a GPU target dtype) at pages "
                                                                 "of 16: 24/16 B at 128 registers with Triton 3.9 "
                                                                 "(clean on 3.6); its 8-warp tile reads them clean",
}

# Variants allowed past the shared memory limit: the autotuner drops a config that raises
# OutOfResources at its first launch, so a list may keep tiles that only fit the 16-bit dtypes.
SHARED_ALLOWED: dict[str, str] = {
    "split_kv_kernel * D256 * N128 w8 s3": "dropped at head dim 256 (OutOfResources at its first launch); the "
                                           "N64 and N32 tiles fit there",
    "split_kv_kernel * N256 w8 s2": "dropped at head dim 256 and at 128 verify rows; fits at D128 x 16 rows",
}

_LOG = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


@dataclass
class Build:
    """What ptxas and the compiled metadata say about one variant."""

    name: str
    kernel: str
    config: str
    dtype: str
    flags: str
    source: str
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    shared: int | None = None
    mma: str | None = None  # wgmma, mma (Ampere mma.sync), fma (no tensor core) or none (no dot)
    seconds: float = 0.0
    error: str | None = None


# contiguous inner strides are 1 at launch, which the JIT turns into a constant
_UNIT = {"stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_xk", "stride_wk", "stride_on", "stride_dn",
         "stride_in", "stride_dr", "stride_pk"}
_DIVISIBLE = {"D", "N", "K", "total", "DV", "DR"}  # multiples of 16 in every model shape (head dims, hidden sizes)


def _source(fn, v: Variant):
    """The ASTSource the JIT would build for this launch: unit strides constant, aligned pointers and strides."""
    from triton.compiler import ASTSource

    signature, constexprs, attrs = {}, dict(v.constexprs), {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in _UNIT:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = v.types.get(name, "i32")
            if signature[name].startswith("*") or name in _DIVISIBLE or name.startswith("stride_"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    params = inspect.signature(ASTSource).parameters
    if "constexprs" in params:  # Triton >= 3.3 (3.6 and 3.9 alike)
        return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    # older Triton: constants by index, constexprs left out of the signature
    index = {name: i for i, name in enumerate(fn.arg_names)}
    return ASTSource(fn=fn, signature={index[k]: t for k, t in signature.items() if t != "constexpr"},
                     constants={index[k]: c for k, c in constexprs.items()})


def _mma(ptx: str) -> str:
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if "mma.sync" in ptx:
        return "mma"
    return "fma" if "fma.rn.f32" in ptx else "none"


def _init_worker(cache_dir: str) -> None:
    # must precede the first import of triton in this process: @triton.jit decides at definition time
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9 warns when unset; 1 is what launches use


def compile_variant(v: Variant, arch: int = 90) -> Build:
    """Compile one variant for sm_{arch}; errors are returned, not raised."""
    import triton
    from triton.backends.compiler import GPUTarget

    from ...kernels.attention import triton_decode, triton_prefill
    from ...kernels.linear import triton_linear
    from ...kernels.mla import triton_mla
    from ...kernels.moe import triton_moe
    from ...kernels.qlinear import triton_qlinear

    fn = {"triton_prefill": triton_prefill, "triton_decode": triton_decode, "triton_linear": triton_linear,
          "triton_qlinear": triton_qlinear, "triton_mla": triton_mla,
          "triton_moe": triton_moe}[_MODULES[v.kernel]].__dict__[v.kernel]
    build = Build(v.name, v.kernel, v.config, v.dtype, v.flags, v.source)
    start = time.perf_counter()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(_source(fn, v), target=GPUTarget("cuda", arch, 32),
                                    options={"num_warps": v.num_warps, "num_stages": v.num_stages})
    except Exception as err:  # a compile error is a result to report
        build.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
    else:
        text = log.getvalue()
        regs, spills = _REGS.search(text), _LOG.search(text)
        build.registers = int(regs.group(1)) if regs else None
        if spills:
            build.stack, build.spill_stores, build.spill_loads = map(int, spills.groups())
        build.shared = int(kernel.metadata.shared)
        build.mma = _mma(kernel.asm.get("ptx", ""))
    build.seconds = round(time.perf_counter() - start, 2)
    return build


def find_ptxas() -> str | None:
    """The ptxas Triton would use: TRITON_PTXAS_PATH, the one in the Triton wheel, or one on PATH."""
    for var in ("TRITON_PTXAS_BLACKWELL_PATH", "TRITON_PTXAS_PATH"):
        if os.environ.get(var) and os.path.isfile(os.environ[var]):
            return os.environ[var]
    spec = importlib.util.find_spec("triton")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for name in ("ptxas-blackwell", "ptxas"):
            path = Path(root) / "backends" / "nvidia" / "bin" / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return shutil.which("ptxas")


def build_all(arch: int = 90, jobs: int = 2, full: bool = False) -> list[Build]:
    """Compile all variants in `jobs` fresh processes with a throwaway Triton cache."""
    if jobs < 1:
        raise ValueError(f"jobs: must be at least 1, got {jobs}")
    cache = tempfile.mkdtemp(prefix="phasebench-hopper-")
    try:
        todo = variants(full)
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_init_worker,
                                 initargs=(cache,)) as pool:
            # the heavy attention kernels first, so the two workers finish together
            order = sorted(todo, key=lambda v: v.kernel not in ("prefill_kernel", "split_kv_kernel"))
            return list(pool.map(compile_variant, order, [arch] * len(order)))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _allowed(name: str, allow: dict[str, str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allow)


def problems(builds: list[Build]) -> list[str]:
    """One line per compile error, spill or shared-memory overrun that no allow-list entry covers, and per
    autotuned launch (kernel, dtype, flags) left with no config that fits: its launch would fail."""
    found, fits = [], {}
    for b in builds:
        group = (b.kernel, b.dtype, b.flags, b.source)
        fits.setdefault(group, False)
        if b.error:
            found.append(f"{b.name}: compile error: {b.error}")
            continue
        fits[group] |= b.shared is not None and b.shared <= H200_SHARED_BYTES
        if (b.spill_stores or b.spill_loads) and not _allowed(b.name, SPILL_ALLOWED):
            found.append(f"{b.name}: spills {b.spill_stores} B stores, {b.spill_loads} B loads ({b.registers} regs)")
        if b.shared is not None and b.shared > H200_SHARED_BYTES and not _allowed(b.name, SHARED_ALLOWED):
            found.append(f"{b.name}: {b.shared} B shared memory, above the H200's {H200_SHARED_BYTES}")
    for (kernel, dtype, flags, source), ok in fits.items():
        if not ok and source == "autotune":
            found.append(f"{kernel} {dtype} {flags}: no config fits in {H200_SHARED_BYTES} B of shared memory")
    return found


def table(builds: list[Build]) -> str:
    """A Markdown table of the builds, one row each."""
    rows = ["| kernel | config | dtype | flags | regs | spill st/ld (B) | shared (B) | MMA | s |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for b in builds:
        if b.error:
            rows.append(f"| {b.kernel} | {b.config} | {b.dtype} | {b.flags} | error: {b.error} | | | | {b.seconds} |")
            continue
        spill = f"{b.spill_stores}/{b.spill_loads}" if b.spill_stores is not None else "?"
        rows.append(f"| {b.kernel} | {b.config} | {b.dtype} | {b.flags} | {b.registers} | {spill} | {b.shared} "
                    f"| {b.mma} | {b.seconds} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the builds and problems here")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for (90)")
    parser.add_argument("--jobs", type=int, default=2, help="compile processes")
    parser.add_argument("--full", action="store_true", help="every config in every dtype and head dim")
    args = parser.parse_args(argv)
    if find_ptxas() is None:
        print("no ptxas found (the Triton wheel carries one under backends/nvidia/bin)", file=sys.stderr)
        return 2
    cache = tempfile.mkdtemp(prefix="phasebench-hopper-")
    _init_worker(cache)  # this process imports triton too, to read the kernels' config lists
    import triton

    start = time.perf_counter()
    builds = build_all(args.arch, args.jobs, args.full)
    found = problems(builds)
    print(table(builds))
    print(f"\n{len(builds)} variants for sm_{args.arch} with Triton {triton.__version__} "
          f"in {time.perf_counter() - start:.1f} s, {len(found)} problems")
    for line in found:
        print("PROBLEM", line)
    shutil.rmtree(cache, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "arch": args.arch,
                                         "builds": [asdict(b) for b in builds], "problems": found}, indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
