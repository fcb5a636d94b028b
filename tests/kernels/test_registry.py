"""The registry: what runs here, what each implementation declares, and Unsupported for the rest."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import IMPLS, Unsupported, attention, available_impls, backend_for, describe_impls, triton_mode

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
    assert available_impls("cuda") == [n for n in ("naive", "flash") if n in IMPLS]


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
