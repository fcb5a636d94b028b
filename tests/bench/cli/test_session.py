"""The GPU-session verbs beside the self-check: `env`, `wheels`, and the program ncu profiles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile

import pytest
import torch
from phasebench.bench.sweep import metadata

from ...conftest import run_cli


def test_env_prints_and_writes_the_environment(tmp_path):
    proc = run_cli("env", "--device", "cpu", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    assert env["versions"]["torch"] == torch.__version__ and env["device"]["kind"] == "cpu"
    assert env["cuda_available"] == torch.cuda.is_available() and env["triton_mode"] in ("interpreter", "compiled")
    assert set(env["tools"]) == {"nsys", "ncu", "nvidia-smi", "nvcc"}
    assert all(set(t) == {"path", "version"} for t in env["tools"].values())
    assert env["flash_attn"].startswith(("flash_attn ", "absent: "))
    assert "versions: python" in proc.stderr and "tools: " in proc.stderr
    path = tmp_path / "env.json"
    written = run_cli("env", "--device", "cpu", "--json", str(path))
    assert written.returncode == 0 and json.loads(path.read_text())["versions"] == env["versions"]
    assert "device: " in written.stdout


def test_git_commit_falls_back_to_the_variable_where_no_checkout_answers(monkeypatch):
    def no_git(*args, **kwargs):
        raise OSError("git: not found")

    monkeypatch.setattr(metadata.subprocess, "run", no_git)
    monkeypatch.setenv("PHASEBENCH_GIT_COMMIT", "abc123-dirty")
    assert metadata.git_commit() == "abc123-dirty"
    monkeypatch.delenv("PHASEBENCH_GIT_COMMIT")
    assert metadata.git_commit() is None


def test_a_checkout_with_uncommitted_changes_records_its_commit_as_dirty(tmp_path, monkeypatch):
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    assert metadata.checkout_commit(tmp_path) is None  # no checkout here
    git("init", "-q")
    (tmp_path / "kernel.py").write_text("x = 1\n")
    git("add", "kernel.py")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert metadata.checkout_commit(tmp_path) == head
    (tmp_path / "kernel.py").write_text("x = 2\n")
    assert metadata.checkout_commit(tmp_path) == head + "-dirty"
    (tmp_path / "kernel.py").write_text("x = 1\n")
    real = metadata.subprocess.run

    def status_times_out(args, **kwargs):
        if "status" in args:
            raise subprocess.TimeoutExpired(args, 20)
        return real(args, **kwargs)

    assert metadata.checkout_commit(tmp_path) == head
    monkeypatch.setattr(metadata.subprocess, "run", status_times_out)
    assert metadata.checkout_commit(tmp_path) == head + "-dirty"  # a git that cannot tell is not clean


def test_wheels_builds_phasebench_with_its_commit(tmp_path):
    out = tmp_path / "whl"
    proc = run_cli("wheels", "--out", str(out), "--no-download", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("phasebench-*.whl")
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", (out / "COMMIT").read_text().strip())
    names = zipfile.ZipFile(wheel).namelist()
    assert "phasebench/bench/session/selfcheck.py" in names and "phasebench/kernels/attention/triton_decode.py" in names
    assert any(n.startswith("phasebench/analysis/sample/") for n in names)
    assert "--target /tmp/site" in proc.stdout and "selfcheck --out $OUT" in proc.stdout
    assert "phasebench's wheel built without build isolation" in proc.stdout


def test_wheels_fall_back_to_an_isolated_build_and_say_so(tmp_path, monkeypatch):
    from phasebench.bench.session import wheels

    asked = []

    def pip(command):  # an old setuptools without `wheel` here; pip's own build environment works
        asked.append(command)
        return "error: invalid command 'bdist_wheel'" if "--no-build-isolation" in command else None

    monkeypatch.setattr(wheels, "_pip", pip)
    how = wheels.build_wheel(tmp_path, tmp_path / "whl")
    assert how == "in an isolated build (the one here failed: error: invalid command 'bdist_wheel')"
    assert len(asked) == 2 and "--no-build-isolation" not in asked[1]
    monkeypatch.setattr(wheels, "_pip", lambda command: "no index")
    with pytest.raises(RuntimeError, match=r"failed here \(no index\) and in an isolated build \(no index\)"):
        wheels.build_wheel(tmp_path, tmp_path / "whl")


def test_ncu_target_runs_one_case_and_reports_its_cost(tmp_path):
    info_path = tmp_path / "case.json"
    proc = subprocess.run([sys.executable, "-m", "phasebench.bench.session.ncu_target", "--shape", "m=3,n=97,k=200",
                           "--impl", "torch", "--device", "cpu", "--dtype", "float32", "--json", str(info_path)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(info_path.read_text())
    assert info["case"]["m"] == 3 and info["flops"] == 2 * 3 * 97 * 200 and info["calls"] == 2
    assert info["key"] == "linear/torch/decode/m3-n97-k200-float32" and info["backend"]
    bad = subprocess.run([sys.executable, "-m", "phasebench.bench.session.ncu_target", "--shape", "m=3,n=x", "--impl",
                          "torch"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and bad.stderr.startswith("ncu_target: error: ") and len(bad.stderr.splitlines()) == 1


def test_ncu_target_profiles_only_what_passes_the_gate(tmp_path):
    plugin = tmp_path / "zeros_plugin.py"
    plugin.write_text("import torch\nfrom phasebench.kernels import register\n"
                      "register('attention', 'zeros', lambda q, k, v, *, causal, scale, cache_seqlens: "
                      "torch.zeros_like(q))\n")
    proc = subprocess.run([sys.executable, "-m", "phasebench.bench.session.ncu_target", "--shape",
                           "batch=2,q_heads=4,kv_heads=2,q_len=1,kv_len=97,head_dim=32", "--impl", "zeros", "--plugin",
                           str(plugin), "--device", "cpu", "--dtype", "float32"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and "zeros is incorrect on this case: worst row's relative error" in proc.stderr
    assert proc.stdout == ""  # nothing reported as profiled
