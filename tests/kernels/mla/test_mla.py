"""MLA decode on every implementation against the float64 reference: DeepSeek's 576/512 latent and small dims, Sq 1
and 2 (bottom-right causal), heads not a power of two, ragged and paged caches ending mid-page, forced split counts
with empty chunks; bad arguments in one line."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import available_impls, buffers, mla_decode, prepare_mla
from phasebench.kernels.mla.request import validate_mla
from phasebench.kernels.mla.triton_mla import mla_decode_triton

from ...markers import TRITON_DEVICE, tiered
from ..reference import max_error, reference, to_pages

IMPLS = ["naive", "torch", "triton", "flex"]
SCALE = 192 ** -0.5

# name: (batch, q_heads, q_len, kv_len, latent dim, value dim, seqlens, page size)
SHAPES = {
    "deepseek-dims-mtp": (1, 3, 2, 40, 576, 512, None, 0),
    "ragged-5-heads": (2, 5, 1, 70, 48, 32, (70, 17), 0),
    "mtp-ragged-16-heads": (3, 16, 2, 33, 80, 64, (33, 2, 20), 0),
    "paged-p16-mid-page": (3, 6, 1, 70, 48, 32, (70, 5, 33), 16),
    "paged-p64-mtp": (2, 4, 2, 100, 80, 64, (100, 65), 64),
}
LOW = {"deepseek-dims-mtp": (torch.bfloat16,), "paged-p16-mid-page": (torch.bfloat16,),
       "ragged-5-heads": (torch.float16,)}
CASES = [(name, dtype) for name in SHAPES for dtype in (torch.float32, *LOW.get(name, ()))]


def mla_inputs(name, dtype, seed=0):
    b, hq, sq, sk, d, dv, seqlens, page = SHAPES[name]
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((b, hq, sq, d), generator=gen).to(dtype)
    latent = torch.randn((b, 1, sk, d), generator=gen).to(dtype)
    return q, latent, dv, seqlens, page


def check(out, q, latent, dv, seqlens):
    """fp32: relative error <= 1e-4; bf16: at most twice the same naive math's in bf16 (the kernel tests' rule)."""
    assert out.shape == (*q.shape[:3], dv) and out.dtype == q.dtype and torch.isfinite(out).all()
    value = latent[..., :dv]
    exact = reference(q, latent, value, causal=True, scale=SCALE, seqlens=seqlens)
    err = max_error(out, exact)
    if q.dtype == torch.float32:
        assert err / exact.abs().max().item() <= 1e-4
    else:
        low = reference(q, latent, value, causal=True, scale=SCALE, seqlens=seqlens, dtype=q.dtype)
        assert err <= 2 * max_error(low, exact) + 1e-5


@pytest.mark.parametrize("impl", tiered(IMPLS))
@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_mla_matches_the_float64_reference(name, dtype, impl):
    q, latent, dv, seqlens, page = mla_inputs(name, dtype, seed=len(name))
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    cache, table = (latent, None) if not page else to_pages(latent, latent, page, seqlens, seed=3)[::2]
    call = prepare_mla(q, cache, impl=impl, scale=SCALE, v_dim=dv, cache_seqlens=lens, block_table=table)
    with buffers.poisoned():
        out = call.run()
    check(out, q, latent, dv, seqlens)


@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_triton_split_counts_with_empty_chunks(num_splits):
    # 7 splits of 17 keys in blocks of 16 leave empty chunks
    q, latent, dv, _, _ = mla_inputs("ragged-5-heads", torch.float32, seed=num_splits)
    lens = torch.tensor((70, 17), dtype=torch.int32)
    req = validate_mla(q.to(TRITON_DEVICE), latent.to(TRITON_DEVICE), scale=SCALE, v_dim=dv,
                       cache_seqlens=lens.to(TRITON_DEVICE))
    with buffers.poisoned():
        out = mla_decode_triton(req, num_splits=num_splits)
    check(out.cpu(), q, latent, dv, (70, 17))


@pytest.mark.parametrize("change, message", [
    (dict(q=torch.zeros(1, 4, 1, 512)), r"q: head dim must be the latent's \(576"),
    (dict(latent=torch.zeros(1, 2, 30, 576)), "latent: must hold one latent head per token"),
    (dict(v_dim=576), r"v_dim: must be an int in \[1, 575\]"),
    (dict(q=torch.zeros(1, 4, 3, 576)), "q: must hold 1 or 2 query tokens"),
    (dict(scale=None), "scale: must be a positive finite number"),
    (dict(latent=torch.zeros(1, 1, 30, 576, dtype=torch.bfloat16)), "k/v: dtype must match q"),
])
def test_bad_mla_arguments_are_one_line(change, message):
    args = dict(q=torch.zeros(1, 4, 1, 576), latent=torch.zeros(1, 1, 30, 576), scale=SCALE, v_dim=512)
    args.update(change)
    with pytest.raises(ValueError, match=message) as err:
        mla_decode(args.pop("q"), args.pop("latent"), impl="naive", **args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("impl", tiered(name for name in available_impls("cpu", op="mla") if name in IMPLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("page", [0, 16], ids=["ragged", "paged-p16"])
def test_nan_past_each_length_never_reaches_the_output(page, dtype, impl):
    # a server's latent pool past each length (the tail of each last page, spare pages) holds NaN, as in FlashMLA's
    # own test: the output must match the reference of the clean cache
    seqlens = (37, 5, 60)
    gen = torch.Generator().manual_seed(page + 7)
    q = torch.randn((3, 16, 1, 576), generator=gen).to(dtype)
    latent = torch.randn((3, 1, 64, 576), generator=gen).to(dtype)
    if page:
        cache, _, table = to_pages(latent, latent, page, seqlens, seed=5)
        for b, n in enumerate(seqlens):
            cache[table[b, (n - 1) // page], n - (n - 1) // page * page:] = float("nan")
    else:
        cache, table = latent.clone(), None
        for b, n in enumerate(seqlens):
            cache[b, :, n:] = float("nan")
    assert torch.isnan(cache).any()
    with buffers.poisoned():
        out = mla_decode(q, cache, impl=impl, scale=SCALE, v_dim=512, block_table=table,
                         cache_seqlens=torch.tensor(seqlens, dtype=torch.int32))
    check(out, q, latent, 512, seqlens)
