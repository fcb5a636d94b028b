"""Contention probe: injected readings decide deterministically; a real busy process gets a timed window flagged."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from phasebench.bench.instruments import contention
from phasebench.bench.instruments.contention import (
    ContentionProbe,
    HostReading,
    judge_gpu,
    judge_host,
    process_cpu_s,
    snapshot,
    summary_warning,
    without_companions,
)
from phasebench.bench.instruments.readings import gpu_reading, host_reading
from phasebench.bench.instruments.readings.gpu_reading import GpuReading, parse_smi_gpu, parse_smi_pids
from phasebench.bench.instruments.timing import TimerConfig, time_call

HZ = 100
CPU = torch.device("cpu")


def reading(wall, busy, own, wait=None, cpus=2, running=None, own_running=None, threads=2, steal=0):
    return HostReading(wall_s=wall, cpus=cpus, busy_ticks=busy, steal_ticks=steal, own_cpu_s=own, wait_s=wait,
                       procs_running=running, own_running=own_running, torch_threads=threads)


# ---- decisions on injected readings ----------------------------------------------------------------


def test_busy_other_process_is_named_with_its_share():
    # 0.73 s: we used 0.94 CPU-s, the CPUs were busy 145 ticks, our threads waited 0.51 s
    reason, stats = judge_host(reading(10.0, 1000, 3.0, wait=2.0), reading(10.73, 1145, 3.94, wait=2.51), hz=HZ)
    assert reason.startswith("busy host: other processes used 0.70 of 2 CPUs")
    assert "waited 0.70 s per s" in reason
    assert stats["other_cores"] == pytest.approx(0.51 / 0.73, abs=1e-3)
    assert stats["own_cores"] == pytest.approx(0.94 / 0.73, abs=1e-3)


def test_time_taken_by_the_hypervisor_is_named():
    reason, stats = judge_host(reading(7.0, 400, 1.0, wait=0.5, cpus=3, steal=20),
                               reading(7.43, 529, 1.73, wait=0.71, cpus=3, steal=66), hz=HZ)
    assert "other processes used 1.30 of 3 CPUs while sampling (1.07 of it taken by the hypervisor)" in reason
    assert stats["steal_cores"] == pytest.approx(0.46 / 0.43, abs=1e-3)


def test_quiet_window_is_not_flagged():
    reason, stats = judge_host(reading(5.0, 700, 1.0, wait=0.3), reading(5.37, 774, 1.73, wait=0.304), hz=HZ)
    assert reason == "" and stats["wait_cores"] < 0.02


def test_other_work_that_left_cpus_free_is_not_contention():
    # another process used a whole core, but we barely ran and never waited for a CPU
    reason, stats = judge_host(reading(1.0, 50, 0.2, wait=0.1), reading(1.31, 81, 0.21, wait=0.1), hz=HZ)
    assert reason == "" and stats["other_cores"] > 0.9


def test_tick_rounding_cannot_make_other_processes_appear_in_a_short_window():
    # 0.047 s window, 3 ticks more than our own time: within the rounding slack, so only the wait is named
    reason, _ = judge_host(reading(2.0, 10, 0.5, wait=0.0), reading(2.047, 22, 0.59, wait=0.03), hz=HZ)
    assert reason.startswith("busy host: our threads waited") and "other processes" not in reason


def test_without_schedstat_saturated_cpus_with_others_busy_are_flagged():
    before = reading(3.0, 100, 1.0)
    reason, _ = judge_host(before, reading(3.61, 222, 1.61), hz=HZ)  # ours 1.0 core, others 1.0 core
    assert reason.startswith("busy host: other processes used")
    quiet, _ = judge_host(before, reading(3.61, 165, 0.99), hz=HZ)  # others ~0.07 core, CPUs not saturated
    assert quiet == ""
    alone, _ = judge_host(before, reading(3.61, 226, 2.21), hz=HZ)  # we saturate the CPUs, others ~0.08 core
    assert alone == ""


def test_without_any_cpu_figures_runnable_tasks_at_both_ends_decide():
    flagged, stats = judge_host(reading(0.0, None, 0.0, running=5, own_running=3),
                                reading(0.013, None, 0.01, running=4, own_running=2), hz=HZ)
    assert flagged.startswith("busy host: 2 other tasks were runnable") and stats["others_runnable"] == 2
    once, _ = judge_host(reading(0.0, None, 0.0, running=4, own_running=2),
                         reading(0.013, None, 0.01, running=2, own_running=2), hz=HZ)
    assert once == ""


def test_our_own_oversubscription_is_explained():
    reason, _ = judge_host(reading(1.0, 300, 2.0, wait=0.0, threads=5),
                           reading(1.29, 343, 2.43, wait=0.23, threads=5), hz=HZ)
    assert "torch uses 5 threads on 2 CPUs" in reason


def test_gpu_shared_and_thermal_throttle_are_flagged_but_power_cap_is_not():
    shared = GpuReading(sm_mhz=1755, max_sm_mhz=1980, throttle=0x4, other_pids=(4711, 815))
    reasons, stats = judge_gpu(GpuReading(throttle=0x1, other_pids=()), shared)
    assert reasons == ["shared GPU: 2 other compute processes on the GPU (pid 815, 4711)"]
    assert stats["throttle"] == "0x5"
    hot = GpuReading(sm_mhz=1185, max_sm_mhz=1980, throttle=0x40 | 0x4, other_pids=())
    reasons, _ = judge_gpu(None, hot)
    assert reasons == ["GPU throttled: hw thermal (SM 1185 of 1980 MHz)"]
    assert judge_gpu(None, None) == ([], {})


def test_nvidia_smi_output_is_parsed_and_unknowns_become_none():
    assert parse_smi_gpu("1410, 1980, 0x0000000000000044\n") == (1410.0, 1980.0, 0x44)
    assert parse_smi_gpu("[N/A], 1980, [N/A]\n") == (None, 1980.0, None)
    assert parse_smi_gpu("") == (None, None, None)
    assert parse_smi_pids("3301\n 97\n\nNo running processes found\n") == [3301, 97]


FAKE_SMI = """#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  *clocks_event_reasons*) exit 6 ;;  # an older driver: only the throttle name is known
  *query-gpu*) echo "1185, 1980, 0x0000000000000044" ;;
  *query-compute-apps*) echo 4242 ;;
esac
"""


def test_nvidia_smi_path_flags_a_shared_throttled_gpu_and_reuses_the_last_reading(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(log=log))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpu_reading, "_nvml", lambda: None)
    monkeypatch.setattr(gpu_reading, "nvml_index", lambda device: 3)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    probe = ContentionProbe(torch.device("cuda"))
    for _ in range(2):
        with probe.watch() as watch:
            pass
        assert watch.noisy and watch.stats["gpu_source"] == "nvidia-smi" and watch.stats["sm_mhz"] == 1185
        assert "shared GPU: 1 other compute processes on the GPU (pid 4242)" in watch.reason
        assert "GPU throttled: hw thermal (SM 1185 of 1980 MHz)" in watch.reason
    calls = log.read_text().splitlines()
    assert all(call.endswith("-i 3") for call in calls)
    assert sum("clocks_throttle_reasons" in call for call in calls) == 3  # the second "before" was reused


# ---- end-of-run warning and snapshots --------------------------------------------------------------


def rows_with(noise):
    return [{"noisy": n, "noise_reason": r} for n, r in noise]


def test_summary_counts_noisy_rows_and_names_the_commonest_cause():
    rows = rows_with([(True, "busy host: other processes used 0.93 of 2 CPUs while sampling, x"),
                      (False, ""), (True, "busy host: our threads waited 0.41 s per s for a CPU"),
                      (True, "GPU throttled: hw thermal (SM 990 of 1980 MHz)"), (None, ""), (False, "")])
    line = summary_warning(rows)
    assert line.startswith("3 of 5 timed rows were noisy (busy host, GPU throttled), e.g. other processes used 0.93")
    assert "re-run" in line and "\n" not in line
    frame = pd.DataFrame(rows).astype({"noisy": object})
    frame.loc[4, "noisy"] = math.nan  # an untimed row as the results store holds it
    assert summary_warning(frame) == line


def test_summary_is_none_without_noisy_rows():
    assert summary_warning(rows_with([(False, ""), (None, "")])) is None
    assert summary_warning(pd.DataFrame({"noisy": [False, False], "noise_reason": ["", ""]})) is None
    assert summary_warning([]) is None
    assert summary_warning([{"noisy": True, "noise_reason": ""}]).startswith("1 of 1 timed rows were noisy")


def test_snapshot_never_raises_and_reports_the_host():
    snap = snapshot(CPU)
    assert set(snap) == {"time", "host", "gpu"} and snap["gpu"] == {}
    host = snap["host"]
    assert {"load_1m", "running", "cpu_count", "cpus_allowed", "torch_threads", "running_others"} <= set(host)
    assert host["cpu_count"] >= host["cpus_allowed"] >= 1
    assert all(str(os.getpid()) not in name for name in host["running_others"])
    if not torch.cuda.is_available():  # a CUDA device named on a machine without one: still no exception
        assert isinstance(snapshot(torch.device("cuda")), dict)


def test_watch_keeps_its_verdict_when_the_block_raises():
    probe = ContentionProbe(CPU)
    with pytest.raises(RuntimeError, match="inside"), probe.watch() as watch:
        raise RuntimeError("inside the window")
    assert watch.stats["window_s"] >= 0 and isinstance(watch.noisy, bool)
    assert (watch.reason == "") == (not watch.noisy)


# ---- which CPUs are watched, and a probe that fails ------------------------------------------------


def proc_stat(busy_per_cpu: list[int]) -> str:
    """A /proc/stat with one busy figure per CPU (user ticks; 1000 idle each) and its aggregate line."""
    lines = [f"cpu  {sum(busy_per_cpu)} 0 0 {1000 * len(busy_per_cpu)} 0 0 0 0 0 0"]
    lines += [f"cpu{i} {b} 0 0 1000 0 0 0 0 0 0" for i, b in enumerate(busy_per_cpu)]
    return "\n".join([*lines, "intr 1 2 3", "procs_running 2", "procs_blocked 0"]) + "\n"


def test_busy_time_is_read_on_the_cpus_watched_or_the_whole_machine(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(proc_stat([11, 200, 3000, 40000]))
    monkeypatch.setattr(host_reading, "PROC_STAT", stat)
    pinned = host_reading.read_host({0})
    whole = host_reading.read_host(whole=True)
    assert (pinned.busy_ticks, pinned.cpus) == (11, 1) and (whole.busy_ticks, whole.cpus) == (43211, 4)
    assert whole.procs_running == 2


def test_the_cpus_that_share_the_memory_are_those_of_our_numa_nodes_else_all(tmp_path):
    for node, cpus in (("node0", "0-1,4"), ("node1", "2-3,5-7")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    assert host_reading.memory_cpus({0}, tmp_path) == {0, 1, 4}
    assert host_reading.memory_cpus({1, 6}, tmp_path) == set(range(8))
    assert host_reading.memory_cpus({0}, tmp_path / "none") is None  # unknown: the whole machine
    assert host_reading.memory_cpus({9}, tmp_path) is None  # a CPU no node lists: unsure, the whole machine
    assert host_reading.parse_cpu_list("0-2,8,10-11") == {0, 1, 2, 8, 10, 11}


def test_a_pinned_case_sees_a_neighbour_on_another_core(tmp_path, monkeypatch):
    """Pinned to CPU 0, a case timed on the host shares the memory with a process busy on CPU 1: counted on every CPU
    (here the whole machine: no NUMA nodes listed), the window is noisy; counted on CPU 0 alone, it was unseen."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(host_reading, "PROC_STAT", stat)
    monkeypatch.setattr(contention, "memory_cpus", lambda: None)
    hz = os.sysconf("SC_CLK_TCK")
    verdicts = {}
    for name, probe in (("all", ContentionProbe(CPU)), ("pinned", ContentionProbe(CPU, cpus={0}))):
        stat.write_text(proc_stat([500, 500]))
        with probe.watch() as watch:
            time.sleep(0.2)
            stat.write_text(proc_stat([500, 500 + hz]))  # the neighbour: a whole second of CPU 1 in the window
        verdicts[name] = watch
    assert verdicts["all"].noisy and "other processes used" in verdicts["all"].reason
    assert verdicts["all"].stats["cpus"] == 2 and not verdicts["pinned"].noisy


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_probe_that_raises_marks_the_window_noisy_with_its_reason(monkeypatch, when):
    real, calls = contention.read_host, []

    def failing(*args, **kwargs):
        calls.append(1)
        if (when == "before") == (len(calls) == 1):
            raise OSError("no /proc here")
        return real(*args, **kwargs)

    monkeypatch.setattr(contention, "read_host", failing)
    with ContentionProbe(CPU).watch() as watch:
        pass
    assert watch.noisy and watch.reason == ("contention unknown: the contention probe failed (OSError: no /proc "
                                            "here)") and watch.stats["probe_error"] == "no /proc here"
    from phasebench.bench.instruments.contention import summary_warning

    assert "contention unknown" in summary_warning([{"noisy": True, "noise_reason": watch.reason}])


# ---- real windows on this host ---------------------------------------------------------------------


def timed_matmul(probe, device=CPU, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(257, 251, generator=g).to(device), torch.randn(251, 263, generator=g).to(device))
    with probe.watch() as watch:
        time_call(lambda: a @ b, device, TimerConfig(warmup_s=0.05, budget_s=0.3, max_samples=100_000))
    return watch


@pytest.fixture
def busy_process():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # let it start spinning
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_busy_process_gets_the_timed_window_flagged(busy_process):
    watch = timed_matmul(ContentionProbe(CPU), seed=11)
    assert watch.noisy, watch.stats
    assert watch.reason.startswith("busy host: other processes used"), watch.reason
    assert watch.stats["wait_cores"] > 0 and watch.stats["other_cores"] > 0


STREAMER = """
import numpy as np
a = np.ones(64 << 20, dtype=np.uint8)
b = np.empty_like(a)
while True:
    np.copyto(b, a)
"""


@pytest.fixture
def memory_streamer():
    proc = subprocess.Popen([sys.executable, "-c", STREAMER])
    try:
        time.sleep(0.5)  # let it allocate and start streaming
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_single_threaded_case_beside_a_memory_streamer_is_flagged(memory_streamer):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread of ours never waits for a CPU on a 2-core host: the caches are shared
    try:
        watch = timed_matmul(ContentionProbe(CPU), seed=13)
    finally:
        torch.set_num_threads(threads)
    assert watch.noisy, watch.stats
    assert watch.reason.startswith("busy host: other processes used"), watch.reason
    assert watch.stats["other_cores"] >= 0.25 and watch.stats["own_cores"] <= 1.2


def test_cpu_share_alone_flags_only_a_host_device():
    before = HostReading(wall_s=0.0, cpus=2, busy_ticks=0, steal_ticks=0, own_cpu_s=0.0, wait_s=0.0)
    after = HostReading(wall_s=1.0, cpus=2, busy_ticks=190, steal_ticks=0, own_cpu_s=1.0, wait_s=0.01)
    shared, _ = judge_host(before, after, hz=100, shares_memory=True)
    assert shared.startswith("busy host: other processes used 0.90 of 2 CPUs") and "memory bandwidth" in shared
    assert judge_host(before, after, hz=100, shares_memory=False)[0] == ""  # a GPU case: our threads never waited


def test_a_quiet_host_mostly_gets_no_flag():
    probe = ContentionProbe(CPU)
    verdicts = []
    for seed in range(9):
        if len(verdicts) == 5:
            break
        with probe.watch() as idle:
            time.sleep(0.2)
        if idle.stats.get("other_cores_low", 0) > 0:
            continue  # this shared host is running someone else's work: not a quiet window
        verdicts.append(timed_matmul(probe, seed=seed).noisy)
    if len(verdicts) < 3:
        pytest.skip("other work kept this shared host busy; no quiet windows to judge")
    assert sum(verdicts) < len(verdicts) / 2, verdicts


@pytest.mark.cuda
def test_cuda_window_reads_the_gpu_where_it_can():
    device = torch.device("cuda")
    probe = ContentionProbe(device)
    watch = timed_matmul(probe, device, seed=3)
    assert "window_s" in watch.stats and isinstance(watch.noisy, bool)
    gpu = snapshot(device)["gpu"]
    if gpu:  # pynvml or nvidia-smi answered
        assert gpu["max_sm_mhz"] and gpu["max_sm_mhz"] > 0
        assert os.getpid() not in (gpu["other_pids"] or [])
        assert watch.stats["gpu_source"] == gpu["source"]


# ---- a co-runner started on purpose (phasebench interference) is not contention --------------------------------


def with_companion(r: HostReading, companion_s: float) -> HostReading:
    return HostReading(**{**r.__dict__, "companion_cpu_s": companion_s, "companions": 1})


def test_a_co_runner_counts_as_ours_and_our_waiting_is_its_doing():
    # 1 s: we used 0.9 CPU-s and our co-runner 1.0, the CPUs were busy 190 ticks, our threads waited 0.8 s
    before, after = reading(0.0, 0, 0.0, wait=0.0), reading(1.0, 190, 0.9, wait=0.8)
    alone, _ = judge_host(before, after, hz=HZ)
    assert alone.startswith("busy host: other processes used 1.00 of 2 CPUs")  # without it: the co-runner is "other"
    reason, stats = judge_host(with_companion(before, 5.0), with_companion(after, 6.0), hz=HZ)
    assert reason == "" and stats["companion_cores"] == pytest.approx(1.0) and stats["other_cores"] == 0
    # a third process on top of the two: flagged by its CPU share, never by our waiting
    busy, stats = judge_host(with_companion(before, 5.0), with_companion(reading(1.0, 240, 0.9, wait=0.8), 6.0),
                             hz=HZ)
    assert busy.startswith("busy host: other processes used 0.50 of 2 CPUs") and "waited" not in busy


def test_co_runner_pids_are_not_other_gpu_processes():
    assert without_companions((815, 4711), (4711,)) == (815,)
    assert without_companions((815, 4711), ()) == (815, 4711)
    # a container's nvidia-smi lists host pids: the co-runner, started after us, is taken as the highest
    assert without_companions((90001, 90007, 95000), (312,)) == (90001, 90007)
    reasons, stats = judge_gpu(None, GpuReading(other_pids=(4711,)), companions=(4711,))
    assert reasons == [] and stats["gpu_other_pids"] == []


def test_the_cpu_time_of_a_process_is_read_from_its_threads():
    """Over a window (how the probe uses it): a live thread's time counts, a thread that ended earlier does not."""
    before, spent = process_cpu_s(os.getpid()), time.process_time()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert process_cpu_s(os.getpid()) - before == pytest.approx(time.process_time() - spent, abs=0.05)
    assert process_cpu_s(2 ** 22 + 7) == 0.0  # beyond pid_max: gone
