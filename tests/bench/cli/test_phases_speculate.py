"""`phasebench phases --speculate`: bad input is refused in one line before anything is written."""

from __future__ import annotations

import pytest
from phasebench.bench.cli.main import main

TARGET = "name=spec-cli-target,hidden=96,intermediate=160,layers=2,q_heads=6,kv_heads=2,head_dim=16,vocab=101"
DRAFT = "name=spec-cli-draft,hidden=48,intermediate=64,layers=1,q_heads=3,kv_heads=1,head_dim=16,vocab=101"


@pytest.mark.parametrize("args,message", [
    (["--acceptance", "0.5", "1.0"], "alpha: the acceptance rate must lie in (0, 1), got 1.0"),
    (["--acceptance", "0"], "alpha: the acceptance rate must lie in (0, 1), got 0.0"),
    (["--acceptance", "-0.2"], "alpha: the acceptance rate must lie in (0, 1)"),
    (["--gamma", "0"], "gamma: the draft tokens per iteration must be an int >= 1, got 0"),
    (["--draft", "llama-3.2-1b"], "draft: llama-3.2-1b has a vocabulary of 128256, spec-cli-target of 101"),
    (["--draft", TARGET.replace("spec-cli-target", "spec-cli-big").replace("layers=2", "layers=3")],
     "draft: spec-cli-big"),
    ([], "draft: no default draft for 'spec-cli-target'"),
])
def test_bad_speculation_is_one_line_and_writes_nothing(args, message, tmp_path, capsys):
    out = tmp_path / "never"
    draft = [] if "--draft" in args or not args else ["--draft", DRAFT]
    assert main(["phases", "--model", TARGET, "--speculate", *draft, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_speculation_options_need_speculate(tmp_path, capsys):
    assert main(["phases", "--model", TARGET, "--gamma", "2", "--out", str(tmp_path / "never")]) == 2
    assert "gamma: applies to --speculate only" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
