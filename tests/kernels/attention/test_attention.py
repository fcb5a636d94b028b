"""Every implementation against the float64 reference, over the shape classes of inference."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

import pytest
import torch
from phasebench.kernels import Unsupported, buffers, prepare

from ...markers import tiered
from ..reference import assert_matches_reference, make_qkv

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
IMPLS = ["naive", "flash", "triton", "flex"]


@dataclass(frozen=True)
class Shape:
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool
    seqlens: tuple[int, ...] | None = None


SHAPES = {
    "prefill": Shape(2, 4, 4, 97, 97, 64, False),
    "prefill-causal": Shape(2, 4, 4, 97, 97, 64, True),
    "prefill-gqa-causal-d80": Shape(1, 6, 2, 17, 17, 80, True),
    "prefill-mqa": Shape(1, 4, 1, 33, 70, 64, False),
    "prefill-seq1": Shape(3, 2, 2, 1, 1, 64, True),
    "prefill-1025-causal": Shape(1, 2, 1, 1025, 1025, 32, True),
    "chunked-causal": Shape(1, 4, 2, 97, 300, 64, True),
    "chunked-causal-d96": Shape(2, 2, 1, 40, 129, 96, True),
    "verify-2": Shape(2, 8, 2, 2, 200, 64, True),
    "verify-8-mqa": Shape(1, 8, 1, 8, 157, 128, True),
    "decode-long": Shape(2, 8, 2, 1, 1000, 128, False),
    "decode-mha-d80": Shape(3, 4, 4, 1, 513, 80, True),
    "decode-ragged": Shape(4, 8, 2, 1, 1000, 64, False, (1000, 1, 517, 64)),
    "verify-ragged-causal": Shape(3, 4, 1, 4, 300, 64, True, (300, 4, 131)),
    "prefill-ragged": Shape(2, 2, 2, 17, 97, 64, False, (97, 1)),
    "head-dim-256": Shape(1, 2, 1, 20, 45, 256, True),
}
# the long shapes run in fp32 only: the interpreter is slow and they test indexing, not rounding
FP32_ONLY = {"prefill-1025-causal", "decode-long", "decode-ragged"}
CASES = [(name, dtype) for name in SHAPES for dtype in (torch.float32, torch.float16, torch.bfloat16)
         if dtype == torch.float32 or name not in FP32_ONLY]


def run_case(shape: Shape, impl: str, dtype: torch.dtype, device: str, seed: int):
    q, k, v = make_qkv(shape.batch, shape.q_heads, shape.kv_heads, shape.q_len, shape.kv_len, shape.head_dim,
                       dtype=dtype, device=device, seed=seed)
    lens = None if shape.seqlens is None else torch.tensor(shape.seqlens, dtype=torch.int32, device=device)
    try:
        call = prepare(q, k, v, impl=impl, causal=shape.causal, cache_seqlens=lens)
    except Unsupported as err:
        pytest.skip(f"{impl} on {device}: {err}")
    with buffers.poisoned():
        out = call.run()
    assert_matches_reference(out.cpu(), q.cpu(), k.cpu(), v.cpu(), causal=shape.causal, seqlens=shape.seqlens)
    return call


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", tiered(IMPLS))
@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_matches_float64_reference(name, dtype, impl, device):
    run_case(SHAPES[name], impl, dtype, device, seed=zlib.crc32(name.encode()))


def random_shape(rng: random.Random, phase: str) -> Shape:
    """A shape of the given class with sizes drawn at random: cases no hand-written test fixed."""
    kv_heads = rng.choice([1, 2, 3])
    q_heads = kv_heads * rng.choice([1, 2, 4])
    head_dim = rng.choice([16, 40, 64, 80, 96, 112, 128])
    batch = rng.randint(1, 3)
    if phase == "prefill":
        s = rng.randint(1, 200)
        return Shape(batch, q_heads, kv_heads, s, s, head_dim, rng.random() < 0.5)
    if phase == "chunked":
        kv = rng.randint(2, 300)
        return Shape(batch, q_heads, kv_heads, rng.randint(1, kv), kv, head_dim, True)
    kv = rng.randint(1, 700)
    q_len = rng.choice([1, 1, 2, 5])
    lens = tuple(rng.randint(q_len, kv) for _ in range(batch)) if rng.random() < 0.5 and kv >= q_len else None
    return Shape(batch, q_heads, kv_heads, q_len, max(kv, q_len), head_dim, True, lens)


@pytest.mark.parametrize("impl", tiered(IMPLS))
@pytest.mark.parametrize("phase", ["prefill", "chunked", "decode"])
@pytest.mark.parametrize("seed", [11, 12])
def test_random_shapes_of_each_class(phase, seed, impl):
    shape = random_shape(random.Random(f"{phase}-{seed}"), phase)
    dtype = [torch.float32, torch.bfloat16][seed % 2]
    run_case(shape, impl, dtype, "cpu", seed)


def test_backend_names_describe_the_route():
    q, k, v = make_qkv(2, 4, 2, 5, 40, 64)
    lens = torch.tensor([40, 9], dtype=torch.int32)
    assert prepare(q, k, v, impl="naive").backend == "torch-matmul"
    assert prepare(q, k, v, impl="flash", causal=True).backend.endswith("+lower-right")
    assert prepare(q, k, v, impl="flash", cache_seqlens=lens).backend.endswith("+per-seq")
    assert prepare(q[:, :, :1], k, v, impl="triton").backend.startswith("triton-splitkv")
    q_long, k_long, v_long = make_qkv(1, 2, 2, 40, 40, 64)
    assert prepare(q_long, k_long, v_long, impl="triton").backend.startswith("triton-prefill")
