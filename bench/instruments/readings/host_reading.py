"""Readings of the host for the contention probe: busy ticks of the CPUs watched (/proc/stat), our threads' run-queue
wait (schedstat), runnable tasks, the CPU time of given processes, and which CPUs share the memory."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..memory.host_cache import allowed_cpus

PROC_STAT = Path("/proc/stat")
NUMA_NODES = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class HostReading:
    """One look at the host: wall clock, busy ticks of our CPUs, our CPU time, our threads' run-queue wait."""

    wall_s: float
    cpus: int  # how many CPUs the busy ticks are summed over
    busy_ticks: int | None = None  # summed over the CPUs watched (those this process may run on, or more)
    steal_ticks: int | None = None
    own_cpu_s: float = 0.0
    wait_s: float | None = None  # run-queue wait of our threads, None where schedstat is unreadable
    procs_running: int | None = None  # runnable tasks on the whole host, this reader included
    own_running: int | None = None  # of which our threads
    torch_threads: int = 1
    companion_cpu_s: float = 0.0  # CPU time of the co-runner processes we started on purpose (interference)
    companions: int = 0  # how many there are


def parse_cpu_list(text: str) -> set[int]:
    """A sysfs CPU list ("0-3,8,10-11") as a set."""
    found: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


def memory_cpus(allowed: set[int] | None = None, nodes: Path | None = None) -> set[int] | None:
    """The CPUs that share the memory with the `allowed` ones (default: this process's): every CPU of the NUMA nodes
    they sit on; None (the whole machine) where sysfs lists no node holding them. Work on any of them takes the
    memory bandwidth and the last-level cache from a case timed on the host, pinned or not."""
    allowed = allowed_cpus() if allowed is None else allowed
    found: set[int] = set()
    try:
        for node in (nodes or NUMA_NODES).glob("node[0-9]*"):
            cpus = parse_cpu_list((node / "cpulist").read_text())
            if cpus & allowed:
                found |= cpus
    except (OSError, ValueError):
        return None
    return found if found >= allowed else None


def _proc_stat(cpus: set[int] | None) -> tuple[int | None, int | None, int | None, int]:
    """Busy and steal ticks summed over `cpus` (None: every CPU listed), procs_running, and how many CPUs were
    summed, from /proc/stat."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None, None, None, len(cpus or ())
    busy = steal = counted = 0
    running = None
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and (cpus is None or int(name[3:]) in cpus):
            v = [int(x) for x in rest.split()]
            # user nice system idle iowait irq softirq steal: idle and iowait are not busy
            busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            steal += v[7]
            counted += 1
        elif name == "procs_running":
            running = int(rest)
    return busy, steal, running, counted


def _own_threads() -> tuple[float | None, int | None]:
    """Our threads' summed run-queue wait (s) and how many of them are runnable now."""
    wait_ns, running, readable = 0, 0, False
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None, None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            running += stat[stat.rindex(")") + 2] == "R"
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                wait_ns += int(f.read().split()[1])
            readable = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile, or a kernel without schedstat
    return (wait_ns / 1e9 if readable else None), running


def process_cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of process `pid` (schedstat, ns), else its utime + stime (ticks); 0 when
    it is gone."""
    total, readable = 0, False
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                readable = True
            except (OSError, ValueError, IndexError):
                continue
    if readable:
        return total / 1e9
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def read_host(cpus: set[int] | None = None, companions: tuple[int, ...] = (), whole: bool = False) -> HostReading:
    """A look at the host over `cpus` (default: those this thread may run on; `whole`: every CPU); the CPU time of
    `companions` (pids of co-runners started on purpose) is kept apart, so that it never counts as others'."""
    cpus = None if whole else allowed_cpus() if cpus is None else cpus
    wait_s, own_running = _own_threads()
    busy, steal, running, counted = _proc_stat(cpus)
    return HostReading(wall_s=time.perf_counter(), cpus=counted, busy_ticks=busy, steal_ticks=steal,
                       own_cpu_s=time.process_time(), wait_s=wait_s, procs_running=running,
                       own_running=own_running, torch_threads=torch.get_num_threads(),
                       companion_cpu_s=sum(process_cpu_s(pid) for pid in companions), companions=len(companions))


def running_others(limit: int = 3, exclude: tuple[int, ...] = ()) -> list[str]:
    """User processes other than this one (and `exclude`) that are runnable now, as 'name (pid N)'."""
    found = []
    me = os.getpid()
    with contextlib.suppress(OSError):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            close = stat.rindex(")")
            fields = stat[close + 2:].split()
            ours = int(pid) == me or int(pid) in exclude
            if not ours and fields[0] == "R" and fields[1] != "2":  # ppid 2: kernel threads
                name = " ".join(stat[stat.index("(") + 1:close].split())  # a name may hold any character
                found.append(f"{name} (pid {pid})")
            if len(found) >= limit:
                break
    return found
