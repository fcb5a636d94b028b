"""A fourth operator added from outside: its kernels, its one record and its suite, and nothing else, reach the
runner, the store, the command line and the loaders."""

from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest

from ...conftest import run_cli

# What adding an operator touches, written as one plugin module: the kernels side (kernels/<op>/: declare the
# operator, its request and an implementation), the bench record (ops/<op>: case type, cost, inputs, reference,
# baseline, memory charge) and the suites' data.
TOY = textwrap.dedent('''
    """rowscale: out = x * s, x [M, N] scaled column by column by s [N]."""
    from dataclasses import dataclass

    import torch

    from phasebench.bench.instruments.device_memory import fit_reason
    from phasebench.bench.ops import Operator, register_operator
    from phasebench.bench.sweep.suites import SUITES
    from phasebench.kernels import register
    from phasebench.kernels.registry import PlannedCall, Impl, add_builtin, add_operator, get_impl

    ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}


    @dataclass(frozen=True)
    class ScaleRequest:
        x: torch.Tensor
        s: torch.Tensor

        @property
        def device_type(self):
            return self.x.device.type

        @property
        def dtype(self):
            return self.x.dtype


    def prepare_rowscale(x, s, *, impl):
        if x.dim() != 2 or s.shape != (x.shape[1],):
            raise ValueError(f"s: must be [N] for x [M, N], got {tuple(s.shape)} and {tuple(x.shape)}")
        chosen, req = get_impl(impl, op="rowscale"), ScaleRequest(x, s)
        chosen.check(req)
        return chosen.plan(req)


    add_operator("rowscale", lambda fn, req: fn(req.x, req.s))
    add_builtin(Impl(name="torch", summary="x * s in torch", devices=frozenset({"cpu", "cuda"}),
                     dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}), op="rowscale",
                     plan=lambda req: PlannedCall("torch", "torch-mul", lambda: req.x * req.s)))
    register("rowscale", "off_by_one", lambda x, s: x * s + 1.0, devices=("cpu", "cuda"))


    @dataclass(frozen=True)
    class RowScaleCase:
        m: int
        n: int
        dtype: str
        phase: str = "decode"
        model: str = ""

        op = "rowscale"

        @property
        def shape_label(self):
            return f"m{self.m} n{self.n}"

        def row_fields(self):
            return {"op": self.op, "m": self.m, "n": self.n, "dtype": self.dtype, "phase": self.phase,
                    "model": self.model}


    @dataclass(frozen=True)
    class Inputs:
        x: torch.Tensor
        s: torch.Tensor


    def make_inputs(case, device, seed):
        g = torch.Generator().manual_seed(seed)
        dtype = getattr(torch, case.dtype)
        return Inputs(torch.randn(case.m, case.n, generator=g).to(device, dtype),
                      torch.randn(case.n, generator=g).to(device, dtype))


    def nbytes(case):
        return float(ELEM[case.dtype] * (2 * case.m * case.n + case.n))


    register_operator(Operator(
        name="rowscale", case_type=RowScaleCase, flops=lambda c: float(c.m * c.n), min_bytes=nbytes,
        make_inputs=make_inputs, reference=lambda c, x, device: x.x.double() * x.s.double(),
        baseline_error=lambda c, x, ref: None,
        prepare=lambda c, x, impl: prepare_rowscale(x.x, x.s, impl=impl),
        does_not_fit=lambda c, impl, device, *, resident=False, free=None: fit_reason(
            impl, int(nbytes(c)), int(3 * nbytes(c)), device, resident=resident, free=free),
        key=lambda c, impl: f"{impl}/rowscale/m{c.m}-n{c.n}-{c.dtype}",
    ))


    class RowScaleSweep:
        def __init__(self, shapes):
            self.shapes = shapes

        def cases(self, dtype, models=None):
            return [RowScaleCase(m, n, dtype) for m, n in self.shapes]


    SUITES["rowscale"] = {"cpu": [RowScaleSweep([(3, 97), (17, 1025)])],
                          "cuda": [RowScaleSweep([(1, 4096), (64, 8191)])]}
''')


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    (folder / "toy_op.py").write_text(TOY)
    out = folder / "run"
    proc = run_cli("run", "--plugin", str(folder / "toy_op.py"), "--suite", "rowscale", "--impl", "torch",
                   "off_by_one", "--out", str(out), "--sample-time", "0.05")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return folder, out, proc


def test_a_fourth_operator_runs_through_the_runner_and_the_store(toy_run):
    _, out, _ = toy_run
    df = pd.read_csv(out / "results.csv")
    assert list(df.op.unique()) == ["rowscale"] and set(df.impl) == {"torch", "off_by_one"}
    ok, wrong = df[df.impl == "torch"], df[df.impl == "off_by_one"]
    assert (ok.status == "ok").all() and (ok.backend == "torch-mul").all() and (ok.latency_ms > 0).all()
    assert list(ok.m) == [3, 17] and list(ok.n) == [97, 1025]
    assert list(ok.bytes) == [4.0 * (2 * 3 * 97 + 97), 4.0 * (2 * 17 * 1025 + 1025)]
    assert (wrong.status == "incorrect").all() and wrong.latency_ms.isna().all()  # the gate judges it too
    assert json.loads((out / "run.json").read_text())["suite"] == "rowscale"


def test_a_fourth_operator_resumes_and_loads_like_the_others(toy_run):
    folder, out, _ = toy_run
    before = (out / "results.csv").read_text()
    again = run_cli("run", "--plugin", str(folder / "toy_op.py"), "--suite", "rowscale", "--impl", "torch",
                    "off_by_one", "--out", str(out), "--resume", "--sample-time", "0.05")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "results.csv").read_text() == before  # every row was already there

    import phasebench.analysis as pa

    frame = pa.load(out)
    assert set(frame.op) == {"rowscale"} and frame[frame.impl == "torch"].m.tolist() == [3, 17]
