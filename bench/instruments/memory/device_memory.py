"""Device memory for the fit check: what the device has free, and the one-line reason when a charge exceeds it."""

from __future__ import annotations

from pathlib import Path

import torch

HEADROOM = 0.85  # leave room for the allocator, the L2 flush buffer and fragmentation
CHECK_COPIES = 2  # relative_error holds two reference-sized temporaries (the upcast output, |out - ref|)
UNKNOWN_INPUT_COPIES = 2  # an impl the check cannot inspect is charged its output plus this many inputs
GiB = 2**30


def free_bytes(device: torch.device) -> int:
    """Free device memory, counting the blocks this process's CUDA allocator caches but does not use."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: do not skip


def fit_reason(impl: str, own: int, shared: int, device: torch.device, *, resident: bool, free: int | None,
               note: str = "") -> str | None:
    """The one-line skip reason when `own` (the impl's bytes) plus, unless resident, `shared` (the case's
    inputs and reference) exceed the usable free memory; None when they fit. Any operator's check ends here."""
    need = own if resident else own + shared
    if free is None:
        free = free_bytes(device)
    if need <= HEADROOM * free:
        return None
    parts = f"{impl} {own / GiB:.1f}" + (", inputs and reference resident" if resident
                                         else f" + inputs and reference {(need - own) / GiB:.1f}")
    return (f"needs about {need / GiB:.1f} GiB ({parts}), {free / GiB:.1f} GiB free on {device} "
            f"(up to {HEADROOM:.0%} used){note}")
