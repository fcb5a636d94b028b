"""Bad input to `attention` raises a one-line ValueError that names the argument and the rule."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import attention

from ..reference import make_qkv


def good(**over):
    q, k, v = make_qkv(2, 4, 2, 3, 10, 16)
    args = dict(q=q, k=k, v=v, impl="naive", causal=False, scale=None, cache_seqlens=None)
    args.update(over)
    return args


def call(args):
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    return attention(q, k, v, **args)


q0, k0, v0 = make_qkv(2, 4, 2, 3, 10, 16)
BAD = {
    "rank": (dict(q=q0[0]), "q: must have rank 4"),
    "not-a-tensor": (dict(k=k0.numpy()), "k: must be a torch.Tensor"),
    "int-dtype": (dict(v=v0.to(torch.int32)), "v: must be a floating dtype"),
    "empty-dim": (dict(q=q0[:, :, :0]), "q: must not have an empty dimension"),
    "head-dim": (dict(k=torch.randn(2, 2, 10, 8), v=torch.randn(2, 2, 10, 8)), "k: head dim must equal"),
    "batch": (dict(k=k0[:1], v=v0[:1]), "k: batch must equal"),
    "heads-not-multiple": (dict(k=torch.randn(2, 3, 10, 16), v=torch.randn(2, 3, 10, 16)), r"Hq % Hkv == 0"),
    "k-v-shapes": (dict(v=v0[:, :, :5]), "v: shape must equal k's"),
    "dtype-mismatch": (dict(k=k0.double()), "k/v: dtype must match q"),
    "device-mismatch": (dict(v=v0.to("meta")), "k/v: device must match q"),
    "unknown-impl": (dict(impl="fastest"), "impl: unknown implementation 'fastest'"),
    "scale-negative": (dict(scale=-1.0), "scale: must be a positive finite number"),
    "scale-nan": (dict(scale=float("nan")), "scale: must be a positive finite number"),
    "causal-not-bool": (dict(causal="yes"), "causal: must be a bool"),
    "causal-q-longer": (dict(q=torch.randn(2, 4, 11, 16), causal=True), "q_len must not exceed kv_len"),
    "seqlens-length": (dict(cache_seqlens=torch.tensor([5], dtype=torch.int32)), r"must have shape \[B\]=\[2\]"),
    "seqlens-dtype": (dict(cache_seqlens=torch.tensor([5, 6])), "cache_seqlens: must have dtype int32"),
    "seqlens-list": (dict(cache_seqlens=[5, 6]), "cache_seqlens: must be an int32 tensor"),
    "seqlens-device": (dict(cache_seqlens=torch.tensor([5, 6], dtype=torch.int32, device="meta")),
                       "cache_seqlens: device must match q"),
    "seqlens-above-sk": (dict(cache_seqlens=torch.tensor([5, 11], dtype=torch.int32)),
                         r"cache_seqlens\[1\]=11 is above the KV length Sk=10"),
    "seqlens-zero": (dict(cache_seqlens=torch.tensor([0, 6], dtype=torch.int32)), r"cache_seqlens\[0\]=0 is below"),
    "seqlens-below-q-causal": (dict(causal=True, cache_seqlens=torch.tensor([2, 6], dtype=torch.int32)),
                               r"cache_seqlens\[0\]=2 is below q_len"),
}


@pytest.mark.parametrize("impl", ["naive", "flash", "triton"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_a_one_line_value_error(case, impl):
    over, message = BAD[case]
    args = good(**over)
    if case != "unknown-impl":
        args["impl"] = impl
    with pytest.raises(ValueError, match=message) as info:
        call(args)
    assert "\n" not in str(info.value)


def test_good_input_passes():
    out = call(good(causal=True, cache_seqlens=torch.tensor([3, 10], dtype=torch.int32), scale=0.3))
    assert out.shape == (2, 4, 3, 16)
