"""The compile helper: a first call's record, a graph count that moves on a recompile and not on a cache hit, the
mode from the environment, the backend names, the run's own cache, and the recompile limit raised into an error."""

from __future__ import annotations

import os

import pytest
import torch
from phasebench.kernels import inductor


def _scaled(x, w):
    return torch.nn.functional.silu(x @ w.T) * 3.0


def test_the_first_call_records_its_compile_and_a_new_shape_recompiles():
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 37, generator=gen), torch.randn(11, 37, generator=gen)
    call = inductor.compiled_call("compiled", "test", _scaled, x, w)
    assert call.compiled.mode == "default" and not call.compiled.done
    out = call.run()
    assert call.compiled.done and call.compiled.seconds > 0 and call.compiled.graphs >= 1
    assert call.compiled.cache in ("cold", "disk")
    torch.testing.assert_close(out.double(), _scaled(x.double(), w.double()), rtol=1e-5, atol=1e-5)
    graphs = inductor.graph_count()
    again = inductor.compiled_call("compiled", "test", _scaled, x.clone(), w.clone())
    again.run()
    assert inductor.graph_count() == graphs and again.compiled.graphs == 0 and again.compiled.cache == "memory"
    other = inductor.compiled_call("compiled", "test", _scaled, torch.randn(6, 37, generator=gen), w)
    other.run()
    assert inductor.graph_count() == graphs + 1 and other.compiled.graphs == 1


def test_before_runs_inside_every_call():
    seen = []
    call = inductor.compiled_call("compiled", "test", _scaled, torch.ones(2, 3), torch.ones(4, 3),
                                  before=lambda: seen.append(1))
    call.run()
    call.run()
    assert seen == [1, 1]


def test_the_mode_comes_from_the_environment_and_a_bad_one_is_one_line(monkeypatch):
    monkeypatch.setenv(inductor.MODE_ENV, "max-autotune")
    assert inductor.compile_mode() == "max-autotune"
    assert inductor.backend("cpu") == "inductor-cpp:max-autotune"
    assert inductor.backend("cuda", "flex") == "flex-triton:max-autotune"
    monkeypatch.setenv(inductor.MODE_ENV, "fastest")
    with pytest.raises(ValueError, match="PHASEBENCH_COMPILE_MODE: unknown torch.compile mode 'fastest'") as err:
        inductor.compile_mode()
    assert "\n" not in str(err.value)


def test_a_run_gets_its_own_empty_cache_unless_one_is_set(monkeypatch, tmp_path):
    # set blank through monkeypatch (which restores them), so that what fresh_cache_dir writes is undone too
    monkeypatch.setenv(inductor.CACHE_ENV, "")
    monkeypatch.setenv(inductor.FRESH_ENV, "")
    path = inductor.fresh_cache_dir()
    assert os.path.isdir(path) and not os.listdir(path) and inductor.cache_dir() == path
    assert inductor.cache_kind().startswith("this run's own")
    monkeypatch.setenv(inductor.CACHE_ENV, str(tmp_path))
    assert inductor.fresh_cache_dir() == str(tmp_path) and inductor.cache_kind().startswith("set by the user")


STEP = [0]


def _stepped(x):
    return x * STEP[0]  # Dynamo guards on the constant: each new value is a new graph


@pytest.mark.slow
def test_past_dynamos_default_limit_every_shape_still_compiles_and_counts():
    fn = inductor.compiled(_stepped, "default")
    config = torch._dynamo.config
    assert config.recompile_limit >= inductor.RECOMPILE_LIMIT and config.fail_on_recompile_limit_hit
    x, graphs = torch.arange(3.0), inductor.graph_count()
    for step in range(1, 10):  # the ninth is past the default limit of 8: a fall back to eager would not count it
        STEP[0] = step
        assert torch.equal(fn(x), x * step)
    assert inductor.graph_count() == graphs + 9


def test_inductor_is_unavailable_without_a_compiler(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(inductor.shutil, "which", lambda name: None)
    assert "no C++ compiler" in inductor.why_unavailable("cpu")


def test_a_plugin_declares_that_it_compiles_with_a_bool():
    from phasebench.kernels import register

    with pytest.raises(ValueError, match="compiles: must be a bool, got 'yes'"):
        register("linear", "x_compiled", lambda x, w: x @ w.T, compiles="yes")
