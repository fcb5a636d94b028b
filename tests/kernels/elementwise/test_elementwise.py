"""The elementwise facade: each kind against an independent float64 formula at awkward sizes, bad input, plugins."""

from __future__ import annotations

import phasebench.kernels as kernels
import pytest
import torch
from phasebench.kernels import Unsupported, available_impls, prepare_elementwise, register
from phasebench.kernels.registry import OPS

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = [torch.float32, torch.bfloat16]
BASE, EPS = 500000.0, 1e-6


def randn(gen, *shape, dtype, device):
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def rel_err(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def draw(kind, m, dtype, device, seed):
    """The kind's arguments at awkward sizes: H 4097, I 200, 6 q and 2 kv heads of dim 80, a cache of 1025 rows."""
    gen = torch.Generator().manual_seed(seed)
    positions = torch.arange(1025 - m, 1025, device=device)
    r = lambda *shape: randn(gen, *shape, dtype=dtype, device=device)  # noqa: E731
    return {
        "rmsnorm": lambda: (r(m, 4097), r(4097).add_(1)),
        "residual_add": lambda: (r(m, 4097), r(m, 4097)),
        "silu_mul": lambda: (r(m, 400),),
        "rotary": lambda: (r(m, 6, 80), r(m, 2, 80), positions),
        "kv_append": lambda: (r(1025, 2, 80), r(1025, 2, 80), r(m, 2, 80), r(m, 2, 80), positions),
        "greedy_pick": lambda: (r(m, 4097),),
        "add_rmsnorm": lambda: (r(m, 4097), r(m, 4097), r(4097).add_(1)),
    }[kind]()


def angles(positions, d):
    """The convention's angles: fp32 positions times the fp32-rounded frequencies base**(-2i/D), in fp32."""
    freq = torch.tensor([BASE ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64).float()
    return positions.cpu().float()[:, None] * freq[None, :]


def rope(x, ang, dtype):
    """Rotate-half RoPE with the math done in `dtype` (float64: the reference; bf16: the naive baseline)."""
    x, c, s = x.cpu().to(dtype), ang.cos().to(dtype)[:, None], ang.sin().to(dtype)[:, None]
    d = x.shape[-1] // 2
    return torch.cat((x[..., :d] * c - x[..., d:] * s, x[..., d:] * c + x[..., :d] * s), dim=-1)


def formula(kind, args, dtype):
    """Each kind written out in `dtype` on the host: float64 is the reference, the model dtype the naive baseline."""
    t = [a.cpu().to(dtype) if a.is_floating_point() else a.cpu() for a in args]
    if kind == "rmsnorm":
        return t[0] / torch.sqrt((t[0] * t[0]).mean(dim=1, keepdim=True) + EPS) * t[1]
    if kind == "residual_add":
        return t[0] + t[1]
    if kind == "silu_mul":
        g, u = t[0].chunk(2, dim=1)
        return g * torch.sigmoid(g) * u
    if kind == "rotary":
        ang = angles(t[2], t[0].shape[-1]).double()
        return torch.cat((rope(t[0], ang, dtype).flatten(), rope(t[1], ang, dtype).flatten()))
    if kind == "add_rmsnorm":  # the sum rounded to the dtype, then the norm of it
        s = t[0] + t[1]
        return torch.cat(((s / torch.sqrt((s * s).mean(dim=1, keepdim=True) + EPS) * t[2]).flatten(), s.flatten()))
    raise AssertionError(kind)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,m", [("rmsnorm", 1), ("rmsnorm", 97), ("residual_add", 3), ("silu_mul", 1),
                                    ("silu_mul", 97), ("rotary", 1), ("rotary", 97), ("add_rmsnorm", 1),
                                    ("add_rmsnorm", 97)])
def test_float_kinds_match_a_float64_formula(device, dtype, kind, m):
    args = draw(kind, m, dtype, device, seed=m * 7 + len(kind))
    out = kernels.elementwise(kind, *args)
    out = torch.cat((out[0].flatten(), out[1].flatten())) if kind in ("rotary", "add_rmsnorm") else out
    assert out.dtype == dtype and out.device == args[0].device
    assert out.shape == formula(kind, args, torch.float64).shape
    err = rel_err(out.cpu(), formula(kind, args, torch.float64))
    if dtype == torch.float32:
        assert err <= 1e-4
    else:  # at most twice the error of the same math done in the dtype
        assert err <= 2 * rel_err(formula(kind, args, dtype), formula(kind, args, torch.float64)) + 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 97])
def test_kv_append_writes_exactly_the_rows_at_the_positions_in_place(device, dtype, m):
    cache_k, cache_v, k, v, positions = draw("kv_append", m, dtype, device, seed=m)
    before_k, before_v = cache_k.clone(), cache_v.clone()
    out = kernels.elementwise("kv_append", cache_k, cache_v, k, v, positions)
    assert out[0] is cache_k and out[1] is cache_v
    assert torch.equal(cache_k[positions], k) and torch.equal(cache_v[positions], v)
    rest = torch.ones(1025, dtype=torch.bool, device=device)
    rest[positions] = False
    assert torch.equal(cache_k[rest], before_k[rest]) and torch.equal(cache_v[rest], before_v[rest])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 97])
def test_greedy_pick_returns_a_largest_logit_per_row(device, dtype, m):
    (logits,) = draw("greedy_pick", m, dtype, device, seed=m + 11)
    picked = kernels.elementwise("greedy_pick", logits)
    assert picked.dtype == torch.int64 and picked.shape == (m,) and picked.device == logits.device
    wide = logits.cpu().double()
    assert torch.equal(wide.gather(1, picked.cpu()[:, None]).squeeze(1), wide.max(dim=1).values)  # ties are fine
    if dtype == torch.float32:  # random fp32 logits have one maximum per row: the index itself must agree
        assert torch.equal(picked.cpu(), wide.argmax(dim=1))


def test_rotary_keeps_each_pair_norm_and_is_the_identity_at_position_zero():
    q, k, _ = draw("rotary", 3, torch.float32, "cpu", seed=5)
    q_rot, k_rot = kernels.elementwise("rotary", q, k, torch.tensor([0, 1, 1024]), base=10000.0)
    assert torch.equal(q_rot[0], q[0]) and torch.equal(k_rot[0], k[0])
    pair_norm = lambda x: x[..., :40] ** 2 + x[..., 40:] ** 2  # noqa: E731  (rotate-half pairs i and i + D/2)
    assert torch.allclose(pair_norm(q_rot), pair_norm(q), rtol=1e-5, atol=1e-5)
    assert torch.allclose(pair_norm(k_rot), pair_norm(k), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(q_rot[2], q[2], atol=1e-2)  # position 1024 does rotate


def test_options_reach_the_math_and_backend_is_named():
    x, w = draw("rmsnorm", 3, torch.float32, "cpu", seed=2)
    call = prepare_elementwise("rmsnorm", x * 1e-4, w, eps=1.0)
    assert call.backend == "torch-eager"
    assert rel_err(call.run(), formula("rmsnorm", (x * 1e-4, w), torch.float64)) > 0.5  # eps=1 damps tiny x
    assert "torch" in available_impls("cpu", op="elementwise")


@pytest.mark.parametrize("kind,args,options,message", [
    ("layernorm", (torch.randn(3, 4),), {}, "kind: unknown elementwise kind 'layernorm'"),
    ("rmsnorm", (torch.randn(3, 4),), {}, "rmsnorm: takes 2 tensors \\(x, weight\\), got 1"),
    ("rmsnorm", (torch.randn(3, 4), torch.randn(5)), {}, "weight: must be \\[H\\] with H = x's 4"),
    ("rmsnorm", (torch.randn(3, 4), torch.randn(4)), {"eps": -1.0}, "eps: must be a positive finite number"),
    ("rmsnorm", (torch.randn(3, 4), torch.randn(4)), {"base": 1.0}, "rmsnorm: unknown option 'base' \\(takes eps\\)"),
    ("residual_add", (torch.randn(3, 4), torch.randn(3, 4).double()), {}, "residual: dtype must match x"),
    ("residual_add", (torch.randn(3, 4), torch.randn(4, 3)), {}, "residual: must have x's shape"),
    ("silu_mul", (torch.randn(3, 5),), {}, "gate_up: its last dimension must be even"),
    ("silu_mul", (torch.randn(6, 3).T,), {}, "gate_up: its last dimension must be contiguous"),
    ("silu_mul", (torch.randn(3, 4).int(),), {}, "gate_up: must be a floating dtype"),
    ("silu_mul", (torch.randn(0, 4),), {}, "gate_up: must not have an empty dimension"),
    ("rotary", (torch.randn(3, 6, 8), torch.randn(2, 2, 8), torch.arange(3)), {}, "k: must be \\[M, Hkv, D\\]"),
    ("rotary", (torch.randn(3, 6, 7), torch.randn(3, 2, 7), torch.arange(3)), {}, "q: head dim must be even"),
    ("rotary", (torch.randn(3, 6, 8), torch.randn(3, 2, 8), torch.arange(3).int()), {}, "positions: must be int64"),
    ("rotary", (torch.randn(3, 6, 8), torch.randn(3, 2, 8), torch.arange(4)), {}, "positions: must be \\[M\\]"),
    ("kv_append", (torch.randn(9, 2, 8), torch.randn(9, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8),
                   torch.tensor([0, 4, 9])), {}, "positions: must lie in \\[0, 9\\)"),
    ("kv_append", (torch.randn(9, 2, 8), torch.randn(9, 2, 8), torch.randn(3, 1, 8), torch.randn(3, 1, 8),
                   torch.arange(3)), {}, "k, v: must be \\[M, Hkv, D\\] with the cache's Hkv, D"),
    ("greedy_pick", ([[1.0, 2.0]],), {}, "logits: must be a torch.Tensor, got list"),
    ("greedy_pick", (torch.randn(3),), {}, "logits: must have rank 2 \\(\\[M, V\\]\\)"),
])
def test_bad_input_is_one_line(kind, args, options, message):
    with pytest.raises(ValueError, match=message) as info:
        kernels.elementwise(kind, *args, **options)
    assert "\n" not in str(info.value)


def test_unknown_impl_and_unsupported_dtype():
    with pytest.raises(ValueError, match="impl: unknown implementation 'fastest' of elementwise"):
        kernels.elementwise("silu_mul", torch.randn(3, 4), impl="fastest")
    with pytest.raises(Unsupported, match="does not support dtype torch.float64"):
        kernels.elementwise("silu_mul", torch.randn(3, 4, dtype=torch.float64))


def test_an_elementwise_plugin_registers_and_gets_the_kind_tensors_and_options():
    seen = []

    def scaled_only(kind, *tensors, **options):
        """A plugin serving rmsnorm alone."""
        seen.append((kind, len(tensors), options))
        if kind != "rmsnorm":
            raise Unsupported(f"scaled_only serves rmsnorm, not {kind}")
        return kernels.elementwise(kind, *tensors, **options)

    register("elementwise", "scaled_only", scaled_only, dtypes=("float32",))
    try:
        x, w = draw("rmsnorm", 3, torch.float32, "cpu", seed=4)
        mine = kernels.elementwise("rmsnorm", x, w, impl="scaled_only")
        assert torch.equal(mine, kernels.elementwise("rmsnorm", x, w))
        assert seen[-1] == ("rmsnorm", 2, {"eps": EPS})
        assert prepare_elementwise("rmsnorm", x, w, impl="scaled_only").backend.startswith("plugin:")
        with pytest.raises(Unsupported, match="serves rmsnorm, not silu_mul"):
            kernels.elementwise("silu_mul", torch.randn(3, 4), impl="scaled_only")
        with pytest.raises(ValueError, match="'torch' is a built-in elementwise implementation"):
            register("elementwise", "torch", scaled_only)
    finally:
        OPS["elementwise"].pop("scaled_only", None)
