"""The host's last-level cache, read from sysfs: it sizes the copy ceiling and makes host operands cold."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
ASSUMED_LLC = 64 << 20  # where sysfs says nothing (a container without it, another OS): a large modern L3
COLD_FACTOR = 2  # bytes streamed between two reads of one operand, in last-level caches, for the read to miss it
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * _UNITS[text[-1]] if text and text[-1] in _UNITS else int(text)


@functools.cache
def last_level_cache() -> tuple[int, str]:
    """(bytes, where the figure comes from) of the largest data or unified cache level of CPU 0."""
    best = None
    try:
        for index in SYSFS.glob("index*"):
            kind = (index / "type").read_text().strip()
            if kind in ("Data", "Unified"):
                level, size = int((index / "level").read_text()), _size((index / "size").read_text())
                best = max(best or (0, 0), (level, size))
    except (OSError, ValueError):
        best = None
    if best is None:
        return ASSUMED_LLC, f"assumed {ASSUMED_LLC >> 20} MiB (no cache sizes in {SYSFS})"
    return best[1], f"L{best[0]} {best[1] >> 20} MiB ({SYSFS})"


def cold_bytes() -> int:
    """How much must stream between two reads of an operand on this host for the second read to miss the cache."""
    return COLD_FACTOR * last_level_cache()[0]


@functools.cache
def _eviction_buffer(nbytes: int) -> torch.Tensor:
    return torch.empty(max(nbytes // 4, 1), dtype=torch.int32)


def evictor(nbytes: int | None = None) -> Callable[[], None]:
    """A call that writes `nbytes` (default cold_bytes()) of a buffer kept for the process, evicting what the
    host's caches held; timers run it before each call, outside the clock."""
    buffer = _eviction_buffer(nbytes or cold_bytes())
    return lambda: buffer.fill_(1)
