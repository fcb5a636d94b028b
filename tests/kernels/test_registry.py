"""The registry: what runs here, what each implementation declares, and Unsupported for the rest."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import (
    IMPLS,
    OPS,
    Unsupported,
    attention,
    available_impls,
    backend_for,
    describe_impls,
    register,
    triton_mode,
)
from phasebench.kernels.attention import flex

from ..conftest import REPO
from .reference import make_qkv


def test_unsupported_is_a_not_implemented_error():
    assert issubclass(Unsupported, NotImplementedError)


def test_cpu_has_the_three_implementations():
    names = available_impls("cpu")
    assert {"naive", "flash"} <= set(names)
    assert ("triton" in names) == triton_mode.interpreted()
    assert available_impls(torch.device("cpu")) == names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_only_impls_are_listed_with_a_reason():
    rows = {r["impl"]: r for r in describe_impls("cpu")}
    assert set(rows) == set(IMPLS)
    for name in ("sdpa_efficient", "cudnn"):
        assert not rows[name]["available"] and "cuda" in rows[name]["reason"]
    flex_there = flex.why_unavailable("cuda") is None  # Inductor's Triton code needs triton, not a device
    expected = [n for n in ("naive", "flash", "flex") if n in IMPLS and (n != "flex" or flex_there)]
    assert available_impls("cuda") == expected


def test_a_bad_device_name_is_a_value_error():
    with pytest.raises(ValueError, match="unknown device 'warp-drive'"):
        available_impls("warp-drive")
    with pytest.raises(ValueError, match="device"):
        available_impls(3)


def test_requests_outside_a_declaration_raise_unsupported():
    q, k, v = make_qkv(1, 2, 1, 4, 8, 16, dtype=torch.float64)
    assert attention(q, k, v, impl="naive").dtype == torch.float64
    with pytest.raises(Unsupported, match="dtype"):
        attention(q, k, v, impl="triton")
    q, k, v = make_qkv(1, 2, 1, 4, 8, 512)
    with pytest.raises(Unsupported, match="head dims up to 256"):
        attention(q, k, v, impl="flash")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_only_impl_on_cpu_raises_unsupported():
    q, k, v = make_qkv(1, 2, 1, 4, 8, 16)
    with pytest.raises(Unsupported, match="does not run on cpu"):
        attention(q, k, v, impl="cudnn")


def test_backend_for_matches_the_call():
    q, k, v = make_qkv(1, 2, 2, 4, 8, 16)
    name = backend_for(q, k, v, impl="flash")
    assert name == "sdpa-flash"


def test_the_facade_names_stay_functions_beside_their_operator_packages():
    import importlib
    import pkgutil

    import phasebench.kernels as k

    for package in ("attention", "linear", "elementwise"):
        for sub in pkgutil.iter_modules(importlib.import_module(f"phasebench.kernels.{package}").__path__):
            importlib.import_module(f"phasebench.kernels.{package}.{sub.name}")  # a late submodule import
    assert all(callable(f) and not hasattr(f, "__path__") for f in (k.attention, k.linear, k.elementwise))
    assert set(k.OPS) >= {"attention", "linear", "elementwise"}


def test_every_operator_plans_a_planned_call_still_importable_by_its_old_name():
    """`AttentionCall` named the planned call of every operator in the facade's API (__all__): it stays there as the
    same class, and no module inside phasebench uses it."""
    import phasebench.kernels as k

    gen = torch.Generator().manual_seed(34)
    x, w = torch.randn(5, 24, generator=gen), torch.randn(40, 24, generator=gen)
    q, kv = torch.randn(1, 4, 3, 16, generator=gen), torch.randn(1, 2, 11, 16, generator=gen)
    calls = [k.prepare(q, kv, kv, impl="naive"), k.prepare_linear(x, w, impl="torch"),
             k.prepare_elementwise("residual_add", x, torch.randn(5, 24, generator=gen))]
    assert all(type(call) is k.PlannedCall for call in calls)
    assert k.AttentionCall is k.PlannedCall and {"PlannedCall", "AttentionCall"} <= set(k.__all__)
    users = [str(path.relative_to(REPO)) for folder in ("kernels", "bench", "analysis", "profiles")
             for path in (REPO / folder).rglob("*.py") if "AttentionCall" in path.read_text()]
    assert users == ["kernels/__init__.py"]


# what each implementation multiplies in: the matmul ceiling its rows are held to (bench.sweep.measure.base_row)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
COMPUTE = [  # (op, impl, device type, dtype, case fields, what it multiplies in)
    ("attention", "naive", "cpu", BF16, {}, "float32+bfloat16"),  # fp32 scores, P.V in bf16
    ("attention", "naive", "cuda", F32, {}, "float32"),
    ("attention", "flash", "cpu", BF16, {}, "bfloat16"),
    ("attention", "cudnn", "cuda", F16, {}, "float16"),
    ("linear", "naive", "cuda", F16, {}, "float32"),  # elementwise products upcast, fp32 sums
    ("linear", "torch", "cpu", BF16, {}, "bfloat16"),
    ("elementwise", "torch", "cuda", BF16, {"kind": "rmsnorm"}, "float32"),  # torch's opmath
    ("qlinear", "naive", "cpu", BF16, {"m": 7, "scheme": "int8"}, "bfloat16"),  # dequantized, then F.linear
    ("qlinear", "torch", "cpu", BF16, {"m": 7, "scheme": "int4-g128"}, "float32"),  # int4mm_kernel.cpp: fp32 FMAs
    ("qlinear", "torch", "cpu", F16, {"m": 7, "scheme": "int8"}, "float32"),  # int8mm_kernel.cpp: a scalar loop
    ("qlinear", "torch", "cuda", BF16, {"m": 7, "scheme": "int8"}, "float32"),  # int8mm.cu: CUDA cores
    ("qlinear", "torch", "cuda", BF16, {"m": 7, "scheme": "int4-g32"}, "bfloat16"),  # int4mm.cu: bf16 MMA
]


@pytest.mark.parametrize("op,impl,device,dtype,fields,expected", COMPUTE,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{str(c[3])[6:]}" for c in COMPUTE])
def test_each_implementation_declares_what_it_multiplies_in(op, impl, device, dtype, fields, expected):
    assert OPS[op][impl].compute_dtype(device, dtype, fields) == expected


def test_the_triton_kernels_multiply_in_fp32_in_the_interpreter_else_in_their_inputs_dtype(monkeypatch):
    tritons = [OPS[op]["triton"] for op in ("attention", "linear", "qlinear") if "triton" in OPS[op]]
    for interpreted, expected in ((True, "float32"), (False, "bfloat16")):
        monkeypatch.setenv("TRITON_INTERPRET", "1" if interpreted else "0")
        assert {impl.compute_dtype("cuda", BF16, {"m": 16}) for impl in tritons} <= {expected}
    if "triton" in OPS["qlinear"]:  # one token: its BLOCK_M == 1 path multiplies on the vector units, in fp32
        assert OPS["qlinear"]["triton"].compute_dtype("cuda", BF16, {"m": 1}) == "float32"


def test_a_plugin_declares_what_it_multiplies_in_or_is_held_to_its_inputs_dtype():
    added = []
    try:
        def by_m(device, dtype, fields):
            return "float32" if fields.get("m") == 1 else "bfloat16"

        for name, compute in (("p_default", None), ("p_name", "float32"), ("p_dtype", torch.float32), ("p_fn", by_m)):
            register("linear", name, lambda x, w: x @ w.T, compute=compute)
            added.append(name)
        found = {name: OPS["linear"][name].compute_dtype("cpu", BF16, {"m": 1}) for name in added}
        assert found == {"p_default": "bfloat16", "p_name": "float32", "p_dtype": "float32", "p_fn": "float32"}
        assert OPS["linear"]["p_fn"].compute_dtype("cpu", BF16, {"m": 8}) == "bfloat16"
        for bad in ("int8", "", "float32+tf32", 4):
            with pytest.raises(ValueError, match="compute: a plugin must name the dtype"):
                register("linear", "p_bad", lambda x, w: x @ w.T, compute=bad)
        register("linear", "p_bad_fn", lambda x, w: x @ w.T, compute=lambda device, dtype, fields: "fp32")
        added.append("p_bad_fn")
        with pytest.raises(ValueError, match="compute: linear implementation 'p_bad_fn' must name"):
            OPS["linear"]["p_bad_fn"].compute_dtype("cpu", BF16, {})
    finally:
        for name in added:
            OPS["linear"].pop(name, None)
