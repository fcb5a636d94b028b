"""The host's caches from sysfs over the allowed CPUs (fake trees of awkward topologies), and the evictor that reads."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.instruments.memory import host_cache

MiB = 1 << 20


def cache(root, cpu: int, index: int, level: int, kind: str, size: str, shared: str | None, ident: int | None):
    folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
    folder.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared),
                        ("id", ident)):
        if value is not None:
            (folder / name).write_text(f"{value}\n")


def core(root, cpu: int, l2: str = "1024K", l3: tuple[str, str, int] | None = None, *, ids: bool = True):
    """One CPU: a private L1d, L1i and L2, and an L3 (size, shared list, id) when given."""
    cache(root, cpu, 0, 1, "Data", "32K", str(cpu), cpu if ids else None)
    cache(root, cpu, 1, 1, "Instruction", "32K", str(cpu), cpu if ids else None)
    cache(root, cpu, 2, 2, "Unified", l2, str(cpu), cpu if ids else None)
    if l3 is not None:
        size, shared, ident = l3
        cache(root, cpu, 3, 3, "Unified", size, shared, ident if ids else None)


def test_two_l3_instances_are_summed_once_each(tmp_path):
    """A two-CCD slice: CPUs 0-3 share one 32 MiB L3, CPUs 4-7 another; each L3 counts once, each L2 once."""
    for cpu in range(8):
        core(tmp_path, cpu, l3=("32768K", "0-3" if cpu < 4 else "4-7", cpu // 4))
    found = host_cache.read_caches(tmp_path, set(range(8)))
    assert (found.llc_bytes, found.l2_bytes, found.llc_level) == (64 * MiB, 8 * MiB, 3)
    assert "L3 64 MiB (2 instances" in found.source


def test_only_the_instances_the_allowed_cpus_use_count(tmp_path):
    """Pinned to CPUs 2 and 5 of that host: both L3s still count; pinned to 0-1, one."""
    for cpu in range(8):
        core(tmp_path, cpu, l3=("32768K", "0-3" if cpu < 4 else "4-7", cpu // 4))
    assert host_cache.read_caches(tmp_path, {2, 5}).llc_bytes == 64 * MiB
    one = host_cache.read_caches(tmp_path, {0, 1})
    assert (one.llc_bytes, one.l2_bytes) == (32 * MiB, 2 * MiB) and "1 instance over" in one.source


def test_without_ids_the_shared_cpu_lists_tell_instances_apart(tmp_path):
    """An older kernel without `id`: three CPUs of one 30 MiB L3 (the list shared), a fourth with its own."""
    for cpu in range(4):
        core(tmp_path, cpu, l2="2M", l3=("30M", "0-2" if cpu < 3 else "3", 0), ids=False)
    found = host_cache.read_caches(tmp_path, set(range(4)))
    assert (found.llc_bytes, found.l2_bytes) == (60 * MiB, 8 * MiB)


def test_a_host_without_an_l3_says_so_and_assumes_one(tmp_path):
    """No L3 in sysfs: the L2s are summed as L2, never taken for the last level, and the source names it."""
    for cpu in range(3):
        core(tmp_path, cpu, l2="1M")
    found = host_cache.read_caches(tmp_path, {0, 1, 2})
    assert (found.llc_bytes, found.llc_level, found.l2_bytes) == (host_cache.ASSUMED_LLC, 0, 3 * MiB)
    assert "sysfs lists no L3" in found.source and "L2 3 MiB" in found.source
    empty = host_cache.read_caches(tmp_path / "nothing", {0})
    assert (empty.llc_bytes, empty.l2_bytes) == (host_cache.ASSUMED_LLC, 0) and "no cache sizes" in empty.source


def test_this_host_reports_a_cache():
    size, source = host_cache.last_level_cache()
    assert size >= 1 << 20 and source and host_cache.cold_bytes() == host_cache.COLD_FACTOR * size


def test_the_evictor_reads_its_buffer_and_writes_nothing():
    """Before each cold call the evictor reads COLD_FACTOR x a (here small) buffer: its bytes are the same after, and
    the call returns their sum, so every element was read."""
    evict = host_cache.evictor(4 * 100_003)
    buffer = host_cache._eviction_buffer(4 * 100_003)
    before = buffer.clone()
    total = evict()
    assert torch.equal(buffer, before) and float(total) == pytest.approx(float(before.double().sum()))
    assert float(buffer.min()) == 1.0  # written once when made: no page left on the kernel's shared zero page
