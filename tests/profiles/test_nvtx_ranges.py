"""The NVTX wrapper: a no-op without a profiler or without the nvtx package, and never torch."""

import subprocess
import sys

import pytest
from phasebench.profiles import nvtx_ranges


def test_no_profiler_means_a_shared_no_op(monkeypatch):
    monkeypatch.setattr(nvtx_ranges, "_active", None)
    assert nvtx_ranges.enabled() is False  # no nsys here
    with nvtx_ranges.nvtx_range("flash/prefill/b1-hq1-hkv1-q1-k1-d64-float32", payload=3) as ctx:
        assert ctx is None
    assert nvtx_ranges.nvtx_range("a") is nvtx_ranges.nvtx_range("b")


def test_missing_nvtx_package_degrades(monkeypatch):
    monkeypatch.setattr(nvtx_ranges, "_nvtx", None)
    monkeypatch.setattr(nvtx_ranges, "_active", None)
    assert nvtx_ranges.enabled() is False
    with nvtx_ranges.nvtx_range("x"):
        pass


def test_active_profiler_gets_the_phasebench_domain(monkeypatch):
    calls = []

    class FakeNvtx:
        @staticmethod
        def annotate(message, color=None, domain=None, payload=None):
            calls.append((message, color, domain, payload))
            return nvtx_ranges.contextlib.nullcontext()

    monkeypatch.setattr(nvtx_ranges, "_nvtx", FakeNvtx)
    monkeypatch.setattr(nvtx_ranges, "_active", True)
    with nvtx_ranges.nvtx_range("l2flush", payload=7, color="red"):
        pass
    assert calls == [("l2flush", "red", "phasebench", 7)]


def test_arguments_suit_the_real_nvtx_package(monkeypatch):
    nvtx = pytest.importorskip("nvtx")
    monkeypatch.setattr(nvtx_ranges, "_nvtx", nvtx)
    monkeypatch.setattr(nvtx_ranges, "_active", True)  # as if nsys listened: the real annotate call is made
    with nvtx_ranges.nvtx_range("check: x", payload=3):
        with nvtx_ranges.nvtx_range("l2flush", color="red"):
            pass


def test_profiles_modules_never_import_torch():
    code = ("import sys; import phasebench.profiles.nvtx_ranges as n, phasebench.profiles.nsys, "
            "phasebench.profiles.torch_trace, phasebench.profiles.summary, phasebench.profiles.names; "
            "\nwith n.nvtx_range('x'): pass\nassert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
