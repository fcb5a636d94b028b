"""`phasebench interference` on the host: every hybrid chunk and spatial mode gets its row, the rows round-trip through
the loader; the share of a window the co-runner covers, the co-runners, their placement, the modes and bad input on
their own; the GPU paths under `cuda`. How much a prefill stretches the decode, how much a protection saves and what
chunking does to the tail and to TTFT are timings: `pytest bench --expectations` and the verb's output report them."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import time

import pytest
import torch
from phasebench.analysis import load_interference
from phasebench.bench.cli.main import main
from phasebench.bench.instruments.contention import ContentionProbe
from phasebench.bench.instruments.roofline import device_name
from phasebench.bench.phases.interference import corunner
from phasebench.bench.phases.interference.corunner import (
    CoRunnerError,
    Placement,
    PrefillSpec,
    ProcessCoRunner,
    allowed_cpus,
    covered_share,
    place_host,
    split_cpus,
)
from phasebench.bench.phases.interference.run_interference import (
    HOST_MODEL,
    InterferenceConfig,
    Mode,
    Session,
    Window,
    mode_rows,
    plan_modes,
    run_interference,
)
from phasebench.bench.spec.interference_schema import COVERED_MIN, INTERFERENCE_COLUMNS
from phasebench.bench.spec.models import DecoderConfig

# the host preset (hidden 512, 2 layers): big enough that both sides' ops use both cores (a hidden-256 decoder's
# single-thread-sized ops left the two on a core each, stretch 1.28 on a quiet host)
TINY = HOST_MODEL
SMALL_MODEL = DecoderConfig(hidden=64, intermediate=96, layers=2, q_heads=2, kv_heads=1, head_dim=32, vocab=50,
                            name="interference-small")
CPU = torch.device("cpu")
LARGE, SMALL = 128, 16  # prompt tokens: a prefill of tens of ms, and one of a few
CHUNK = 48  # the hybrid form's chunk: 3 iterations of the large prompt (the last one shorter), more than the small
SPATIAL = {("alone", "alone"), ("colocated", "process"), ("colocated", "threads split, unpinned"),
           ("protected", "disjoint cores")}


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    """`phasebench interference` on the host: a small and a large prompt beside two decode batches, two rounds
    of short windows (the modes' order turned each round, so a burst of other work on this shared host lands on
    every mode alike); its printed output and the rows it wrote."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("disjoint cores need 2 CPUs")
    out, printed, progress = tmp_path_factory.mktemp("interference"), io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(progress):
        status = main(["interference", "--model", TINY, "--prompt", str(SMALL), str(LARGE), "--batch", "1", "3",
                       "--context", "97", "--window", "0.1", "--rounds", "2", "--chunk", str(CHUNK), "whole",
                       "--arrivals", "2", "--device", "cpu", "--out", str(out)])
    assert status == 0, progress.getvalue()[-2000:]
    return out, printed.getvalue(), progress.getvalue(), load_interference(out)


def _row(rows, batch, prompt, mode):
    found = rows[(rows["batch"] == batch) & (rows["prompt"] == prompt) & (rows["mode"] == mode)]
    assert len(found) == 1, (batch, prompt, mode)
    return found.iloc[0]


@pytest.mark.slow
def test_every_batch_prompt_and_mode_gets_one_ok_row(host_run):
    out, _, _, every = host_run
    assert list(every.columns[:len(INTERFERENCE_COLUMNS)]) == list(INTERFERENCE_COLUMNS)
    assert (every["device_name"] == device_name(CPU)).all()  # as result rows name the device
    rows = every[every["mode"] != "hybrid"]
    assert len(rows) == 2 * 2 * len(SPATIAL) and (rows["layers"] == 2).all() and (rows["rounds"] == 2).all()
    assert (rows["status"] == "ok").all(), rows[["mode", "reason"]]
    assert set(zip(rows["mode"], rows["mechanism"], strict=True)) == SPATIAL
    assert (rows["samples"] >= 3 * 2).all() and (rows["decode_ms"] > 0).all()
    assert (rows["decode_p10_ms"] <= rows["decode_ms"]).all()
    # a p90 from 10 samples or more, blank below (one in ten above it needs ten)
    blank = rows["decode_p90_ms"].isna() & (rows["samples"] < 10)
    assert ((rows["decode_ms"] <= rows["decode_p90_ms"]) | blank).all()
    alone = rows[rows["mode"] == "alone"]
    assert (alone["stretch"] == 1).all() and (alone["prefill_slowdown"] == 1).all()
    beside = rows[rows["mode"] != "alone"]
    # the share of the worst window the looped prefill covered, and at least one whole iteration inside; a row under
    # COVERED_MIN says so in its reason (its stretch understates co-location), one at or above it does not
    assert ((beside["covered"] > 0) & (beside["covered"] <= 1)).all() and (beside["prefill_samples"] >= 1).all()
    short = beside["covered"] < COVERED_MIN
    assert (beside["reason"].str.contains("of a timed window") == short).all(), beside[["covered", "reason"]]
    assert rows.loc[rows["mode"] == "alone", "covered"].isna().all()
    assert (beside["prefill_ms"] > 0).all()
    _check_itl_and_whole_model(rows)
    assert (rows["itl_p50_ms"] == rows["decode_ms"]).all()
    split = rows[rows["mechanism"].isin(["disjoint cores", "threads split, unpinned"])]
    assert (split["decode_threads"] + split["prefill_threads"] <= len(os.sched_getaffinity(0))).all()
    protected = rows[rows["mode"] == "protected"]
    assert set(protected["decode_cpus"]).isdisjoint(set(protected["prefill_cpus"]))
    control = rows[rows["mechanism"] == "threads split, unpinned"]  # the threads of disjoint cores, no pinning
    assert (control["decode_cpus"] == "all").all() and (control["prefill_cpus"] == "all").all()
    assert control["decode_threads"].tolist() == protected["decode_threads"].tolist()


def _check_itl_and_whole_model(rows):
    """The ITL's statistics in order (a percentile its samples do not support is blank, the tail the max of N), and
    each user's tokens/s from the mean ITL of the whole (2-layer) model."""
    for row in rows.itertuples():
        itl = [v for v in (row.itl_p50_ms, row.itl_p90_ms, row.itl_p99_ms, row.itl_max_ms) if v == v]
        assert itl == sorted(itl) and row.itl_mean_ms <= row.itl_max_ms
        assert (row.samples >= 100) == (row.itl_p99_ms == row.itl_p99_ms) and (row.samples >= 10) == \
            (row.itl_p90_ms == row.itl_p90_ms)
        assert row.itl_tail == ("p99" if row.samples >= 100 else f"max of {row.samples}")
    assert (rows["itl_mean_ms"] > 0).all() and (rows["decode_only_ms"] > 0).all()
    assert (rows["whole_model"] == "all 2 layers").all() and (rows["model_layers"] == 2).all()
    assert rows["tokens_per_s_per_user"].tolist() == pytest.approx((1e3 / rows["itl_mean_ms"]).tolist())


@pytest.mark.slow
def test_every_batch_prompt_and_chunk_gets_one_hybrid_row(host_run):
    _, _, progress, every = host_run
    rows = every[every["mode"] == "hybrid"].set_index(["batch", "prompt", "chunk"])
    assert len(rows) == 2 * 2 * 2 and (rows["rounds"] == 2).all()
    for batch in (1, 3):
        skipped = rows.loc[(batch, SMALL, str(CHUNK))]
        assert skipped["status"] == "skipped"
        assert skipped["reason"] == f"chunk {CHUNK} is more than the prompt's {SMALL} tokens"
    ok = rows[rows["status"] == "ok"]
    assert len(ok) == 6, every[["mode", "chunk", "reason"]]
    _check_itl_and_whole_model(ok)
    chunked = ok.xs(str(CHUNK), level="chunk")
    assert chunked["iterations"].tolist() == [3, 3] and chunked["chunk_tokens"].tolist() == [CHUNK, CHUNK]
    whole = ok.xs("whole", level="chunk")
    assert (whole["iterations"] == 1).all() and (whole["chunk_cost"] == 1).all()
    assert whole.index.get_level_values("prompt").tolist() == whole["chunk_tokens"].tolist()
    assert (ok["samples"] == 2 * ok["iterations"]).all()  # every iteration of both arrivals
    # TTFT: the median arrival's iterations; the decode users made batch tokens in each of them
    # (a whole prompt's one iteration: the TTFT median and the ITL p50 are the same number, computed two ways)
    slack = 1e-9 * ok["ttft_ms"]
    assert (ok["ttft_ms"] >= ok["itl_p50_ms"] - slack).all() and (ok["ttft_max_ms"] >= ok["ttft_ms"] - slack).all()
    assert ok["decode_tokens_per_s"].tolist() == pytest.approx(
        (ok.index.get_level_values("batch") * ok["iterations"] * 1e3 / ok["ttft_ms"]).tolist())
    assert ok["chunk_cost"].tolist() == pytest.approx(
        [r.ttft_ms / whole.loc[(b, p), "ttft_ms"] for (b, p, _), r in zip(ok.index, ok.itertuples(), strict=True)])
    assert (ok["prefill_alone_ms"] > 0).all()
    assert (ok["noise_reason"].fillna("") != "").tolist() == ok["noisy"].tolist()  # the probe watched each arrival
    assert (ok["others_cores"] >= 0).all()
    assert f"hybrid round 2/2 prompt {LARGE} batch 3: decode-only" in progress


@pytest.mark.slow
def test_what_was_printed_is_what_loads_back(host_run):
    out, printed, progress, rows = host_run
    assert f"round 2/2 prompt {LARGE} batch 3: alone" in progress
    lines = printed.splitlines()
    split = lines.index("Spatial sharing: the decode step beside a looped prefill (ITL in ms over the decode steps)")
    hybrid = [line.split() for line in lines[:split] if line.split()[:1] in (["1"], ["3"])]
    spatial = [line.split() for line in lines[split:] if line.split()[:1] in (["1"], ["3"])]
    # batch prompt chunk iterations arrivals samples decode_only mean p50 tail tail_of (p99, or max of N)
    # slowest_pos pos_range% arrival_range% ttft [interval] ..., to 3 significant digits
    shown = {}
    for r in hybrid:
        at = 10 + (3 if r[10] == "max" else 1)
        shown[(int(r[0]), int(r[1]), r[2])] = float(r[9]), float(r[at + 3])
    assert all(int(r[5]) == int(r[3]) * 2 and r[4] == "2" for r in hybrid)  # samples: the iterations of 2 arrivals
    ok = rows[(rows["mode"] == "hybrid") & (rows["status"] == "ok")]
    assert len(shown) == len(ok) == 6
    for row in ok.itertuples():
        tail, ttft = shown[(row.batch, row.prompt, row.chunk)]
        assert tail == pytest.approx(row.itl_tail_ms, rel=1e-2) and ttft == pytest.approx(row.ttft_ms, rel=1e-2)
    # batch prompt mode mechanism (one to three words) mean p50 p90 tail tail_of (one or three words) stretch ...
    shown = {}
    for r in spatial:
        at = 4 + {"disjoint": 1, "threads": 2}.get(r[3], 0)
        stretch = at + 4 + (3 if r[at + 4] == "max" else 1)
        shown[(int(r[0]), int(r[1]), r[2], r[3])] = float(r[at]), float(r[at + 3]), float(r[stretch])
    ok = rows[rows["mode"] != "hybrid"]
    assert len(shown) == len(ok) == 16
    for row in ok.itertuples():
        mean, tail, stretch = shown[(row.batch, row.prompt, row.mode, row.mechanism.split()[0].rstrip(","))]
        assert mean == pytest.approx(row.itl_mean_ms, rel=1e-2) and tail == pytest.approx(row.itl_tail_ms, rel=1e-2)
        assert stretch == pytest.approx(row.stretch, rel=1e-2)
    assert f"  batch 3, prompt {LARGE}, 10 tok/s (all 2 layers): kept by" in printed
    assert sorted(f.name for f in out.iterdir()) == ["interference.csv", "interference_chunks.png",
                                                     "interference_stretch.png", "interference_users.png", "run.json"]
    meta = json.loads((out / "run.json").read_text())
    assert meta["kind"] == "interference" and meta["run_id"] == rows["run_id"].iloc[0]
    assert meta["chunks"] == [CHUNK, "whole"] and meta["arrivals"] == 2
    assert [m["mechanism"] for m in meta["modes"]] == ["alone", "process", "threads split, unpinned",
                                                      "disjoint cores"]
    assert meta["state_before"]["host"] and meta["noise"].startswith("a window is noisy")
    assert meta["versions"]["torch"] == torch.__version__ and not meta["interrupted"]


def test_an_interrupted_run_keeps_what_it_measured(tmp_path):
    def stop_after_the_first(line):
        if line.startswith("round 1/2 prompt 8 batch 1:"):
            raise KeyboardInterrupt  # as the self-check's SIGINT at the end of a step's allowance

    cfg = InterferenceConfig(model=SMALL_MODEL, device=CPU, out_dir=tmp_path, dtype="float32", prompts=(8,),
                             batches=(1, 2), context=5, layers=1, window_s=0.05, rounds=2, forms=("spatial",),
                             on_line=stop_after_the_first)
    rows = run_interference(cfg).set_index(["batch", "mode"])
    assert rows.attrs["interrupted"] and json.loads((tmp_path / "run.json").read_text())["interrupted"]
    # (a co-located row on a busy host may add that its prefill covered too little of the window)
    assert (rows.loc[1, "status"] == "ok").all() and rows.loc[1, "reason"].str.startswith("1 of 2 rounds").all()
    assert (rows.loc[2, "status"] == "failed").all() and (rows.loc[2, "reason"] == "not measured: interrupted").all()
    assert len(load_interference(tmp_path)) == 2 * len(SPATIAL)


def test_an_interrupted_hybrid_form_keeps_the_arrivals_it_measured(tmp_path):
    def stop_after_the_first(line):
        if line.startswith("hybrid round 1/2 prompt 12 batch 1:"):
            raise KeyboardInterrupt

    cfg = InterferenceConfig(model=SMALL_MODEL, device=CPU, out_dir=tmp_path, dtype="float32", prompts=(12,),
                             batches=(1, 2), context=5, layers=1, window_s=0.05, rounds=1, chunks=(5, "whole"),
                             arrivals=2, on_line=stop_after_the_first)
    rows = run_interference(cfg)
    assert rows.attrs["interrupted"]
    hybrid = rows[rows["mode"] == "hybrid"].set_index(["batch", "chunk"])
    assert (hybrid.loc[1, "status"] == "ok").all() and (hybrid.loc[1, "reason"] == "1 of 2 arrivals").all()
    assert hybrid.loc[(1, "5"), "iterations"] == 3 and hybrid.loc[(1, "5"), "samples"] == 3
    assert (hybrid.loc[2, "status"] == "failed").all() and (hybrid.loc[2, "reason"] == "not measured").all()
    spatial = rows[rows["mode"] != "hybrid"]  # the spatial form never started
    assert len(spatial) and (spatial["reason"] == "not measured: interrupted").all()
    assert len(load_interference(tmp_path)) == len(rows)


def test_the_covered_share_is_the_union_of_the_iterations_inside_the_window():
    window = (1.0, 11.0)
    assert covered_share([(0.0, 4.0), (4.0, 8.0), (8.0, 12.0)], *window) == 1.0  # back to back, beyond both ends
    assert covered_share([(0.0, 4.0), (6.0, 12.0)], *window) == pytest.approx(0.8)  # a gap between iterations
    assert covered_share([(5.0, 9.0), (2.0, 6.0), (3.0, 4.0)], *window) == pytest.approx(0.7)  # overlaps count once
    assert covered_share([(3.0, 7.0)], *window) == pytest.approx(0.4)  # started late, ended early
    # the first iteration began before the window and the last ended after it, yet it ran through 20% of it
    assert covered_share([(0.0, 2.0), (10.0, 12.0)], *window) == pytest.approx(0.2)
    assert covered_share([(-3.0, 0.5), (11.5, 14.0)], *window) == 0.0 and covered_share([], *window) == 0.0
    assert math.isnan(covered_share([(0.0, 1.0)], 2.0, 2.0))


class StalledRunner:
    """A co-runner whose loop began before the window and ended after it, with no iteration in between."""

    pid = None

    def start(self, prompt, placement):
        self.started = time.monotonic()

    def latest_done_start(self):
        return math.inf  # an iteration is done: the window does not grow

    def stop(self):
        done = time.monotonic()
        return [(self.started - 1.0, self.started), (done, done + 1.0)], self.started - 1.0

    def close(self):
        pass


class Decoder:
    def decode_step(self, batch, context):
        return torch.ones(batch)


def test_a_window_the_co_runner_stalled_through_is_not_covered(tmp_path):
    session = object.__new__(Session)  # its decoder and co-runner replaced by doubles
    session.cfg = InterferenceConfig(model=SMALL_MODEL, device=CPU, out_dir=tmp_path, dtype="float32", prompts=(8,),
                                     batches=(1,), context=5, layers=1, window_s=0.05, rounds=1)
    session.device, session.every, session.decoder = CPU, allowed_cpus(), Decoder()
    session.probe = ContentionProbe(CPU, cpus=set(session.every))
    session.runners, session.broken, session._streams = {"process": StalledRunner()}, {}, {}
    mode = Mode("colocated", "process", "process", Placement(session.every, len(session.every)))
    try:
        found = session.window(mode, 1, 8)
    finally:
        place_host(Placement(), session.every)
    assert len(found.samples_ms) >= 3 and found.covered == 0.0 and found.prefill_ms == []


def test_a_row_whose_prefill_covered_too_little_of_a_window_says_so(tmp_path):
    cfg = InterferenceConfig(model=SMALL_MODEL, device=CPU, out_dir=tmp_path, dtype="float32", prompts=(8,),
                             batches=(1,), context=5, layers=1, window_s=0.05, rounds=2)
    modes, skipped = plan_modes(CPU, frozenset({0, 1}))
    windows = {(1, 8, ("alone", "alone")): [Window((1.0, 2.0, 3.0)), Window((1.0, 2.0, 3.0))],
               (1, 8, ("colocated", "process")): [Window((2.0, 3.0), [5.0], covered=0.99),
                                                  Window((4.0, 6.0), [6.0], covered=0.6)],
               (1, 8, ("protected", "disjoint cores")): [Window((1.0, 2.0), [5.0], covered=0.99),
                                                         Window((2.0, 3.0), [5.0], covered=0.97)]}
    rows = {(r["mode"], r["mechanism"]): r
            for r in mode_rows(cfg, modes, skipped, 1, 8, windows, {(8, "process"): [4.0]}, {})}
    colocated, protected = rows[("colocated", "process")], rows[("protected", "disjoint cores")]
    assert rows[("colocated", "threads split, unpinned")]["status"] == "failed"  # no window given
    assert colocated["covered"] == 0.6 and "the prefill ran through only 60% of a timed window" in colocated["reason"]
    assert protected["covered"] == 0.97 and protected["reason"] == ""
    assert rows[("alone", "alone")]["covered"] is None and colocated["device_name"] == device_name(CPU)


def test_cores_split_into_disjoint_sets():
    assert split_cpus({0, 1}) == ({0}, {1}) and split_cpus({3}) is None
    decode, prefill = split_cpus(range(16))
    assert len(decode) == 8 and decode.isdisjoint(prefill) and decode | prefill == set(range(16))
    assert split_cpus({0, 1, 2}, decode_share=0.9) == ({0, 1}, {2})  # the prefill keeps one


def test_the_modes_of_each_device():
    modes, skipped = plan_modes(CPU, frozenset({0}))
    assert [m.key for m in modes] == [("alone", "alone"), ("colocated", "process")]
    assert "needs 2 CPUs" in skipped[("protected", "disjoint cores")]
    assert "needs 2 CPUs" in skipped[("colocated", "threads split, unpinned")]
    modes, _ = plan_modes(CPU, frozenset(range(6)))
    control, protected = modes[2:]
    assert control.decode.cpus is None and control.decode.threads == protected.decode.threads == 3
    assert control.prefill.threads == protected.prefill.threads == 3 and control.prefill.cpus is None
    assert control.decode.describe() == "cpus all (unpinned), 3 threads"
    modes, _ = plan_modes(torch.device("cuda"), frozenset({0, 1}))
    assert [m.key for m in modes] == [("alone", "alone"), ("colocated", "stream"), ("colocated", "process"),
                                      ("protected", "priority stream")]
    protected = modes[-1]
    assert protected.decode.priority < protected.prefill.priority  # lower is higher


def test_pinning_moves_every_thread_of_the_process():
    every = os.sched_getaffinity(0)
    one = {min(every)}
    torch.set_num_threads(len(every))
    torch.ones(512, 512) @ torch.ones(512, 512)  # the OpenMP pool exists
    try:
        corunner.pin_threads(one)
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        assert len(tids) > 1 and all(os.sched_getaffinity(t) == one for t in tids)
    finally:
        corunner.place_host(Placement(), frozenset(every))
    assert os.sched_getaffinity(0) == every and torch.get_num_threads() == len(every)


def test_the_prefill_process_runs_on_the_cores_it_is_placed_on():
    cores = frozenset(sorted(allowed_cpus())[-1:])  # the last allowed core, one thread
    runner = ProcessCoRunner(PrefillSpec(SMALL_MODEL, layers=1, device="cpu", dtype="float32", max_prompt=8))
    placed = {}
    try:
        runner.wait_ready()
        runner.start(8, Placement(cores, 1))  # placed before it answers that the loop started
        for tid in os.listdir(f"/proc/{runner.pid}/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                placed[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
        spans, _ = runner.stop()
    finally:
        runner.close()
    assert spans and placed and set(placed.values()) == {cores}, placed


def test_the_stream_co_runner_works_without_wait_ready(monkeypatch):
    """Its state is set when it is made: alone() first, as the CUDA test does (streams faked, so it runs here)."""

    class Stream:
        def __init__(self, device=None, priority=0):
            self.priority = priority

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    runner = corunner.StreamCoRunner(PrefillSpec(SMALL_MODEL, layers=1, device="cpu", dtype="float32",
                                                 max_prompt=8))
    assert runner.latest_done_start() == -math.inf
    runner.close()  # nothing started: nothing to stop
    alone = runner.alone(8, Placement(priority=corunner.LOWEST_PRIORITY), 0.0, 3)
    assert len(alone) >= 3 and all(b >= a for a, b in alone)
    runner.start(8, Placement(priority=corunner.HIGHEST_PRIORITY))
    spans, begun = runner.stop()
    assert spans and begun <= spans[0][0] and runner.latest_done_start() == spans[-1][0]
    assert set(runner._streams) == {corunner.LOWEST_PRIORITY, corunner.HIGHEST_PRIORITY}
    runner.wait_ready()  # still harmless after use
    runner.close()


def test_a_co_runner_that_fails_says_why_in_one_line():
    bad = PrefillSpec(SMALL_MODEL, layers=SMALL_MODEL.layers + 1, device="cpu", dtype="float32", max_prompt=8)
    runner = ProcessCoRunner(bad)
    with pytest.raises(CoRunnerError, match=r"prefill process: ValueError: layers: must be an int in 1\.\.2") as err:
        runner.wait_ready()
    runner.close()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("argv, says", [
    (["--prompt", "0"], "prompt: must be positive ints"),
    (["--batch", "0"], "batch: must be positive ints"),
    (["--layers", "9", "--model", "name=t2,hidden=64,intermediate=96,layers=2,q_heads=2,kv_heads=1,head_dim=32,"
                                  "vocab=50"], "layers: 9 is not in 1..2"),
    (["--dtype", "int8"], "dtype: unknown dtype 'int8'"),
    (["--window", "0"], "window: must be a positive number"),
    (["--chunk", "0"], "chunk: must be a positive int or 'whole', got '0'"),
    (["--chunk", "half"], "chunk: must be a positive int or 'whole', got 'half'"),
    (["--prompt", "64", "96", "--chunk", "128", "whole"], "chunk: 128 tokens is more than the largest prompt's 96"),
    (["--arrivals", "0"], "arrivals: must be a positive int"),
])
def test_bad_arguments_get_one_line(argv, says, capsys, tmp_path):
    assert main(["interference", "--device", "cpu", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


# ---- the GPU paths ---------------------------------------------------------------------------------------------

GPU_MODEL = DecoderConfig(hidden=2048, intermediate=5632, layers=4, q_heads=16, kv_heads=4, head_dim=128, vocab=32000,
                          name="interference-gpu-test")


@pytest.mark.cuda
@pytest.mark.gpu_exclusive
def test_on_a_gpu_every_mode_gets_its_row_beside_a_second_stream_and_a_second_process(tmp_path):
    cfg = InterferenceConfig(model=GPU_MODEL, device=torch.device("cuda"), out_dir=tmp_path, dtype="bfloat16",
                             prompts=(8192,), batches=(8,), context=1024, layers=4, window_s=0.2, rounds=1)
    rows = run_interference(cfg)
    assert (rows["status"] == "ok").all(), rows[["mode", "mechanism", "reason"]]
    assert list(zip(rows["mode"], rows["mechanism"], strict=True)) == [
        ("alone", "alone"), ("colocated", "stream"), ("colocated", "process"), ("protected", "priority stream")]
    beside = rows[rows["mode"] != "alone"]  # how much they stretch the decode: pytest bench --expectations
    assert ((beside["covered"] > 0) & (beside["covered"] <= 1)).all() and (beside["prefill_samples"] >= 1).all()
    assert (beside["prefill_slowdown"] > 0).all() and rows["decode_threads"].isna().all()
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["modes"][-1]["decode"].startswith("stream priority -")
    assert len(load_interference(tmp_path)) == 4


@pytest.mark.cuda
@pytest.mark.gpu_exclusive
def test_on_a_gpu_the_hybrid_form_times_each_iteration_with_events(tmp_path):
    cfg = InterferenceConfig(model=GPU_MODEL, device=torch.device("cuda"), out_dir=tmp_path, dtype="bfloat16",
                             prompts=(2048,), batches=(8,), context=1024, layers=4, window_s=0.2, rounds=1,
                             chunks=(512, "whole"), arrivals=3, forms=("hybrid",))
    rows = run_interference(cfg)
    assert (rows["status"] == "ok").all(), rows[["chunk", "reason"]]
    assert rows["chunk"].tolist() == ["512", "whole"] and rows["iterations"].tolist() == [4, 1]
    assert (rows["samples"] == 3 * rows["iterations"]).all() and (rows["ttft_ms"] > 0).all()
    assert (rows["whole_model"] == "all 4 layers").all() and rows["chunk_cost"].iloc[-1] == 1


@pytest.mark.cuda
def test_the_stream_co_runner_loops_on_its_own_stream():
    spec = PrefillSpec(SMALL_MODEL, layers=1, device="cuda", dtype="bfloat16", max_prompt=256)
    runner = corunner.StreamCoRunner(spec)
    alone = runner.alone(256, Placement(priority=corunner.LOWEST_PRIORITY), 0.05, 3)
    assert len(alone) >= 3 and all(b > a for a, b in alone)
    runner.start(256, Placement(priority=corunner.LOWEST_PRIORITY))
    torch.cuda.synchronize()
    spans, begun = runner.stop()
    assert spans and begun <= spans[0][0] and runner.latest_done_start() == spans[-1][0]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # the loop's stream stayed in its thread
