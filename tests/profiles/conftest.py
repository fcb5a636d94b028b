"""Fixtures for the profile parsers: small nsys SQLite exports and Chrome traces built on the spot."""

from __future__ import annotations

import gzip
import json
import sqlite3
import types

import pytest
from phasebench.profiles.names import case_key

K1 = case_key("flash", "prefill", 1, 32, 8, 512, 512, 128, "bfloat16", True)
K2 = case_key("triton", "decode", 4, 32, 8, 1, 4096, 128, "float16", False)
HW = 1 << 48  # a host/VM bit above the pid, as real exports have


def gpid(pid):
    return HW | (pid << 24)


def gtid(pid, tid):
    return gpid(pid) + tid


# --- nsys export ---------------------------------------------------------------------------------
# Two processes. A (pid 100: threads 100 and 101) and B (pid 200) reuse correlation ids 3 and 4.
# (pid, tid, name, start, end) push/pop ranges; end None = never popped
RANGES = [
    (100, 100, f"setup: {K1}", 1_000, 2_000),
    (100, 100, K1, 3_000, 10_000),
    (100, 100, "l2flush", 3_100, 3_300),
    (100, 100, "inner", 5_000, 6_000),
    (100, 100, K1, 11_000, 15_000),
    (100, 100, f"check: {K1}", 16_000, 17_000),
    (100, 101, "open", 20_000, None),
    (200, 200, K2, 3_000, 9_000),
]
START_END = [(100, 100, "startend", 500, 30_000)]  # a start/end range: not used for attribution
# (pid, tid, correlationId, call start)
CALLS = [
    (100, 100, 1, 1_500), (100, 100, 2, 3_200), (100, 100, 3, 4_000), (100, 100, 4, 5_500),
    (100, 100, 5, 12_000), (100, 101, 5, 12_050),  # a repeated runtime row: the first call wins
    (100, 100, 6, 18_000), (100, 101, 7, 21_000),
    (200, 200, 3, 3_500), (200, 200, 4, 9_500),
]
# (pid, correlationId, name, start, end, device, stream)
KERNELS = [
    (100, 1, "fill", 1_600, 1_700, 0, 7),
    (100, 2, "zero_l2", 3_250, 3_400, 0, 7),
    (100, 3, "attn_fwd", 4_100, 4_600, 0, 7),
    (100, 4, "attn_fwd", 5_600, 5_850, 0, 7),
    (100, 5, "attn_fwd", 12_100, 12_400, 0, 7),
    (100, 6, "stray", 18_100, 18_110, 0, 7),
    (100, 7, "late", 21_100, 21_200, 0, 8),
    (100, 99, "orphan", 25_000, 25_050, 0, 7),  # no runtime row at all
    (200, 3, "decode_kv", 3_600, 3_900, 1, 13),
    (200, 4, "decode_kv", 9_600, 9_700, 1, 13),
]
# (pid, correlationId) -> innermost push/pop range at the launch call
EXPECTED_RANGE = {
    (100, 1): f"setup: {K1}", (100, 2): "l2flush", (100, 3): K1, (100, 4): "inner", (100, 5): K1,
    (100, 6): None, (100, 7): "open", (100, 99): None, (200, 3): K2, (200, 4): None,
}

_KERNEL_DDL = {
    "old": """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
        correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
        launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL,
        gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
        blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
        staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
        localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
        sharedMemoryExecuted INTEGER)""",
    "new": """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
        correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
        mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL,
        gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
        blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
        staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
        localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
        sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER)""",
}
_NVTX_DDL = """CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
    textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL,
    uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT)"""
_RUNTIME_DDL = """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
    returnValue INTEGER NOT NULL, callchainId INTEGER)"""


def build_nsys(path, generation="new", event_types=None, kernel_gpid=True):
    """Write an export of one schema generation.

    old: EXPORT_META_DATA, no ENUM tables, NVTX text through textId -> StringIds, no TARGET_INFO_GPU.
    new: META_DATA_EXPORT, ENUM_NSYS_EVENT_TYPE, NVTX text inline, a "phasebench" domain, TARGET_INFO_GPU.
    event_types overrides the ENUM ids (new only), to prove they are looked up.
    """
    types = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75, **(event_types or {})}
    con = sqlite3.connect(path)
    strings = {}

    def sid(text):
        return strings.setdefault(text, len(strings) + 1)

    con.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    meta = "EXPORT_META_DATA" if generation == "old" else "META_DATA_EXPORT"
    con.execute(f"CREATE TABLE {meta} (name TEXT NOT NULL, value TEXT)")
    con.executemany(f"INSERT INTO {meta} VALUES (?, ?)", [
        ("EXPORT_PRODUCT_VERSION", "2021.3.1" if generation == "old" else "2025.1.1"),
        ("EXPORT_SCHEMA_VERSION", "2.7.1" if generation == "old" else "3.17.1"),
    ])
    if generation == "new":
        con.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT)")
        con.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                        [(i, n, n) for n, i in types.items()] + [(34, "NvtxMark", "NvtxMark")])
        con.execute("CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER NOT NULL, name TEXT, busLocation TEXT)")
        con.executemany("INSERT INTO TARGET_INFO_GPU VALUES (?, ?, ?, ?)",
                        [(0, 0, "NVIDIA Test GPU", "0000:01:00.0"), (0, 1, "NVIDIA Test GPU", "0000:02:00.0")])
    con.execute(_NVTX_DDL)
    rows = []
    for pid, tid, name, start, end in RANGES:
        domain = 1 if generation == "new" and pid == 100 else 0
        rows.append((start, end, types["NvtxPushPopRange"], name, gtid(pid, tid), domain))
    for pid, tid, name, start, end in START_END:
        rows.append((start, end, types["NvtxStartEndRange"], name, gtid(pid, tid), 0))
    if generation == "new":
        rows.append((10, None, types["NvtxDomainCreate"], "phasebench", gtid(100, 100), 1))
        rows.append((20, None, 34, "a mark", gtid(100, 100), 0))  # marks are no ranges
    for start, end, etype, name, tid_, domain in rows:
        text, text_id = (name, None) if generation == "new" else (None, sid(name))
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", (start, end, etype, text, tid_, text_id,
                                                     domain if generation == "new" else None))
    con.execute(_RUNTIME_DDL)
    for pid, tid, corr, start in CALLS:
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
                    (start, start + 40, gtid(pid, tid), corr, sid("cudaLaunchKernel_v7000")))
    ddl = _KERNEL_DDL[generation]
    if not kernel_gpid:
        ddl = ddl.replace("globalPid INTEGER, ", "")
    con.execute(ddl)
    for i, (pid, corr, name, start, end, dev, stream) in enumerate(KERNELS):
        values = {"start": start, "end": end, "deviceId": dev, "contextId": 1, "streamId": stream,
                  "correlationId": corr, "globalPid": gpid(pid), "demangledName": sid(f"void {name}<128>(float*)"),
                  "shortName": sid(name), "registersPerThread": 32 + i, "gridX": 10 + i, "gridY": 2, "gridZ": 1,
                  "blockX": 128, "blockY": 1, "blockZ": 1, "staticSharedMemory": 16, "dynamicSharedMemory": 1024 * i,
                  "localMemoryPerThread": 0, "localMemoryTotal": 0, "gridId": i}
        if generation == "new":
            values["mangledName"] = sid(f"_Z{len(name)}{name}Pf")
        if not kernel_gpid:
            del values["globalPid"]
        con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({', '.join(values)}) "
                    f"VALUES ({', '.join('?' * len(values))})", list(values.values()))
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    con.commit()
    con.close()
    return path


@pytest.fixture
def nsys_export(tmp_path):
    """Factory: nsys_export("old"|"new", **options) -> path of a fresh export."""
    def make(generation="new", **options):
        return build_nsys(tmp_path / f"{generation}.sqlite", generation, **options)
    return make


# --- torch.profiler Chrome traces ----------------------------------------------------------------
BASE = 1_712_345_678_000  # microseconds, large enough that floats would lose the nanoseconds


def _x(cat, name, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def gpu_trace_events():
    """GPU trace: CPU thread 4242/4242, kernels on device 0 streams 7 and 20 (pid 0, tid = stream)."""
    b = BASE
    ev = [
        {"name": "process_name", "ph": "M", "pid": 4242, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": b, "dur": 1000},
        {"name": "Iteration Start", "ph": "i", "s": "g", "pid": "Traces", "tid": "Trace", "ts": b},
        _x("user_annotation", f"setup: {K1}", b + 10.0, 20.0, 4242, 4242),
        _x("user_annotation", K1, b + 100.0, 50.5, 4242, 4242),
        _x("user_annotation", "l2flush", b + 110.0, 5.0, 4242, 4242),
        _x("user_annotation", K1, b + 200.25, 30.0, 4242, 4242),
        _x("gpu_user_annotation", K1, b + 400.0, 100.0, 0, 7),
        _x("cpu_op", "aten::scaled_dot_product_attention", b + 104.0, 10.0, 4242, 4242, **{"External id": 50}),
        _x("cpu_op", "aten::empty", b + 104.5, 1.0, 4242, 4242, **{"External id": 51}),
        _x("cuda_runtime", "cudaLaunchKernel", b + 105.123, 2.5, 4242, 4242, correlation=11),
        _x("cuda_runtime", "cudaLaunchKernel", b + 112.0, 2.0, 4242, 4242, correlation=12),
        _x("cuda_driver", "cuLaunchKernel", b + 120.0, 2.0, 4242, 4242, correlation=15),
        _x("cuda_runtime", "cudaLaunchKernel", b + 205.0, 2.0, 4242, 4242, correlation=13),
        _x("cuda_runtime", "cudaLaunchKernel", b + 206.0, 2.0, 4242, 4243, correlation=13),  # repeat: first wins
        _x("cuda_runtime", "cudaLaunchKernel", b + 300.0, 2.0, 4242, 4242, correlation=14),
        {"ph": "s", "id": 11, "pid": 4242, "tid": 4242, "ts": b + 105.123, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 11, "pid": 0, "tid": 7, "ts": b + 130.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]
    kernel = {"device": 0, "context": 1, "registers per thread": 40, "shared memory": 2048,
              "grid": [96, 2, 1], "block": [128, 1, 1]}
    for corr, name, ts, dur, stream in [(11, "attn_fwd", 130.0, 12.5, 7), (12, "zero_l2", 140.0, 3.25, 7),
                                        (15, "triton_attn", 150.0, 4.0, 20), (13, "attn_fwd", 210.5, 12.5, 7),
                                        (14, "stray", 310.0, 1.0, 7), (16, "graph_kernel", 420.0, 6.0, 7)]:
        ev.append(_x("kernel", name, b + ts, dur, 0, stream, stream=stream, correlation=corr,
                     **{"External id": corr}, **kernel))
    return ev


# (name, start_ns relative to BASE, duration_ns, launch range)
GPU_KERNELS = [
    ("attn_fwd", 130_000, 12_500, K1), ("zero_l2", 140_000, 3_250, "l2flush"),
    ("triton_attn", 150_000, 4_000, K1), ("attn_fwd", 210_500, 12_500, K1),
    ("stray", 310_000, 1_000, None), ("graph_kernel", 420_000, 6_000, K1),
]


def cpu_trace_events():
    """CPU-only trace: no kernels; ops on two threads, one op nested in another."""
    b = BASE
    return [
        _x("user_annotation", K2, b + 0.0, 100.0, 77, 77),
        _x("cpu_op", "aten::matmul", b + 10.0, 40.0, 77, 77),
        _x("cpu_op", "aten::mm", b + 11.0, 38.0, 77, 77),
        _x("cpu_op", "aten::softmax", b + 55.5, 20.25, 77, 77),
        _x("cpu_op", "aten::add", b + 150.0, 5.0, 77, 77),
        _x("cpu_op", "aten::copy_", b + 20.0, 3.0, 77, 78),
    ]


def write_trace(path, events, gz=False, wrap=True):
    data = json.dumps({"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": events} if wrap else events)
    if gz:
        path.write_bytes(gzip.compress(data.encode()))
    else:
        path.write_text(data)
    return path


@pytest.fixture
def gpu_trace(tmp_path):
    return write_trace(tmp_path / "gpu_trace.json", gpu_trace_events())


@pytest.fixture
def gpu_trace_gz(tmp_path):
    return write_trace(tmp_path / "gpu_trace.json.gz", gpu_trace_events(), gz=True)


@pytest.fixture
def cpu_trace(tmp_path):
    return write_trace(tmp_path / "cpu_trace.json", cpu_trace_events())


@pytest.fixture
def data():
    """The scenario's constants, for assertions (test modules do not import this conftest)."""
    return types.SimpleNamespace(
        K1=K1, K2=K2, RANGES=RANGES, START_END=START_END, CALLS=CALLS, KERNELS=KERNELS,
        EXPECTED_RANGE=EXPECTED_RANGE, BASE_NS=BASE * 1000, GPU_KERNELS=GPU_KERNELS,
        gpid=gpid, gtid=gtid, write_trace=write_trace, gpu_trace_events=gpu_trace_events,
        cpu_trace_events=cpu_trace_events,
    )
