"""Hold the host's read, write and copy ceilings against torch.dot, torch.mv, fill_ and copy_ on 2 GiB buffers, in
one process, interleaved over rounds (`python notes/ceilings_check.py [rounds]`); prints every round and the load."""

from __future__ import annotations

import statistics
import sys
import time

import torch
from phasebench.bench.instruments import roofline
from phasebench.bench.instruments.conditions import watch
from phasebench.bench.instruments.memory.host_cache import last_level_cache

CPU = torch.device("cpu")
GIB = 1 << 30
REPS = 5


def gbps(fn, nbytes: int) -> str:
    """GB/s of REPS calls after one warm-up call: the median's, and the best call's (as the ceilings report)."""
    fn()
    times = []
    for _ in range(REPS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return f"{nbytes / statistics.median(times) / 1e9:6.2f} (best {nbytes / min(times) / 1e9:6.2f})"


def reference_streams() -> dict[str, str]:
    n = 2 * GIB // 4
    src, dst = torch.rand(n), torch.empty(n)
    half, width = n // 2, 4096
    matrix, x = src.view(n // width, width), torch.rand(width)
    found = {"torch.dot": gbps(lambda: torch.dot(src[:half], src[half:]), 2 * half * 4),
             "torch.mv": gbps(lambda: torch.mv(matrix, x), n * 4),
             "fill_": gbps(lambda: dst.fill_(1.0), n * 4),
             "copy_": gbps(lambda: dst.copy_(src), 2 * n * 4)}
    return found


def ceiling_streams() -> dict[str, str]:
    ceil = roofline.ceilings(CPU, ("float32",), refresh=True)
    return {"read": f"{ceil.read_gbps:6.2f}", "write": f"{ceil.write_gbps:6.2f}", "copy": f"{ceil.copy_gbps:6.2f}"}


def main(rounds: int) -> None:
    print(f"{roofline.cpu_model()}, {torch.get_num_threads()} threads; LLC {last_level_cache()[1]}")
    for index in range(rounds):
        order = (ceiling_streams, reference_streams) if index % 2 == 0 else (reference_streams, ceiling_streams)
        for measure in order:
            with watch(CPU) as seen:
                figures = measure()
            share = seen.get("others_cpu_share")
            load = f"others used {share:.0%} of the CPU" if share is not None else "load unknown"
            print(f"round {index + 1} {measure.__name__:<17} " + "  ".join(f"{k} {v}" for k, v in
                                                                           figures.items()) + f"  GB/s ({load})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
