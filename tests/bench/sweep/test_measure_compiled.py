"""Compiled impls through the measuring path: the compile columns filled from the first call (outside every sample),
blank for impls that compile nothing, and a row that recompiles while it is sampled flagged noisy with the count."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.instruments.timing import TimerConfig
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.sweep import runner
from phasebench.kernels import inductor, register
from phasebench.kernels.linear.compiled import COMPILED_LINEAR
from phasebench.kernels.registry import OPS, add_builtin

FAST = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=3, max_samples=3, flush_l2=False)
CPU = torch.device("cpu")
STEP = [0]  # read by the unstable body as a constant: Dynamo guards on it, so each new value recompiles


def _unstable(x, w):
    return F.linear(x, w) + 0.0 * STEP[0]


def _plan_unstable(req):
    call = inductor.compiled_call("unstable", "inductor-cpp", _unstable, req.x, req.w)

    def run():
        STEP[0] += 1
        return call.run()
    return type(call)(call.impl, call.backend, run, call.compiled)


def _doubled(x, w):
    return F.linear(x, w) * 2.0


PLUGIN_BODY = torch.compile(_doubled, fullgraph=True, dynamic=False)


@pytest.fixture
def unstable():
    impl = add_builtin(COMPILED_LINEAR.__class__(**{**COMPILED_LINEAR.__dict__, "name": "unstable",
                                                     "plan": _plan_unstable}))
    # a user's compiled kernel, declared so: treated as the built-ins are
    register("linear", "plugin_compiled", lambda x, w: PLUGIN_BODY(x, w) / 2.0, compiles=True)
    yield impl
    for name in ("unstable", "plugin_compiled"):
        OPS["linear"].pop(name, None)


@pytest.mark.slow
def test_compiled_rows_carry_their_compile_and_a_recompiling_row_is_flagged(tmp_path, unstable):
    case = LinearCase(m=3, n=97, k=1025, dtype="float32", phase="decode")
    flex_case = AttentionCase(1, 4, 2, 33, 70, 32, True, "float32")
    df = runner.run(runner.RunConfig([case, flex_case], ["torch", "compiled", "unstable", "plugin_compiled", "flash",
                                                         "flex"], CPU,
                                     tmp_path, suite="test", detect_contention=False, timer=FAST))
    rows = {(r.op, r.impl): r for r in df.itertuples()}
    assert all(r.status == "ok" for r in rows.values()), df[["impl", "status", "reason"]].to_string()
    for key in (("linear", "compiled"), ("attention", "flex"), ("linear", "plugin_compiled")):
        row = rows[key]
        # a graph this worker compiled before (another test, the same shape) serves it from memory, else it compiles
        assert row.compile_s > 0 and (row.compile_graphs, row.compile_cache) in ((0, "memory"), (1, "cold"),
                                                                                 (1, "disk"))
        assert row.recompiles == 0 and not row.noisy, (key, row.noise_reason)
    assert rows[("attention", "flex")].build_s > 0  # the causal chunk's block mask, built in the plan
    for key in (("linear", "torch"), ("attention", "flash")):
        assert math.isnan(rows[key].compile_s) and math.isnan(rows[key].recompiles)
    bad = rows[("linear", "unstable")]
    assert bad.recompiles >= FAST.min_samples and bad.noisy and "recompiled" in bad.noise_reason
