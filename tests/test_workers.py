"""How `python -m pytest` runs tests/: on pytest-xdist workers by default, in one process where asked or needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from .conftest import DEFAULT_WORKERS, pytest_cmdline_main


def chosen(monkeypatch, xdist=True, worker=None, **given) -> tuple:
    """The (workers, distribution) the hook leaves for a command line with `given` options, in the controller
    (`worker` None) or in an xdist worker."""
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    option = SimpleNamespace(**{"numprocesses": None, "dist": "no", "collectonly": False, "markexpr": "",
                                "usepdb": False, **given})
    config = SimpleNamespace(option=option, pluginmanager=SimpleNamespace(hasplugin=lambda name: xdist),
                             getoption=lambda name, default=None: getattr(option, name, default))
    pytest_cmdline_main(config)
    return option.numprocesses, option.dist


def test_the_whole_suite_runs_a_file_per_worker_on_a_host_without_cuda(monkeypatch):
    expected = (None, "no") if torch.cuda.is_available() else (DEFAULT_WORKERS, "loadfile")
    assert chosen(monkeypatch) == expected


@pytest.mark.parametrize("given", [{"numprocesses": 0}, {"numprocesses": 3}, {"markexpr": "cuda"},
                                   {"collectonly": True}, {"usepdb": True}, {"xdist": False}],
                         ids=["n0", "n3", "marker", "collect-only", "pdb", "no-xdist"])
def test_what_the_command_line_asks_is_left_alone(monkeypatch, given):
    workers = given.get("numprocesses")
    assert chosen(monkeypatch, **given) == (workers, "no")


def test_a_worker_starts_no_workers_of_its_own(monkeypatch):
    assert chosen(monkeypatch, worker="gw0") == (None, "no")
