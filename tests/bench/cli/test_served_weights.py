"""`phases --weights`: the preset's served format by default, a scheme for projections and experts, none, and the
impls a format without a torch GEMM takes."""

from __future__ import annotations

from argparse import Namespace

import pytest
import torch
from phasebench.bench.cli.options import UsageError
from phasebench.bench.cli.phases_verb import served_weights
from phasebench.bench.spec.models import model_config
from phasebench.bench.spec.quant import ServedFormat

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def served(model, weights=None, device=CPU, impl=None, reference=None):
    impls = {"qlinear": "torch", "moe": "torch", **dict(item.split("=") for item in impl or ())}  # as cmd_phases
    found = served_weights(Namespace(weights=weights, impl=impl, reference=reference), device, impls,
                           model_config(model))
    return found, impls


def test_a_preset_is_composed_in_its_served_format():
    assert served("gpt-oss-20b") == (ServedFormat(experts="mxfp4"), {"qlinear": "torch", "moe": "naive"})
    assert served("deepseek-v3", device=CUDA) == (ServedFormat("fp8-b128", "fp8-b128"),
                                                  {"qlinear": "triton", "moe": "triton"})
    assert served("llama-3-8b") == (ServedFormat(), {"qlinear": "torch", "moe": "torch"})


def test_weights_override_the_served_format():
    assert served("gpt-oss-20b", "none")[0] == ServedFormat()
    assert served("gpt-oss-20b", "int4-g128")[0] == ServedFormat("int4-g128", "int4-g128")
    assert served("llama-3-8b", "fp8") == (ServedFormat("fp8-e4m3"), {"qlinear": "naive", "moe": "torch"})
    assert served("llama-3-8b", "int8")[1] == {"qlinear": "torch", "moe": "torch"}  # torch's int8 GEMM
    # impls the command line names stay
    assert served("gpt-oss-20b", impl=["moe=triton"])[1] == {"qlinear": "torch", "moe": "triton"}


def test_transformers_reference_needs_float_weights():
    with pytest.raises(UsageError, match="transformers' models have unquantized weights; gpt-oss-20b is composed"):
        served("gpt-oss-20b", reference=["transformers"])
    assert served("gpt-oss-20b", "none", reference=["transformers"])[0] == ServedFormat()
