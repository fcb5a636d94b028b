"""torch.profiler (Kineto) Chrome trace parser, on traces built by conftest."""

import gzip

import pytest
from phasebench.profiles import nsys, torch_trace


@pytest.mark.parametrize("which", ["gpu_trace", "gpu_trace_gz"])
def test_gpu_kernels(request, data, which):
    k = torch_trace.read_kernels(request.getfixturevalue(which))
    assert list(k.columns) == nsys.KERNEL_COLUMNS and k.attrs["kind"] == "kernel"
    assert len(k) == len(data.GPU_KERNELS)  # the repeated launch event did not double a kernel
    assert k["name"].tolist() == [x[0] for x in data.GPU_KERNELS]
    assert (k["start_ns"] - data.BASE_NS).tolist() == [x[1] for x in data.GPU_KERNELS]
    assert k["duration_ns"].tolist() == [x[2] for x in data.GPU_KERNELS]  # float microseconds, exact ns
    assert (k["end_ns"] - k["start_ns"]).equals(k["duration_ns"])
    assert k["nvtx_range"].tolist() == [x[3] for x in data.GPU_KERNELS]
    assert k["demangled_name"].equals(k["name"])
    assert k["device_id"].eq(0).all() and sorted(k["stream_id"].unique()) == [7, 20]
    first = k.iloc[0]
    assert (first.grid_x, first.grid_y, first.grid_z, first.block_x) == (96, 2, 1, 128)
    assert first.registers_per_thread == 40 and first.shared_bytes == 2048 and first.correlation_id == 11


def test_gpu_launch_threads_and_paths(gpu_trace, data):
    k = torch_trace.read_kernels(gpu_trace).set_index("correlation_id")
    assert k.loc[13, "tid"] == 4242  # first of the two launch events with correlation 13
    assert k.loc[15, "nvtx_range"] == data.K1  # a driver-API launch (Triton) counts too
    assert k.loc[12, "nvtx_path"] == (data.K1, "l2flush")
    assert k.loc[14, "nvtx_path"] == () and k.loc[14, "pid"] == 4242
    # no launch event: found through the gpu_user_annotation on its stream, launching thread unknown
    assert k.loc[16, "nvtx_range"] == data.K1 and k.loc[[16], "tid"].isna().all()


def test_launch_time_is_exact(tmp_path, data):
    # ranges ending exactly at the launch call (ends are exclusive) and starting exactly there: decimal
    # microseconds must become exact nanoseconds for this to come out right
    events = data.gpu_trace_events()
    b = data.BASE_NS // 1000
    events.append({"ph": "X", "cat": "user_annotation", "name": "ends_at_launch", "pid": 4242, "tid": 4242,
                   "ts": b + 104.123, "dur": 1.0, "args": {}})
    events.append({"ph": "X", "cat": "user_annotation", "name": "starts_at_launch", "pid": 4242, "tid": 4242,
                   "ts": b + 105.123, "dur": 0.001, "args": {}})
    k = torch_trace.read_kernels(data.write_trace(tmp_path / "t.json", events))
    assert k.set_index("correlation_id").loc[11, "nvtx_range"] == "starts_at_launch"


def test_gpu_trace_cpu_ops_on_request(gpu_trace, data):
    ops = torch_trace.read_kernels(gpu_trace, kind="cpu_op")
    assert ops.attrs["kind"] == "cpu_op"
    assert ops["name"].tolist() == ["aten::scaled_dot_product_attention"]  # aten::empty is nested in it
    assert ops["nvtx_range"].tolist() == [data.K1] and ops["duration_ns"].tolist() == [10_000]


def test_cpu_only_trace_falls_back_to_top_level_ops(cpu_trace, data):
    k = torch_trace.read_kernels(cpu_trace)
    assert k.attrs["kind"] == "cpu_op"
    assert k["name"].tolist() == ["aten::matmul", "aten::copy_", "aten::softmax", "aten::add"]
    assert k["duration_ns"].tolist() == [40_000, 3_000, 20_250, 5_000]
    assert k["nvtx_range"].tolist() == [data.K2, None, data.K2, None]
    assert k["tid"].tolist() == [77, 78, 77, 77] and k["device_id"].isna().all()
    assert torch_trace.read_kernels(cpu_trace, kind="kernel").empty


def test_ranges(gpu_trace, data):
    r = torch_trace.read_ranges(gpu_trace)
    assert list(r.columns) == torch_trace.RANGE_COLUMNS
    assert r["name"].tolist() == [f"setup: {data.K1}", data.K1, "l2flush", data.K1]
    assert r["duration_ns"].tolist() == [20_000, 50_500, 5_000, 30_000]
    assert (r["end_ns"] - r["start_ns"]).equals(r["duration_ns"])
    assert r["pid"].eq(4242).all() and r["tid"].eq(4242).all()
    assert len(torch_trace.read_ranges(gpu_trace, gpu=True)) == 5


def test_bare_event_list_and_old_category_names(tmp_path, data):
    b = data.BASE_NS // 1000
    events = [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": b, "dur": 7},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": b + 1, "dur": 2,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": b + 4, "dur": 3,
         "args": {"correlation": 5, "device": 0, "stream": 7}},
    ]
    k = torch_trace.read_kernels(data.write_trace(tmp_path / "old.json", events, wrap=False))
    assert k["name"].tolist() == ["gemm"] and k["stream_id"].tolist() == [7] and k["tid"].tolist() == [1]


def test_launch_found_by_external_id_when_correlation_is_missing(tmp_path, data):
    b = data.BASE_NS // 1000
    events = [
        {"ph": "X", "cat": "user_annotation", "name": data.K2, "pid": 9, "tid": 3, "ts": b, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 3, "ts": b + 10, "dur": 2,
         "args": {"correlation": 1, "External id": 70}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": b + 20, "dur": 3,
         "args": {"External id": 70, "device": 0, "stream": 7}},
    ]
    k = torch_trace.read_kernels(data.write_trace(tmp_path / "ext.json", events))
    assert k[["nvtx_range", "pid", "tid"]].values.tolist() == [[data.K2, 9, 3]]
    assert k["correlation_id"].isna().all()


def test_bad_files(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{ not json")
    bad_gz = tmp_path / "bad.json.gz"
    bad_gz.write_bytes(gzip.compress(b"{}")[:12])
    no_events = tmp_path / "other.json"
    no_events.write_text('{"hello": 1}')
    binary = tmp_path / "blob.json"
    binary.write_bytes(bytes(range(256)))
    for path, what in [(bad_json, "not a JSON trace"), (bad_gz, "gzip"), (no_events, "traceEvents"),
                       (binary, "not a JSON trace"), (tmp_path / "missing.json", "cannot read")]:
        for read in (torch_trace.read_kernels, torch_trace.read_ranges):
            with pytest.raises(ValueError, match=what) as err:
                read(path)
            assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="kind"):
        torch_trace.read_kernels(bad_json, kind="gpu")
