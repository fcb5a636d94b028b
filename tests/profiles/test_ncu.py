"""Nsight Compute details CSV: header variants, the profiler's own lines around it, units, n/a, the digest."""

from __future__ import annotations

import math

import pytest
from phasebench.profiles.ncu import NcuFormatError, digest, parse_details, read_details

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(launch, kernel, section, metric, unit, value):
    return (f'"{launch}","4242","python3","h200","{kernel}","1","7","(128, 1, 1)","(33, 128, 1)","0","9.0",'
            f'"{section}","{metric}","{unit}","{value}"')


SOL, MEM, OCC, LAUNCH = ("GPU Speed Of Light Throughput", "Memory Workload Analysis", "Occupancy",
                         "Launch Statistics")
TEXT = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    '{"case": "printed by the program before ncu writes its table"}',
    "==PROF== Profiling \"split_kv_kernel\" - 0: 0%....50%....100% - 9 passes",
    HEAD,
    row(0, "split_kv_kernel", SOL, "Duration", "usecond", "41.63"),
    row(0, "split_kv_kernel", SOL, "DRAM Throughput", "%", "86.20"),
    row(0, "split_kv_kernel", SOL, "Memory Throughput", "%", "86.20"),
    row(0, "split_kv_kernel", SOL, "Compute (SM) Throughput", "%", "23.41"),
    row(0, "split_kv_kernel", MEM, "Memory Throughput", "Tbyte/second", "4.12"),
    row(0, "split_kv_kernel", OCC, "Achieved Occupancy", "%", "31.90"),
    row(0, "split_kv_kernel", LAUNCH, "Registers Per Thread", "register/thread", "128"),
    row(0, "split_kv_kernel", LAUNCH, "Grid Size", "", "4,224"),
    row(0, "split_kv_kernel", LAUNCH, "Block Size", "", "128"),
    row(1, "reduce_kernel", SOL, "Duration", "nsecond", "3,072"),
    row(1, "reduce_kernel", SOL, "DRAM Throughput", "%", "n/a"),
    row(1, "reduce_kernel", MEM, "Memory Throughput", "Gbyte/s", "1,234.50"),  # the 2024+ spelling
    row(1, "reduce_kernel", "Scheduler Statistics", "One or More Eligible", "%", "12.5"),
    "==PROF== Disconnected from process 4242",
])


def test_parse_skips_the_profilers_lines_and_reads_numbers_with_separators():
    df = parse_details(TEXT)
    assert list(df.columns) == ["launch", "kernel", "section", "metric", "unit", "value", "text"]
    assert len(df) == 13 and set(df["kernel"]) == {"split_kv_kernel", "reduce_kernel"}
    dur = df[(df.kernel == "reduce_kernel") & (df.metric == "Duration")].iloc[0]
    assert dur["value"] == 3072 and dur["unit"] == "nsecond" and dur["text"] == "3,072"
    assert math.isnan(df[(df.kernel == "reduce_kernel") & (df.metric == "DRAM Throughput")].iloc[0]["value"])


def test_digest_is_one_row_per_launch_in_common_units():
    d = digest(parse_details(TEXT)).set_index("kernel")
    split, reduce = d.loc["split_kv_kernel"], d.loc["reduce_kernel"]
    assert split["duration_us"] == pytest.approx(41.63) and reduce["duration_us"] == pytest.approx(3.072)
    assert split["memory_gbps"] == pytest.approx(4120) and reduce["memory_gbps"] == pytest.approx(1234.5)
    assert math.isnan(_gbps_of("furlong/s")) and _gbps_of("Mbyte/s") == pytest.approx(2e-3)
    assert split["dram_pct"] == pytest.approx(86.2) and math.isnan(reduce["dram_pct"])
    assert split["registers"] == 128 and split["grid"] == "4,224" and split["achieved_occupancy_pct"] == 31.9
    assert math.isnan(reduce["registers"])  # what ncu did not measure stays missing, never zero


def test_header_without_device_columns_and_with_rule_columns():
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",'
            '"Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type","Rule Description"')
    line = ('"3","1","p","h","gemm_kernel","t","1","7","GPU Speed Of Light Throughput","Duration","msecond","1.5",'
            '"","",""')
    d = digest(parse_details(f"{head}\n{line}\n"))
    assert d.iloc[0]["kernel"] == "gemm_kernel" and d.iloc[0]["duration_us"] == pytest.approx(1500)


def test_text_without_the_table_is_a_one_line_error(tmp_path):
    path = tmp_path / "details.csv"
    path.write_text("==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n")
    with pytest.raises(NcuFormatError, match="details.csv: no ncu details header") as err:
        read_details(path)
    assert "\n" not in str(err.value)


def _gbps_of(unit: str) -> float:
    """The digest's GB/s of a memory throughput of 2 in `unit`."""
    text = "\n".join([HEAD, row(0, "k", MEM, "Memory Throughput", unit, "2")])
    return digest(parse_details(text)).iloc[0]["memory_gbps"]
