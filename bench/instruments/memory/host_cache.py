"""The host's caches, read from sysfs over the CPUs this process may use: they size the stream ceilings, make host
operands cold, and say which cache level a warm row's footprint fits."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

SYSFS_CPUS = Path("/sys/devices/system/cpu")
ASSUMED_LLC = 64 << 20  # where sysfs lists no L3 (a container without it, another OS): a large modern L3
COLD_FACTOR = 2  # bytes streamed between two reads of one operand, in last-level caches, for the read to miss it
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class HostCaches:
    """Capacities summed over the distinct cache instances the allowed CPUs use: `l2_bytes` (0: none listed), the
    last-level cache `llc_bytes` (an L3 or higher level; ASSUMED_LLC where sysfs lists none, then `llc_level` is 0),
    and one line on where the figures come from."""

    l2_bytes: int
    llc_bytes: int
    llc_level: int
    source: str


def _size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * _UNITS[text[-1]] if text and text[-1] in _UNITS else int(text)


def _instance(index: Path, cpu: int) -> tuple:
    """What tells one cache instance from another: its id, else the CPUs sharing it, else the CPU itself."""
    for name in ("id", "shared_cpu_list"):
        try:
            return name, (index / name).read_text().strip()
        except OSError:
            continue
    return "cpu", cpu


def read_caches(root: Path, cpus) -> HostCaches:
    """The caches of `cpus` under a sysfs cpu folder `root` (root/cpuN/cache/indexM): each data or unified level's
    size summed over its distinct instances (a multi-CCD EPYC lists one 32 MiB L3 per CCD)."""
    levels: dict[int, dict[tuple, int]] = {}
    for cpu in sorted(cpus):
        for index in sorted((root / f"cpu{cpu}" / "cache").glob("index*")):
            try:
                if (index / "type").read_text().strip() not in ("Data", "Unified"):
                    continue
                level, size = int((index / "level").read_text()), _size((index / "size").read_text())
            except (OSError, ValueError):
                continue
            levels.setdefault(level, {})[_instance(index, cpu)] = size
    sums = {level: sum(found.values()) for level, found in levels.items()}
    l2 = sums.get(2, 0)
    top = max((level for level in sums if level >= 3), default=None)
    where = f"{root}, {len(cpus)} allowed CPUs"
    if top is not None:
        count = len(levels[top])
        return HostCaches(l2, sums[top], top, f"L{top} {sums[top] / 2**20:g} MiB ({count} instance"
                                             f"{'s' * (count > 1)} over the allowed CPUs; {where})")
    seen = ", ".join(f"L{level} {size / 2**20:g} MiB" for level, size in sorted(sums.items())) or "no cache sizes"
    return HostCaches(l2, ASSUMED_LLC, 0, f"assumed {ASSUMED_LLC >> 20} MiB: sysfs lists no L3 ({seen}; {where})")


def allowed_cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


@functools.cache
def host_caches() -> HostCaches:
    """This process's caches (read once)."""
    return read_caches(SYSFS_CPUS, allowed_cpus())


def last_level_cache() -> tuple[int, str]:
    """(bytes, where the figure comes from) of the last-level cache, summed over its instances."""
    caches = host_caches()
    return caches.llc_bytes, caches.source


def cold_bytes() -> int:
    """How much must stream between two reads of an operand on this host for the second read to miss the cache."""
    return COLD_FACTOR * last_level_cache()[0]


@functools.cache
def _eviction_buffer(nbytes: int) -> torch.Tensor:
    # written once here: the pages of a buffer never written all map the kernel's one zero page, which stays cached
    return torch.ones(max(nbytes // 4, 1), dtype=torch.float32)


def evictor(nbytes: int | None = None) -> Callable[[], None]:
    """A call that reads `nbytes` (default cold_bytes()) of a buffer kept for the process, evicting what the host's
    caches held; timers run it before each call, outside the clock. It reads rather than writes, so that the timed
    call never pays for writing back the lines it dirtied."""
    buffer = _eviction_buffer(nbytes or cold_bytes())
    return lambda: buffer.sum()
