"""The one roof computation (no torch): the floor of reads and writes, the copy fallback, bound and % of roof, on
scalars, arrays and frames alike."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from phasebench.bench.spec import roof


def test_the_floor_is_reads_and_writes_apart_where_the_copy_is_slower():
    r, w = 1_000_003.0, 333_331.0
    assert roof.memory_floor_s(r, w, 41.3, 29.9, 19.7) == pytest.approx(r / 41.3e9 + w / 29.9e9, rel=1e-14)


def test_pairs_go_at_the_copy_rate_where_the_copy_is_faster():
    r, w = 1_000_003.0, 333_331.0
    paired = 2 * w / 28.1e9 + (r - w) / 34.6e9
    assert roof.memory_floor_s(r, w, 34.6, 17.7, 28.1) == pytest.approx(paired, rel=1e-14)
    assert roof.memory_floor_s(w, r, 34.6, 17.7, 28.1) == pytest.approx(2 * w / 28.1e9 + (r - w) / 17.7e9, rel=1e-14)
    assert roof.memory_floor_s(r, w, 34.6, 17.7) == pytest.approx(r / 34.6e9 + w / 17.7e9)  # no copy: apart


def test_nothing_moved_costs_nothing_even_without_a_ceiling():
    assert roof.memory_floor_s(4096.0, 0.0, 12.5, np.nan, np.nan) == pytest.approx(4096 / 12.5e9)
    assert np.isnan(roof.memory_floor_s(4096.0, 8.0, 12.5, np.nan, np.nan))  # writes with no write ceiling: unknown


def test_roof_bound_and_share():
    flops, floor, peak = 3.0e9, 2.0e-3, 1.9  # compute 1.58 ms < floor 2 ms: memory-bound
    roof_tflops, roof_s, bound = roof.roof(flops, floor, peak)
    assert roof_tflops == pytest.approx(flops / floor / 1e12) and roof_s == floor and bound == "memory"
    roof_tflops, roof_s, bound = roof.roof(flops, 1.0e-3, peak)
    assert roof_tflops == peak and roof_s == pytest.approx(flops / 1.9e12) and bound == "compute"
    roof_tflops, roof_s, bound = roof.roof(0.0, floor, peak)  # a copy: no arithmetic
    assert roof_tflops == 0 and roof_s == floor and bound == "memory"
    assert roof.roof(flops, np.nan, peak)[2] == "" and roof.roof(flops, floor, np.nan)[2] == ""
    assert roof.pct_of_roof(floor, 4.0) == pytest.approx(50.0)


def test_rows_without_the_split_keep_the_copy_roof_of_schema_4():
    rng = np.random.default_rng(503)
    flops, nbytes, peak, copy = rng.uniform(1e6, 1e10, 7), rng.uniform(1e5, 1e9, 7), 0.377, 23.9
    roof_tflops, roof_s, bound, model = roof.row_roof(flops, np.nan, np.nan, nbytes, peak, np.nan, np.nan, copy)
    intensity = flops / nbytes
    np.testing.assert_allclose(roof_tflops, np.minimum(peak, intensity * copy / 1e3), rtol=1e-12)  # as before
    assert (model == roof.COPY).all()
    np.testing.assert_array_equal(bound, np.where(intensity * copy / 1e3 < peak, "memory", "compute"))


def test_a_frame_and_its_rows_give_the_same_roofs():
    frame = pd.DataFrame({"flops": [7.1e8, 0.0, 3.3e9], "read_bytes": [3.0e6, 5.0e5, np.nan],
                          "write_bytes": [1.0e4, 5.0e5, np.nan], "bytes": [3.01e6, 1.0e6, 2.2e6],
                          "peak_tflops": [0.5, 0.5, 0.5], "read_gbps": [31.0, 31.0, 31.0],
                          "write_gbps": [13.0, 13.0, 13.0], "peak_gbps": [23.0, 23.0, 23.0]})
    whole = roof.roof_of_row(frame)
    for index, row in enumerate(frame.to_dict("records")):
        one = roof.roof_of_row(row)
        for got, want in zip(one, whole, strict=True):
            assert got == (pytest.approx(want[index]) if isinstance(want[index], float) else want[index])
    assert list(whole[3]) == [roof.READ_WRITE, roof.READ_WRITE, roof.COPY]
    assert roof.roof_of_row({"flops": 1.0, "bytes": 8.0, "peak_tflops": 1.0, "peak_gbps": 2.0})[3] == roof.COPY


def test_the_roof_needs_no_torch():
    code = "import sys, phasebench.bench.spec.roof; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_warm_row_reads_from_the_smallest_cache_its_footprint_fits_and_a_cold_one_from_memory():
    l2, llc = 2 << 20, 32 << 20
    states = np.array(["warm", "warm", "warm", "rotated", "evicted", "flushed-l2", "warm", ""], dtype=object)
    nbytes = np.array([l2 - 1, l2 + 1, llc + 1, 1000, 1000, 1000, 1000, 1000], dtype=float)
    levels = roof.roof_level(states, nbytes, l2, llc)
    assert list(levels) == ["l2", "llc", "memory", "memory", "memory", "memory", "l2", "memory"]
    assert roof.roof_level("warm", 1000.0, 0, np.nan) == "memory"  # sizes unknown: memory, never a guess


def test_the_roof_follows_the_level_its_bytes_are_read_from():
    """A warm residual_add of 1.5 MiB in a 2 MiB L2 is held to the L2's read, write and copy ceilings; the same row
    cold (or an older row without a level) to memory's; at 100% of either roof it takes exactly the roof's time."""
    r, w = 1_048_576.0, 524_288.0
    memory = dict(read_gbps=30.2, write_gbps=14.9, peak_gbps=22.1)
    l2 = dict(level_read_gbps=151.0, level_write_gbps=97.0, level_copy_gbps=183.0)
    row = {"flops": 131072.0, "read_bytes": r, "write_bytes": w, "bytes": r + w, "peak_tflops": 0.26, **memory,
           **l2, "roof_level": "l2"}
    _, warm_s, bound, _ = roof.roof_of_row(row)
    assert float(warm_s) == pytest.approx(roof.memory_floor_s(r, w, 151.0, 97.0, 183.0)) and bound == "memory"
    _, cold_s, _, _ = roof.roof_of_row({**row, "roof_level": "memory"})
    assert float(cold_s) == pytest.approx(roof.memory_floor_s(r, w, 30.2, 14.9, 22.1))
    _, old_s, _, _ = roof.roof_of_row({k: v for k, v in row.items() if k != "roof_level"})
    assert float(old_s) == float(cold_s) and float(warm_s) < float(cold_s) / 4
    frame = pd.DataFrame([row, {**row, "roof_level": "memory"}])
    np.testing.assert_allclose(roof.roof_of_row(frame)[1], [float(warm_s), float(cold_s)])


def test_a_warm_rows_level_is_never_held_slower_than_a_farther_one():
    """The L2's own read (82, on a buffer small enough that a call's dispatch weighs) under the LLC's (160): a row in
    the L2 is judged at the LLC's; every level at least at memory's; without an L3, the L2 against memory alone."""
    memory = {"read_gbps": 30.2, "write_gbps": 14.9, "copy_gbps": 22.1}
    levels = {"l2": {"read_gbps": 82.4, "write_gbps": 92.0, "copy_gbps": 126.8},
              "llc": {"read_gbps": 159.5, "write_gbps": 11.0, "copy_gbps": 98.0}}
    found = roof.level_ceilings(levels, memory)
    assert found["llc"] == {"read_gbps": 159.5, "write_gbps": 14.9, "copy_gbps": 98.0}
    assert found["l2"] == {"read_gbps": 159.5, "write_gbps": 92.0, "copy_gbps": 126.8}
    assert roof.level_ceilings({"l2": levels["l2"]}, memory) == {"l2": levels["l2"]}
    assert roof.level_ceilings({}, memory) == {}


def test_a_farther_figure_that_judges_a_level_is_never_silent():
    """Where a level's own figure reads below a farther one's, the note of that level names the farther figure that
    judges its rows and the level's own, and the ceilings' warnings say it once per level; a level judged at its own
    figures has a blank note and no warning; a figure the level lacks is taken from farther, and said so too."""
    memory = {"read_gbps": 30.2, "write_gbps": 14.9, "copy_gbps": 22.1}
    levels = {"l2": {"read_gbps": 82.4, "write_gbps": 92.0, "copy_gbps": 126.8},
              "llc": {"read_gbps": 159.5, "write_gbps": 11.0, "copy_gbps": 98.0}}
    notes = roof.level_notes(levels, memory)
    assert notes == {"l2": "read at the llc's 159.5 GB/s (the l2's own 82.4)",
                     "llc": "write at memory's 14.9 GB/s (the llc's own 11.0)"}
    warnings = roof.level_warnings(levels, memory)
    assert len(warnings) == 2 and all("level_note" in w for w in warnings)
    assert warnings[0].startswith("llc ceilings below a farther level's: write at memory's 14.9 GB/s")
    assert warnings[1].startswith("l2 ceilings below a farther level's: read at the llc's 159.5 GB/s")
    own = {"l2": {"read_gbps": 182.4, "write_gbps": 92.0, "copy_gbps": 126.8}, "llc": {**levels["llc"],
                                                                                      "write_gbps": 15.0}}
    assert roof.level_notes(own, memory) == {"l2": "", "llc": ""} and roof.level_warnings(own, memory) == []
    assert roof.level_ceilings(own, memory) == {level: dict(f) for level, f in own.items()}  # equal: its own
    tie = {"llc": {**levels["llc"], "write_gbps": 14.9}}
    assert roof.level_notes(tie, memory) == {"llc": ""}
    lacking = {"l2": {**own["l2"], "copy_gbps": float("nan")}}
    assert roof.level_ceilings(lacking, memory)["l2"]["copy_gbps"] == 22.1
    assert roof.level_notes(lacking, memory)["l2"] == "copy at memory's 22.1 GB/s (none measured in the l2)"
    ceil = SimpleNamespace(read_gbps=30.2, write_gbps=14.9, copy_gbps=22.1, peak_gbps=22.1)
    assert roof.memory_figures(ceil) == memory


def test_a_compute_ceiling_is_the_matmul_ceiling_of_what_the_kernel_multiplies_in():
    peaks = {"float32": 0.263, "bfloat16": 0.0391}  # a host whose bf16 matmul is emulated: 7x slower than fp32
    assert roof.compute_peak(peaks, "float32") == 0.263 and roof.compute_peak(peaks, "bfloat16") == 0.0391
    # equal shares of the FLOPs in each run one after the other: 2 / (1/a + 1/b), below the faster, above the slower
    mixed = roof.compute_peak(peaks, "float32+bfloat16")
    assert mixed == pytest.approx(2 / (1 / 0.263 + 1 / 0.0391)) and 0.0391 < mixed < 0.263
    # a GEMV held to the fp32 ceiling where its kernel multiplies in fp32: its roof is 6.7x the bf16 one's
    flops, floor_s = 2 * 16 * 2048 * 5632, 0.0
    fp32_roof = roof.roof(flops, floor_s, roof.compute_peak(peaks, "float32"))[0]
    assert fp32_roof / roof.roof(flops, floor_s, peaks["bfloat16"])[0] == pytest.approx(0.263 / 0.0391)
    with pytest.raises(KeyError):
        roof.compute_peak(peaks, "float16")  # a dtype the run did not measure is never guessed
