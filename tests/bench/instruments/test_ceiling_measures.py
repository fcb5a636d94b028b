"""What the ceilings are measured with: the read, write and copy streams, their sizes, and the matmul's sizing."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from phasebench.bench.instruments import ceiling_measures
from phasebench.bench.instruments.memory.host_cache import HostCaches
from phasebench.bench.instruments.timing import TimerConfig, Timing

CPU = torch.device("cpu")
QUICK = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=2, max_samples=2, flush_l2=False)


def test_the_host_streams_are_sized_from_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(ceiling_measures, "last_level_cache", lambda: (480 << 20, "L3 480 MiB"))
    assert ceiling_measures.stream_bytes(CPU) == 4 * (480 << 20)  # a 480 MiB L3 would hold a 256 MiB copy
    monkeypatch.setattr(ceiling_measures, "last_level_cache", lambda: (8 << 20, "L3 8 MiB"))
    assert ceiling_measures.stream_bytes(CPU) == 256 << 20


def test_each_stream_moves_what_it_counts():
    """A reduction reads the whole buffer (dot: two halves, an odd element left; a GEMV: the buffer's whole rows of
    GEMV_COLUMNS floats and its vector), a fill writes it, a copy reads and writes it; each call computes what it
    should (against float64), so the bytes counted are the bytes moved."""
    buffers = ceiling_measures.StreamBuffers(CPU, nbytes=4 * 100_003)
    buffers.src.copy_(torch.rand(100_003, generator=torch.Generator().manual_seed(7)) + 0.25)  # drawn values
    src = buffers.src.double()
    half = 50_001
    dot, moved = buffers.call("dot")
    assert moved == 4 * 2 * half and float(dot()) == pytest.approx(float(src[:half] @ src[half:2 * half]), rel=1e-4)
    total, moved = buffers.call("sum")
    assert moved == 4 * 100_003 and float(total()) == pytest.approx(float(src.sum()), rel=1e-4)
    gemv, moved = buffers.call("gemv")
    rows, columns = 100_003 // ceiling_measures.GEMV_COLUMNS, ceiling_measures.GEMV_COLUMNS
    want = src[:rows * columns].view(rows, columns) @ buffers.vector.double()
    assert moved == 4 * (rows * columns + columns) and torch.allclose(gemv().double(), want, rtol=1e-4)
    fill, moved = buffers.call("fill")
    assert moved == 4 * 100_003 and bool((fill() == 1.0).all())
    copy, moved = buffers.call("copy")
    assert moved == 2 * 4 * 100_003 and torch.equal(copy(), buffers.src)


def test_a_stream_keeps_its_fastest_kernel_and_says_which():
    found = ceiling_measures.measure_stream(CPU, "read", QUICK, ceiling_measures.StreamBuffers(CPU, 4 * 4099))
    assert set(found["kernels"]) == {"dot", "sum", "gemv"} and found["gbps"] == max(found["kernels"].values()) > 0
    assert found["kernels"][found["kernel"]] == found["gbps"] and found["buffer_bytes"] == 4 * 4099
    assert ceiling_measures.stream_kernels(CPU, "write") == ("fill",)
    with pytest.raises(ValueError, match="stream: must be one of read, write, copy"):
        ceiling_measures.stream_kernels(CPU, "scatter")


def test_each_stream_is_measured_with_its_own_provenance(monkeypatch):
    monkeypatch.setattr(ceiling_measures, "stream_bytes", lambda device: 4 * 8191)
    found = ceiling_measures.measure_streams(CPU, QUICK)
    assert list(found) == ["read", "write", "copy"]
    for stream, figures in found.items():
        assert figures["gbps"] > 0 and figures["buffer_bytes"] == 4 * 8191, stream
        assert set(figures) >= {"measured_at", "measured_at_epoch", "duration_s", "conditions", "kernel", "kernels"}
    assert found["read"]["measured_at_epoch"] <= found["write"]["measured_at_epoch"] <= found["copy"][
        "measured_at_epoch"]


def test_every_ceiling_keeps_the_best_of_its_repeats(monkeypatch):
    """One statistic for every ceiling, bandwidth and matmul alike: the least time of the samples."""
    samples = (9.0, 4.0, 7.5, 4.5, 12.0)  # ms; the best is 4.0, the median 7.5
    monkeypatch.setattr(ceiling_measures, "time_call", lambda fn, device, cfg: Timing(samples, "fake"))
    assert ceiling_measures.best_ms(Timing(samples, "fake")) == 4.0
    assert ceiling_measures.measure_matmul(CPU, "float32", QUICK, n=33) == pytest.approx(2 * 33**3 / 4.0e-3 / 1e12)
    found = ceiling_measures.measure_stream(CPU, "write", QUICK, ceiling_measures.StreamBuffers(CPU, 4 * 1001))
    assert found["gbps"] == pytest.approx(4 * 1001 / 4.0e-3 / 1e9)


def test_the_streams_resident_in_each_cache_level_are_sized_from_it(monkeypatch):
    """The host's L2 and LLC (summed over their instances) each get buffers of a third of the level, the passes of
    each level set once and used with every thread count; a host without an L3 in sysfs measures its L2 only, and a
    GPU neither (its L2 is flushed before every call)."""
    sizes, chosen = [], []

    def streams(device, cfg, nbytes, passes):
        sizes.append(nbytes)
        assert passes == {"sum": (nbytes, 1e-5)}  # the level's own passes
        return {s: {"gbps": 10.0 * len(sizes) + i} for i, s in enumerate(ceiling_measures.STREAMS)}

    monkeypatch.setattr(ceiling_measures, "measure_resident_streams", streams)
    monkeypatch.setattr(ceiling_measures, "resident_passes",
                        lambda device, nbytes: chosen.append(nbytes) or {"sum": (nbytes, 1e-5)})
    monkeypatch.setattr(ceiling_measures, "host_caches", lambda: HostCaches(3 << 20, 96 << 20, 3, "test"))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # torch's threads, then one: the faster kept
    monkeypatch.setattr(ceiling_measures, "_one_thread", lambda fn: fn())
    found = ceiling_measures.measure_levels(CPU, QUICK)
    assert sizes == [1 << 20, 1 << 20, 32 << 20, 32 << 20] and list(found) == ["l2", "llc"]
    assert chosen == [1 << 20, 32 << 20]
    assert found["llc"]["bytes"] == 96 << 20 and (found["llc"]["read_gbps"], found["llc"]["copy_gbps"]) == (40, 42)
    assert found["llc"]["bandwidth"]["read"]["threads"] == {2: 30, 1: 40}
    sizes.clear()
    monkeypatch.setattr(ceiling_measures, "host_caches", lambda: HostCaches(3 << 20, 64 << 20, 0, "no L3"))
    assert list(ceiling_measures.measure_levels(CPU, QUICK)) == ["l2"]
    assert ceiling_measures.level_bytes(torch.device("cuda")) == {}


def test_the_passes_of_a_level_are_set_with_one_thread_for_every_kernel(monkeypatch):
    """On a busy host a call whose second thread waits for a core takes a scheduler quantum, which would stop the
    doubling at one pass: the passes are set on one part, with one thread."""
    seen = []

    def passes(call_of, limit, **kw):
        call_of(1)  # what it would time: one part's call, one thread
        seen.append((torch.get_num_threads(), limit))
        return 64, 1e-5

    monkeypatch.setattr(ceiling_measures, "level_passes", passes)
    threads = torch.get_num_threads()
    found = ceiling_measures.resident_passes(CPU, 4 * 40_961)
    limit = ceiling_measures.LevelBuffers(CPU, 4 * 40_961, parts=1).max_passes
    assert found == {"sum": (64, 1e-5), "fill": (64, 1e-5), "copy": (64, 1e-5)}
    assert seen == [(1, limit)] * 3 and torch.get_num_threads() == threads


def test_a_resident_stream_keeps_its_call_the_passes_and_what_a_call_pays_to_dispatch(monkeypatch):
    """Each timed call makes the level's passes over the buffer (a sum of 40 passes reads 40 times its values), the
    bytes counted are those the passes move, and the dispatch of a near-empty call is kept beside it in 100ths of the
    call (all on fake times: no timing is asserted)."""
    buffers = ceiling_measures.LevelBuffers(CPU, 4 * 2 * 30_011, parts=2)
    buffers.src.copy_(torch.rand(buffers.src.numel(), generator=torch.Generator().manual_seed(3)) + 0.25)
    timed = []

    def time_call(fn, device, cfg):
        timed.append(fn())
        return Timing((2.5, 2.0, 3.1), "fake")

    monkeypatch.setattr(ceiling_measures, "time_call", time_call)
    monkeypatch.setattr(ceiling_measures, "empty_call_s", lambda kernel, device: 1.6e-6)
    passes = {"sum": (40, 9e-6), "fill": (40, 8e-6), "copy": (10**6, 2e-5)}  # the copy's past what the buffer allows
    read = ceiling_measures.measure_resident(CPU, "read", QUICK, buffers, passes)
    assert float(timed[0]) == pytest.approx(40 * float(buffers.src.double().sum()), rel=1e-5)
    assert (read["kernel"], read["passes"], read["bytes_per_call"]) == ("sum", 40, 40 * buffers.nbytes)
    assert read["gbps"] == pytest.approx(40 * buffers.nbytes / 2.0e-3 / 1e9)  # the best sample, 2.0 ms
    assert read["kernels"] == {"sum": read["gbps"]}
    assert (read["call_us"], read["one_pass_us"], read["empty_call_us"]) == (2000.0, 9.0, 1.6)
    assert read["overhead_pct"] == pytest.approx(100 * 1.6e-6 / 2.0e-3) and read["buffer_bytes"] == buffers.nbytes
    copy = ceiling_measures.measure_resident(CPU, "copy", QUICK, buffers, passes)
    assert copy["passes"] == buffers.max_passes and copy["bytes_per_call"] == 2 * buffers.max_passes * buffers.nbytes
    with pytest.raises(ValueError, match="stream: must be one of read, write, copy"):
        ceiling_measures.measure_resident(CPU, "scatter", QUICK, buffers, passes)


class FakeClock:
    """A clock that only the fake matmul moves: each call costs its size's time, the first call of the process
    `first_ever` more (a library's setup: cuBLAS's handle and workspace) and the first at each size `first_at_size`
    more (its heuristics or primitive)."""

    def __init__(self, first_ever: float, first_at_size: float, slow=lambda a: False):
        self.now, self.first_ever, self.first_at_size, self.slow = 0.0, first_ever, first_at_size, slow
        self.sizes: list[int] = []

    def __call__(self) -> float:
        return self.now

    def matmul(self, a, b):
        n = a.shape[0]
        self.now += (n / 4096) ** 3 * 0.1  # 2048^3 costs 12.5 ms: every size under MATMUL_CALL_S
        self.now += self.first_ever if not self.sizes else 0.0
        self.now += self.first_at_size if n not in self.sizes else 0.0
        self.now += ceiling_measures.MATMUL_CALL_S if self.slow(a) else 0.0
        self.sizes.append(n)
        return a


def test_matmul_size_is_not_fooled_by_the_first_call(monkeypatch):
    """The GPU worker's first matmul pays cuBLAS's setup: timed, it kept the size at the smallest and the peak low."""
    clock = FakeClock(first_ever=1.0, first_at_size=0.2)
    monkeypatch.setattr(ceiling_measures, "_clock", clock)
    monkeypatch.setattr(torch, "matmul", clock.matmul)
    assert ceiling_measures.matmul_size(CPU, "float32") == ceiling_measures.MATMUL_SIZES["cpu"][1]
    assert clock.sizes == [256, 256, 512, 512, 1024, 1024]  # each size called once untimed, then timed


def test_matmul_size_stops_growing_once_a_call_is_slow(monkeypatch):
    clock = FakeClock(first_ever=0.0, first_at_size=0.0,
                      slow=lambda a: a.dtype == torch.bfloat16 and a.shape[0] >= 512)  # no fast bf16 matmuls here
    monkeypatch.setattr(ceiling_measures, "_clock", clock)
    monkeypatch.setattr(torch, "matmul", clock.matmul)
    assert ceiling_measures.matmul_size(CPU, "bfloat16") == 512 and clock.sizes == [256, 256, 512, 512]
    assert ceiling_measures.matmul_size(CPU, "float32") == 2048


def test_the_real_clocks_serve_matmul_sizes_the_host_in_cpu_time_over_its_threads(monkeypatch):
    assert ceiling_measures._clock is None  # each device's own: a GPU's wall clock after a sync, the host's CPU time
    monkeypatch.setattr(time, "process_time", lambda: 12.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert ceiling_measures._now(CPU) == 3.0  # a busy host's neighbours stretch its wall clock, not its CPU time
    assert ceiling_measures._now(torch.device("cuda")) != 3.0


def test_the_matmul_ceiling_is_the_best_of_the_sizes_a_call_allows_each_on_its_share_of_the_timer(monkeypatch):
    clock = FakeClock(first_ever=0.0, first_at_size=0.0,
                      slow=lambda a: a.dtype == torch.bfloat16 and a.shape[0] >= 1024)
    monkeypatch.setattr(ceiling_measures, "_clock", clock)
    monkeypatch.setattr(torch, "matmul", clock.matmul)
    assert ceiling_measures.matmul_sizes(CPU, "bfloat16") == [256, 512, 1024]  # up to the first slow call
    # a host BLAS that peaks below its largest size (its blocking, a cache): the best size is kept, not the largest
    figures = {256: 0.11, 512: 0.43, 1024: 0.29}
    timers = []

    def measured(device, dtype, cfg, n=None):
        timers.append(cfg)
        return figures[n]

    monkeypatch.setattr(ceiling_measures, "measure_matmul", measured)
    cfg = TimerConfig(warmup_s=0.3, budget_s=0.9, min_samples=3, max_samples=50, flush_l2=False)
    assert ceiling_measures.best_matmul(CPU, "bfloat16", cfg) == (0.43, 512)
    shares = [(t.warmup_s, t.budget_s, t.min_samples) for t in timers]
    assert shares == [(pytest.approx(0.1), pytest.approx(0.3), 3)] * 3


def test_a_matmul_ceiling_is_the_best_sample_of_the_fastest_kernel_as_every_ceiling_is(monkeypatch):
    # ms; a shared host's neighbours lengthen some calls, never shorten one
    samples = {"matmul": (9.0, 4.0, 6.5, 4.5, 12.0), "onednn": (5.0, 3.2, 7.0)}
    kernels = {name: (lambda name=name: name) for name in samples}
    monkeypatch.setattr(ceiling_measures, "matmul_kernels", lambda a, b: kernels)
    monkeypatch.setattr(ceiling_measures, "time_call",
                        lambda fn, device, cfg: SimpleNamespace(samples_ms=samples[fn()]))
    tflops = ceiling_measures.measure_matmul(CPU, "float32", TimerConfig(), n=97)
    assert tflops == pytest.approx(2 * 97 ** 3 / 3.2e-3 / 1e12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_hosts_matmul_kernels_each_compute_the_product(dtype):
    gen = torch.Generator().manual_seed(5)
    a, b = (torch.randn(97, 97, generator=gen).to(ceiling_measures.TORCH_DTYPES[dtype]) for _ in range(2))
    kernels = ceiling_measures.matmul_kernels(a, b)
    assert set(kernels) == ({"matmul", "onednn"} if torch.backends.mkldnn.is_available() else {"matmul"})
    want = a.double() @ b.double()
    for out in (fn() for fn in kernels.values()):
        out = out.to_dense() if out.is_mkldnn else out
        assert (out.double() - want).abs().max() <= (1e-4 if dtype == "float32" else 0.02) * want.abs().max()
