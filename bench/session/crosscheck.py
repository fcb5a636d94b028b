"""Cross-checks of the harness against independent tools: torch.utils.benchmark and numpy (`python -m`)."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.utils.benchmark as tbench

from ...kernels import prepare
from ..instruments.roofline import CEILING_TIMER, measure_bandwidth, measure_matmul
from ..instruments.timing import time_cpu
from ..ops.attention.cases import parse_shape
from ..ops.attention.inputs import make_inputs
from ..sweep.runner import CPU_TIMER


def harness_vs_torch_benchmark(shape: str, impl: str, rounds: int = 5) -> tuple[float, float]:
    """Median ms of one call by phasebench's CPU timer and by torch.utils.benchmark.Timer.

    The two alternate `rounds` times and each reports the median of its rounds, so a drift of
    the machine (a shared host, frequency changes) falls on both alike.
    """
    case = parse_shape(shape, "float32")
    x = make_inputs(case, torch.device("cpu"))
    call = prepare(x.q, x.k, x.v, impl=impl, causal=case.causal)
    theirs = tbench.Timer("run()", globals={"run": call.run}, num_threads=torch.get_num_threads())
    ours_ms, theirs_ms = [], []
    for _ in range(rounds):
        ours_ms.append(time_cpu(call.run, CPU_TIMER).median_ms)
        theirs_ms.append(theirs.blocked_autorange(min_run_time=0.3).median * 1e3)
    return float(np.median(ours_ms)), float(np.median(theirs_ms))


def numpy_copy_gbps(nbytes: int = 256 << 20, reps: int = 10) -> float:
    src = np.random.rand(nbytes // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / float(np.median(times)) / 1e9


def numpy_matmul_tflops(n: int = 2048, reps: int = 5) -> float:
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / float(np.median(times)) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="q_len=1,kv_len=512,batch=2,model=llama-3-8b")
    parser.add_argument("--impl", nargs="+", default=["naive", "flash"])
    args = parser.parse_args()
    cpu = torch.device("cpu")
    for impl in args.impl:
        ours, theirs = harness_vs_torch_benchmark(args.shape, impl)
        print(f"{impl:<6} phasebench {ours:.4f} ms  torch.utils.benchmark {theirs:.4f} ms  "
              f"difference {100 * (ours - theirs) / theirs:+.1f}%")
    ours_bw, np_bw = measure_bandwidth(cpu, CEILING_TIMER), numpy_copy_gbps()
    print(f"copy   phasebench {ours_bw:.2f} GB/s  numpy {np_bw:.2f} GB/s  "
          f"difference {100 * (ours_bw - np_bw) / np_bw:+.1f}%")
    ours_mm, np_mm = measure_matmul(cpu, "float32", CEILING_TIMER), numpy_matmul_tflops()
    print(f"matmul phasebench {1000 * ours_mm:.1f} GFLOP/s  numpy {1000 * np_mm:.1f} GFLOP/s  "
          f"difference {100 * (ours_mm - np_mm) / np_mm:+.1f}%")


if __name__ == "__main__":
    main()
