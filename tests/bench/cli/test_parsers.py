"""Each verb owns its parser: the module that holds a verb's command is the one that builds its options."""

from __future__ import annotations

import argparse
import sys

from phasebench.bench.cli.main import build_parser

VERBS = ("list", "run", "merge", "profile", "report", "phases", "compare", "ceilings", "interference", "selfcheck",
         "env", "wheels")


def test_every_verb_is_built_where_its_command_lives(monkeypatch):
    built_by = {}
    add_parser = argparse._SubParsersAction.add_parser

    def recording(self, name, **kwargs):  # who called add_parser for this verb
        built_by[name] = sys._getframe(1).f_globals["__name__"]
        return add_parser(self, name, **kwargs)

    monkeypatch.setattr(argparse._SubParsersAction, "add_parser", recording)
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(verbs.choices) == VERBS  # the order `phasebench --help` lists them in
    commands = {name: verb.get_default("func") for name, verb in verbs.choices.items()}
    assert {name: fn.__module__ for name, fn in commands.items()} == built_by
    assert built_by["phases"].endswith(".phases_verb") and built_by["report"] == built_by["compare"]


def test_a_shards_resume_hint_keeps_every_option_its_measurement_depends_on():
    """The hint `merge` prints for an unfinished shard must be accepted by --resume: the same selection and the
    same timer (sample time, interval target, warm operands), parsed back to equal options."""
    import shlex

    from phasebench.bench.cli.main import build_parser
    from phasebench.bench.cli.sweeps import run_command

    argv = ["run", "--impl", "naive", "--shape", "batch=1,q_heads=4,kv_heads=2,q_len=1,kv_len=37,head_dim=16",
            "--sample-time", "0.05", "--ci-target", "3%", "--warm", "--out", "/tmp/x"]
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(shlex.split(run_command(args))[1:])
    for option in ("impl", "shape", "sample_time", "ci_target", "warm", "cuda_graph", "suite", "model", "dtype"):
        assert getattr(again, option) == getattr(args, option), option
