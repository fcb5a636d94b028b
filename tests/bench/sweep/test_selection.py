"""Selection: what a run measures as plain data (no argparse Namespace), its cases on a device, its command line."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from phasebench.bench.cli.main import build_parser
from phasebench.bench.cli.options import selection_of
from phasebench.bench.sweep.selection import Selection, UsageError, build_cases, resolve_impls

CPU = torch.device("cpu")
SHAPE = "batch=3,q_heads=6,kv_heads=2,q_len=1,kv_len=37,head_dim=24"
LINEAR = "m=5,n=24,k=40"


def test_hand_written_shapes_become_cases_of_their_operators():
    cases, suite = build_cases(Selection(shape=(SHAPE, LINEAR), dtype="bfloat16"), CPU)
    assert suite == "custom" and [c.op for c in cases] == ["attention", "linear"]
    attention, linear = cases
    assert (attention.batch, attention.kv_len, attention.head_dim, attention.phase) == (3, 37, 24, "decode")
    assert (linear.m, linear.n, linear.k) == (5, 24, 40) and {attention.dtype, linear.dtype} == {"bfloat16"}
    only_linear, _ = build_cases(Selection(shape=[SHAPE, LINEAR], op=["linear"]), CPU)  # lists, as argparse gives
    assert [c.op for c in only_linear] == ["linear"] and only_linear[0].dtype == "float32"  # the host's default


def test_a_suite_selection_filters_by_operator():
    cases, suite = build_cases(Selection(suite="quick", op=("attention",)), CPU)
    assert suite == "quick" and cases and {c.op for c in cases} == {"attention"}


@pytest.mark.parametrize("selection, message", [
    (Selection(dtype="float13"), r"^dtype: unknown dtype 'float13'"),
    (Selection(op=("convolution",)), r"^op: unknown operator 'convolution'"),
    (Selection(model=("llama-0b",)), r"^model: unknown model 'llama-0b'"),
    (Selection(shape=("batch=2,q_len=1",)), r"^shape: 'batch=2,q_len=1' lacks q_heads, kv_heads, kv_len, head_dim"),
])
def test_a_bad_selection_is_one_usage_error(selection, message):
    with pytest.raises(UsageError, match=message):
        build_cases(selection, CPU)


def test_unknown_impls_are_refused_and_none_given_means_every_available_one():
    assert "naive" in resolve_impls((), CPU) and resolve_impls(("naive", "naive"), CPU) == ["naive"]
    # the quick suite's selection leaves the impls that compile on their first call out unless they are named
    every, quick = resolve_impls((), CPU, ("attention", "linear")), resolve_impls((), CPU, ("attention", "linear"),
                                                                                  compiled=False)
    assert {"flex", "compiled"} <= set(every) and not {"flex", "compiled"} & set(quick)
    assert set(quick) == set(every) - {"flex", "compiled"}
    assert resolve_impls(("flex",), CPU, compiled=False) == ["flex"]
    with pytest.raises(UsageError, match=r"^impl: unknown implementation 'nope' for attention"):
        resolve_impls(("nope",), CPU)


def test_the_command_line_gives_the_selection_and_argv_gives_the_command_line_back(tmp_path):
    plugin = tmp_path / "my_kernels.py"
    plugin.write_text("")
    argv = ["run", "--suite", "decode", "--op", "attention", "linear", "--impl", "naive", "--model", "llama-3-8b",
            "--device", "cpu", "--dtype", "float32", "--shape", SHAPE, "--shape", LINEAR, "--plugin", str(plugin)]
    parser = build_parser()
    selection = selection_of(parser.parse_args(argv))
    assert selection == Selection("decode", ("attention", "linear"), ("naive",), ("llama-3-8b",), "cpu", "float32",
                                  (SHAPE, LINEAR), (str(plugin),))
    assert selection_of(parser.parse_args(["run", *selection.argv()])) == selection
    assert selection_of(parser.parse_args(["run"])) == Selection()  # every option left out: the defaults


def test_portable_names_plugin_files_by_absolute_path_and_keeps_module_names(tmp_path, monkeypatch):
    (tmp_path / "my_kernels.py").write_text("")
    monkeypatch.chdir(tmp_path)
    selection = Selection(plugin=("my_kernels.py", "some.module"))
    assert selection.portable().plugin == (str(tmp_path / "my_kernels.py"), "some.module")
    assert dataclasses.replace(selection.portable(), plugin=selection.plugin) == selection


def test_weights_pack_the_moe_cases_and_travel_on_the_command_line():
    cases, _ = build_cases(Selection(suite="moe-decode", model=("gpt-oss-20b",), weights="mxfp4"), CPU)
    floats, _ = build_cases(Selection(suite="moe-decode", model=("gpt-oss-20b",)), CPU)
    assert cases and {c.scheme for c in cases} == {"mxfp4"} and {c.scheme for c in floats} == {""}
    assert [dataclasses.replace(c, scheme="") for c in cases] == floats
    fp8, _ = build_cases(Selection(suite="moe-decode", weights="fp8"), CPU)  # phases' short name
    assert {c.scheme for c in fp8} == {"fp8-e4m3"}
    selection = selection_of(build_parser().parse_args(["run", "--suite", "moe-decode", "--weights", "nvfp4"]))
    assert selection.weights == "nvfp4" and selection_of(build_parser().parse_args(["run", *selection.argv()])) == \
        selection
    with pytest.raises(UsageError, match=r"^weights: unknown scheme 'int3', choose from int8, "):
        build_cases(Selection(suite="moe-decode", weights="int3"), CPU)
    with pytest.raises(UsageError, match=r"^weights: packs the routed experts of moe cases, and suite quick selects"):
        build_cases(Selection(suite="quick", weights="mxfp4"), CPU)
