"""The autotuner's winners read back per kernel and tuning key, with the dtypes of the tensor arguments."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from phasebench.kernels import autotune  # noqa: E402
from phasebench.kernels.attention import triton_decode  # noqa: E402


def test_winners_name_the_key_values_dtypes_and_config(monkeypatch):
    tuner = triton_decode.split_kv_kernel_tuned
    assert list(tuner.keys) == ["kv_len", "group", "q_len", "num_splits", "BLOCK_D", "HAS_SEQLENS", "PAGE_SIZE",
                                "HAS_WINDOW", "KV_FP8"]
    chosen = triton_decode.TUNING_CONFIGS[2]
    # the tuple the autotuner files a winner under: the key values in order, then each tensor argument's dtype
    key = (65536, 4, 1, 33, 128, False, 16, True, False, "torch.bfloat16", "torch.bfloat16", "torch.bfloat16",
           "torch.int32")
    monkeypatch.setitem(tuner.cache, key, chosen)
    found = [r for r in autotune.autotune_winners() if r["kernel"] == "split_kv_kernel" and r["key"]["kv_len"] == 65536]
    assert found == [{"kernel": "split_kv_kernel",
                      "key": {"kv_len": 65536, "group": 4, "q_len": 1, "num_splits": 33, "BLOCK_D": 128,
                              "HAS_SEQLENS": False, "PAGE_SIZE": 16, "HAS_WINDOW": True, "KV_FP8": False},
                      "dtypes": ["torch.bfloat16"] * 3 + ["torch.int32"],
                      "config": {"BLOCK_N": chosen.kwargs["BLOCK_N"], "num_warps": chosen.num_warps,
                                 "num_stages": chosen.num_stages}}]


def test_every_tuned_kernel_is_listed():
    assert set(autotune.tuned_kernels()) == {"prefill_kernel", "split_kv_kernel", "gemm_kernel", "splitk_gemv_kernel",
                                             "mla_split_kernel"}
    for tuner in autotune.tuned_kernels().values():
        assert hasattr(tuner, "cache") and hasattr(tuner, "keys") and len(tuner.configs) > 1
