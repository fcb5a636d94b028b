"""What the ceilings are measured with: read, write and copy streams past the last-level cache (L2 on a GPU) and, on
the host, resident in its L2 and in its last-level cache (many passes a call), and square matmuls per dtype at the
sizes a call allows; each measurement with when, how long and under what load, and every one kept by the same
statistic (`best_ms`)."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone

import torch

from .conditions import watch
from .memory.host_cache import host_caches, last_level_cache
from .memory.resident_streams import LEVEL_KERNELS, LevelBuffers, empty_call_s, level_passes
from .timing import TimerConfig, Timing, time_call

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STREAMS = ("read", "write", "copy")
# What each stream is: a read is the fastest of three kernels that read every byte once (a dot of the buffer's two
# halves, a sum, a GEMV of the buffer as a matrix: BLAS and torch's own loops differ by host); a fill writes every
# byte once; a copy reads and writes every byte once and counts both.
STREAM_KERNELS = {"read": ("dot", "sum", "gemv"), "write": ("fill",), "copy": ("copy",)}
GEMV_COLUMNS = 4096  # the GEMV's matrix is the buffer as rows of this many floats (a projection's width)
HOST_STREAM_LLCS = 4  # the host's buffers are this many times the last-level cache (as the GPU flush is with L2)
LEVEL_SHARE = 3  # resident in a cache level: each of the two buffers is this fraction of it (both fit, with room)
ELEMENT = 4  # the streams run on float32 buffers
# The one statistic of every ceiling, bandwidth and matmul alike: the best of its repeats (the least time, the highest
# rate the machine showed), as STREAM reports a bandwidth. A ceiling is what the machine can do; on a shared host a
# median of a few calls reads the neighbours' load, and rows timed in a quieter moment then stand above it.
CEILING_STATISTIC = "best of the repeats (the least time: the highest rate the machine showed)"


def best_ms(timing: Timing) -> float:
    """The time a ceiling keeps from its samples (CEILING_STATISTIC)."""
    return min(timing.samples_ms)


def stream_bytes(device: torch.device) -> int:
    """Bytes of each of the two stream buffers: far past L2 on a GPU (2 GiB, or a quarter of what is free), and
    HOST_STREAM_LLCS times the host's last-level cache (at least 256 MiB)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(min(2 << 30, free // 4))
    return max(256 << 20, HOST_STREAM_LLCS * last_level_cache()[0])  # a 480 MiB L3 would hold a 256 MiB copy


def level_bytes(device: torch.device) -> dict[str, int]:
    """The host's cache levels to measure resident streams in ({"l2": bytes, "llc": bytes}, capacities summed over the
    instances the process may use); a GPU's L2 is flushed before each call, and a host without an L3 in sysfs has no
    last level to measure."""
    if device.type == "cuda":
        return {}
    caches = host_caches()
    found = {"l2": caches.l2_bytes} if caches.l2_bytes else {}
    if caches.llc_level:
        found["llc"] = caches.llc_bytes
    return found


def cache_sizes(device: torch.device) -> dict:
    """The capacities a row's footprint is held against: the host's L2 and last-level cache, a GPU's L2 (its last
    level)."""
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
        return {"l2_bytes": l2, "llc_bytes": l2, "source": "the GPU's L2 (torch device properties)"}
    caches = host_caches()
    return {"l2_bytes": caches.l2_bytes, "llc_bytes": caches.llc_bytes, "source": caches.source}


def stream_kernels(device: torch.device, stream: str) -> tuple[str, ...]:
    if stream not in STREAM_KERNELS:
        raise ValueError(f"stream: must be one of {', '.join(STREAMS)}, got {stream!r}")
    return STREAM_KERNELS[stream]


class StreamBuffers:
    """Two float32 buffers of stream_bytes each (the source read by the streams, the target they write), made once
    for every stream of one measurement and written once before any is timed, so that no timed call pays for
    first-touch page faults; `call(kernel)` is (the call, the bytes it moves). The values do not change what moves:
    a constant source costs one fill to make (torch.rand took 10 s for 1.9 GiB on a loaded 2-core host)."""

    def __init__(self, device: torch.device, nbytes: int | None = None):
        n = (nbytes or stream_bytes(device)) // ELEMENT
        self.half = n // 2
        self.src = torch.full((n,), 0.5, device=device)
        self.dst = torch.zeros_like(self.src)
        self.columns = min(GEMV_COLUMNS, n)
        self.vector = torch.full((self.columns,), 0.25, device=device)

    @property
    def nbytes(self) -> int:
        return self.src.numel() * ELEMENT

    def call(self, kernel: str):
        src, dst, half, columns = self.src, self.dst, self.half, self.columns
        matrix = src[:src.numel() // columns * columns].view(-1, columns)
        calls = {"dot": (lambda: torch.dot(src[:half], src[half:2 * half]), 2 * half * ELEMENT),
                 "sum": (lambda: src.sum(), self.nbytes),
                 "gemv": (lambda: torch.mv(matrix, self.vector), (matrix.numel() + columns) * ELEMENT),
                 "fill": (lambda: dst.fill_(1.0), self.nbytes),
                 "copy": (lambda: dst.copy_(src), 2 * self.nbytes)}
        return calls[kernel]


def measure_stream(device: torch.device, stream: str, cfg: TimerConfig, buffers: StreamBuffers | None = None,
                   kernels: tuple[str, ...] | None = None) -> dict:
    """GB/s of one stream on `buffers` (default: past the last-level cache): {"gbps": the fastest of its kernels (or
    of `kernels`, some of them: a probe times the one that was fastest before),
    "kernel": which one, "kernels": {kernel: GB/s}, "buffer_bytes": the size of each buffer}. A copy counts the bytes
    read plus written.

    Each kernel's figure is its best sample (best_ms): on a shared host a median of a few long calls reads the
    neighbours' load (the read ceiling then sat 6-23% under torch.dot's median beside it, and the rows that stream at
    that rate read above their roof)."""
    buffers = buffers or StreamBuffers(device)
    found = {}
    for kernel in kernels or stream_kernels(device, stream):
        fn, moved = buffers.call(kernel)
        found[kernel] = moved / (best_ms(time_call(fn, device, cfg)) / 1e3) / 1e9
    best = max(found, key=found.get)
    return {"gbps": found[best], "kernel": best, "kernels": found, "buffer_bytes": buffers.nbytes}


def with_provenance(device: torch.device, fn) -> tuple:
    """`fn()` and its provenance: when (UTC), how long and under what conditions it ran."""
    with watch(device) as conditions:
        epoch, start = time.time(), time.perf_counter()
        value = fn()
        duration = time.perf_counter() - start
    when = datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")
    return value, {"measured_at": when, "measured_at_epoch": epoch, "duration_s": round(duration, 3),
                   "conditions": conditions}


def measure_streams(device: torch.device, cfg: TimerConfig, streams=STREAMS, nbytes: int | None = None) -> dict:
    """Each stream's figures (measure_stream) with its own provenance, on one pair of buffers of `nbytes` each
    (default: past the last-level cache)."""
    buffers = StreamBuffers(device, nbytes)
    found = {}
    for stream in streams:
        figures, provenance = with_provenance(device, lambda s=stream: measure_stream(device, s, cfg, buffers))
        found[stream] = {**figures, **provenance}
    return found


def _one_thread(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def resident_passes(device: torch.device, nbytes: int) -> dict[str, tuple[int, float]]:
    """{kernel: (passes, seconds of its one-pass call)} of each level kernel on buffers of `nbytes` (level_passes), set
    with one thread for every thread count: on a busy host a call whose second thread waits for a core takes a
    scheduler quantum (12 ms for one pass over an L2-sized buffer, here), which would stop the doubling at one pass.
    With n threads a call then takes about 1/n of LEVEL_CALL_S or more."""
    def chosen():
        buffers = LevelBuffers(device, nbytes, parts=1)
        return {k: level_passes(lambda p, k=k: buffers.call(k, p)[0], buffers.max_passes)
                for kernels in LEVEL_KERNELS.values() for k in kernels}

    return _one_thread(chosen)


def measure_resident(device: torch.device, stream: str, cfg: TimerConfig, buffers: LevelBuffers,
                     passes: dict[str, tuple[int, float]]) -> dict:
    """GB/s of one stream resident in a cache level on `buffers` (memory.resident_streams), each call making the
    `passes` of its kernel (resident_passes): {"gbps", "kernel", "kernels", "buffer_bytes"} as measure_stream gives,
    and how the kept kernel's call was made: "passes" over the buffer in one call, "bytes_per_call", "call_us" (its
    best sample), "one_pass_us" (a one-pass call, one thread), "empty_call_us" (the same kernel over a few floats:
    what a call pays to dispatch) and "overhead_pct" (that dispatch in 100ths of the call)."""
    if stream not in LEVEL_KERNELS:
        raise ValueError(f"stream: must be one of {', '.join(STREAMS)}, got {stream!r}")
    found, calls = {}, {}
    for kernel in LEVEL_KERNELS[stream]:
        count, one_s = passes[kernel]
        fn, moved = buffers.call(kernel, min(count, buffers.max_passes))
        call_s, empty_s = best_ms(time_call(fn, device, cfg)) / 1e3, empty_call_s(kernel, device)
        found[kernel] = moved / call_s / 1e9
        calls[kernel] = {"passes": min(count, buffers.max_passes), "bytes_per_call": moved,
                         "call_us": round(call_s * 1e6, 2), "one_pass_us": round(one_s * 1e6, 2),
                         "empty_call_us": round(empty_s * 1e6, 2), "overhead_pct": round(100 * empty_s / call_s, 2)}
    best = max(found, key=found.get)
    return {"gbps": found[best], "kernel": best, "kernels": found, "buffer_bytes": buffers.nbytes, **calls[best]}


def measure_resident_streams(device: torch.device, cfg: TimerConfig, nbytes: int,
                             passes: dict[str, tuple[int, float]]) -> dict:
    """Each stream resident in a cache level (measure_resident) with its own provenance, on one pair of buffers of
    `nbytes` each, split between torch's threads as they are now."""
    buffers = LevelBuffers(device, nbytes)
    found = {}
    for stream in STREAMS:
        figures, provenance = with_provenance(device, lambda s=stream: measure_resident(device, s, cfg, buffers,
                                                                                       passes))
        found[stream] = {**figures, **provenance}
    return found


def measure_levels(device: torch.device, cfg: TimerConfig) -> dict[str, dict]:
    """The streams resident in each host cache level (level_bytes): {level: {"bytes": its capacity, "read_gbps",
    "write_gbps", "copy_gbps", "bandwidth": each stream's figures, call and provenance}}, on buffers of 1/LEVEL_SHARE
    of the level each, warm from the calls that set the passes. Each call makes passes over its buffer for about
    LEVEL_CALL_S (resident_passes), so that what one call pays to dispatch (measured and kept beside each figure)
    weighs little: one pass over the 699 KB of a 2 MiB L2 took 8 us, most of it dispatch. Each stream runs with
    torch's threads and with one, and keeps the faster ("threads" says both): on a busy host a call whose second
    thread waits for a core takes a scheduler quantum, and a kernel's threads are one more of its variants. The
    figures are the level's own, as measured; where a nearer level reads below a farther one, the rows judged there
    say so (bench.spec.roof.level_notes)."""
    found = {}
    for level, capacity in level_bytes(device).items():
        nbytes = max(capacity // LEVEL_SHARE, 64 * ELEMENT)
        passes = resident_passes(device, nbytes)
        runs = {torch.get_num_threads(): measure_resident_streams(device, cfg, nbytes, passes)}
        if torch.get_num_threads() > 1:
            runs[1] = _one_thread(lambda n=nbytes, p=passes: measure_resident_streams(device, cfg, n, p))
        streams = {}
        for s in STREAMS:
            threads = max(runs, key=lambda n, s=s: runs[n][s]["gbps"])
            streams[s] = {**runs[threads][s], "threads": {n: run[s]["gbps"] for n, run in runs.items()}}
        found[level] = {"bytes": capacity, **{f"{s}_gbps": streams[s]["gbps"] for s in STREAMS}, "bandwidth": streams}
    return found


MATMUL_SIZES = {"cuda": (1024, 8192), "cpu": (256, 2048)}  # square sizes tried, smallest to largest
MATMUL_CALL_S = 0.05  # the size grows while one call takes less than this
_clock = None  # what matmul_sizes times a call with: None for the device's own (a test gives it a clock of its own)


def host_clock() -> float:
    """The process's CPU seconds over its threads: how long a call takes on a quiet host. A busy host's wall clock
    stretches it (a 256^3 call read 50 ms on a loaded 2-core host, and the ceiling stayed at that size, at 0.5
    GFLOP/s where the kernels beside it reached 130)."""
    return time.process_time() / max(1, torch.get_num_threads())


def _now(device: torch.device) -> float:
    return (_clock or (time.perf_counter if device.type == "cuda" else host_clock))()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_sizes(device: torch.device, dtype: str) -> list[int]:
    """The square sizes, doubling from the smallest, up to the first whose one call takes MATMUL_CALL_S or more (or
    the largest size): a host without fast bfloat16 matmuls (0.3 GFLOP/s here) would spend minutes on 2048^3.

    Each size is called once untimed first: the first call at a size pays for what is set up once (the cuBLAS
    handle and workspace, the kernel's heuristics, a oneDNN primitive), which on a fresh GPU worker took more than
    MATMUL_CALL_S at 1024 and kept the ceiling at the smallest size, far under the device's peak. The host times
    the call in CPU time (host_clock), which the neighbours of a shared host do not stretch."""
    low, high = MATMUL_SIZES["cuda" if device.type == "cuda" else "cpu"]
    n, sizes = low, [low]
    while n < high:
        a = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
        torch.matmul(a, a)
        _sync(device)  # the operand's making and the warm-up call are done before the clock starts
        start = _now(device)
        torch.matmul(a, a)
        _sync(device)
        if _now(device) - start >= MATMUL_CALL_S:
            break
        n *= 2
        sizes.append(n)
    return sizes


def matmul_size(device: torch.device, dtype: str) -> int:
    """The largest of matmul_sizes."""
    return matmul_sizes(device, dtype)[-1]


def matmul_kernels(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The square matmuls a @ b that the device offers: torch.matmul (the vendor BLAS: cuBLAS, or MKL on the host),
    and on the host oneDNN's matmul where it takes the dtype (MKL's fp32 SGEMM ran 20% under it on an AMD EPYC)."""
    calls = {"matmul": lambda: torch.matmul(a, b)}
    if a.device.type == "cpu" and torch.backends.mkldnn.is_available():
        try:
            am, bm = a.to_mkldnn(), b.t().contiguous().to_mkldnn()  # mkldnn_linear multiplies by its second's .T
            torch.ops.aten.mkldnn_linear(am, bm, None)
        except RuntimeError:  # a dtype this CPU's oneDNN refuses (fp16 without avx512_fp16)
            return calls
        calls["onednn"] = lambda: torch.ops.aten.mkldnn_linear(am, bm, None)
    return calls


def measure_matmul(device: torch.device, dtype: str, cfg: TimerConfig, n: int | None = None) -> float:
    """TFLOP/s of the fastest square matmul in `dtype` (fp32 without TF32) of size `n` (default matmul_size), each
    kernel on its share of the timer and from its best sample, as every ceiling is: the least time the device took is
    what it can do."""
    n = n or matmul_size(device, dtype)
    a = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
    kernels = matmul_kernels(a, b)
    share = dataclasses.replace(cfg, warmup_s=cfg.warmup_s / len(kernels), budget_s=cfg.budget_s / len(kernels))
    fastest = min(best_ms(time_call(fn, device, share)) for fn in kernels.values())
    return 2 * n**3 / (fastest / 1e3) / 1e12


def best_matmul(device: torch.device, dtype: str, cfg: TimerConfig) -> tuple[float, int]:
    """(TFLOP/s, its size) of the fastest of the square matmuls at matmul_sizes, each measured on
    its share of the timer's warm-up and budget: a host BLAS can peak below its largest size (its blocking, a
    cache), and one size alone reads it low."""
    sizes = matmul_sizes(device, dtype)
    share = dataclasses.replace(cfg, warmup_s=cfg.warmup_s / len(sizes), budget_s=cfg.budget_s / len(sizes))
    found = {n: measure_matmul(device, dtype, share, n=n) for n in sizes}
    best = max(found, key=found.get)
    return found[best], best
