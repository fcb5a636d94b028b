"""Sliding windows (FlashInfer's window_left) and sinks (gpt-oss) on every attention implementation against the float64
reference: a window larger than the sequence, a window edge inside a key block, a window of the diagonal alone,
Sq = 2 and chunks, heads not a power of two, ragged and paged caches ending mid-page; keys outside every window never
read; bad arguments in one line; an impl that cannot honour them skipped with the reason."""

from __future__ import annotations

import zlib

import pytest
import torch
from phasebench.kernels import Unsupported, buffers, prepare, register
from phasebench.kernels.attention import flash
from phasebench.kernels.attention.request import validate
from phasebench.kernels.registry import OPS

from ...markers import COMPILED_IMPLS
from ..reference import assert_matches_reference, make_qkv, reference, to_pages
from .test_attention import Shape

IMPLS = ["naive", "flash", "triton", "flex"]

# name: (shape, window_left, sinks, page size)
SHAPES = {
    # 250 keys, the window's edge at key 149: inside the Triton key block [128, 192); GQA group 3
    "decode-edge-in-block": (Shape(1, 6, 2, 1, 250, 64, True), 100, True, 0),
    "decode-window-past-sequence": (Shape(1, 3, 1, 1, 130, 32, True), 1000, True, 0),
    "verify2-ragged": (Shape(3, 6, 2, 2, 130, 64, True, (130, 41, 2)), 37, True, 0),
    "prefill-edge": (Shape(1, 3, 1, 97, 97, 64, True), 16, True, 0),
    "chunk": (Shape(1, 4, 2, 40, 150, 32, True), 50, False, 0),
    "not-causal": (Shape(1, 2, 1, 33, 70, 32, False), 5, True, 0),
    "diagonal-only": (Shape(1, 2, 2, 20, 20, 32, True), 0, False, 0),
    "sinks-no-window": (Shape(2, 6, 3, 1, 90, 64, True), -1, True, 0),
    # pages of 16 (a key block spans four), lengths ending mid-page, one sequence shorter than its window
    "paged-decode-p16-ragged": (Shape(3, 6, 2, 1, 200, 64, True, (200, 77, 5)), 70, True, 16),
    "paged-verify2-p64": (Shape(2, 4, 2, 2, 200, 64, True), 63, True, 64),
}
LOW = {"decode-edge-in-block": (torch.float16,), "verify2-ragged": (torch.bfloat16,),
       "prefill-edge": (torch.bfloat16,), "paged-decode-p16-ragged": (torch.bfloat16,)}
# the default tier: every shape in fp32 on naive and SDPA (milliseconds), Triton's interpreter on the four that cover
# its paths (split-KV with the edge inside a block, Sq = 2 ragged, the tiled prefill, pages smaller than a block);
# the low-precision dtypes of every impl and the rest of Triton's in the slow tier (the gate's tests run bf16 too)
TRITON_DEFAULT = {"decode-edge-in-block", "verify2-ragged", "prefill-edge", "paged-decode-p16-ragged"}


def _marks(name, dtype, impl):
    slow = dtype != torch.float32 or (impl == "triton" and name not in TRITON_DEFAULT) or impl in COMPILED_IMPLS
    return [pytest.mark.slow] if slow else []


CASES = [pytest.param(name, dtype, impl, marks=_marks(name, dtype, impl), id=f"{name}-{str(dtype)[6:]}-{impl}")
         for name in SHAPES for dtype in (torch.float32, *LOW.get(name, ())) for impl in IMPLS]


def draw_sinks(q_heads: int, seed: int) -> torch.Tensor:
    """Sink logits that take a real share of the denominator (about the sum of exp of standard-normal logits)."""
    return torch.randn(q_heads, generator=torch.Generator().manual_seed(seed)) + 3.0


@pytest.mark.parametrize("name,dtype,impl", CASES)
def test_window_and_sinks_match_the_float64_reference(name, dtype, impl):
    shape, window, with_sinks, page = SHAPES[name]
    seed = zlib.crc32(name.encode())
    q, k, v = make_qkv(shape.batch, shape.q_heads, shape.kv_heads, shape.q_len, shape.kv_len, shape.head_dim,
                       dtype=dtype, seed=seed)
    sinks = draw_sinks(shape.q_heads, seed) if with_sinks else None
    seqlens = shape.seqlens or ((shape.kv_len,) * shape.batch if page else None)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    k_in, v_in, table = to_pages(k, v, page, seqlens, seed=seed) if page else (k, v, None)
    try:
        call = prepare(q, k_in, v_in, impl=impl, causal=shape.causal, cache_seqlens=lens, block_table=table,
                       window_left=window, sinks=sinks)
    except Unsupported as err:
        pytest.skip(f"{impl}: {err}")
    with buffers.poisoned():
        out = call.run()
    assert_matches_reference(out, q, k, v, causal=shape.causal, seqlens=shape.seqlens, window_left=window,
                             sinks=sinks)


def test_the_window_and_the_sink_change_the_output():
    # the reference itself: a window and a sink each move every row (not a check that cannot fail)
    q, k, v = make_qkv(1, 2, 1, 2, 90, 32, seed=3)
    plain = reference(q, k, v, causal=True)
    assert (reference(q, k, v, causal=True, window_left=30) - plain).abs().amax(dim=-1).min() > 1e-3
    assert (reference(q, k, v, causal=True, sinks=draw_sinks(2, 3)) - plain).abs().amax(dim=-1).min() > 1e-3
    assert torch.equal(reference(q, k, v, causal=True, window_left=89), plain)  # the window holds every key


@pytest.mark.parametrize("impl", ["flash", "triton"])
@pytest.mark.parametrize("q_len", [1, 40])
def test_keys_outside_every_window_are_never_read(impl, q_len):
    # NaN in K and V before the first key block any window reaches: a kernel that visits them (even masked: p = 0
    # times a NaN value is NaN) returns NaN; split-KV starts at block 192 of 64 keys, the chunk at 192 too
    window, kv_len = 100 if q_len == 1 else 30, 300
    q, k, v = make_qkv(1, 4, 2, q_len, kv_len, 64, seed=q_len)
    for t in (k, v):
        t[:, :, :192] = float("nan")
    with buffers.poisoned():
        out = prepare(q, k, v, impl=impl, causal=True, window_left=window).run()
    assert_matches_reference(out, q, k.nan_to_num(), v.nan_to_num(), causal=True, window_left=window)


@pytest.mark.parametrize("change, message", [
    (dict(sinks=torch.zeros(5)), r"sinks: must have shape \[Hq\]=\[6\]"),
    (dict(sinks=torch.zeros(6, dtype=torch.bfloat16)), "sinks: must have dtype float32"),
    (dict(sinks=[0.0] * 6), "sinks: must be a float32 tensor"),
    (dict(window_left=-2), "window_left: must be an int >= -1"),
    (dict(window_left=True), "window_left: must be an int >= -1"),
])
def test_bad_window_or_sinks_are_one_line(change, message):
    q, k, v = make_qkv(1, 6, 2, 1, 20, 32)
    with pytest.raises(ValueError, match=message) as err:
        validate(q, k, v, **change)
    assert "\n" not in str(err.value)


def test_an_impl_that_cannot_honour_them_is_skipped_with_the_reason():
    register("attention", "plain_softmax", lambda q, k, v, **kw: v[:, :1].expand_as(q).clone())
    try:
        q, k, v = make_qkv(1, 2, 1, 1, 20, 32)
        with pytest.raises(Unsupported, match="cannot honour a sliding window"):
            prepare(q, k, v, impl="plain_softmax", window_left=4)
        with pytest.raises(Unsupported, match="no attention-sink term"):
            prepare(q, k, v, impl="plain_softmax", sinks=torch.zeros(2))
    finally:
        del OPS["attention"]["plain_softmax"]


def test_a_declaring_plugin_gets_window_left_and_sinks():
    seen = {}

    def fn(q, k, v, *, causal, scale, cache_seqlens, **extra):
        seen.update(extra)
        return q.clone()

    register("attention", "takes_them", fn, window=True, sinks=True)
    try:
        q, k, v = make_qkv(1, 2, 1, 1, 20, 32)
        prepare(q, k, v, impl="takes_them").run()
        assert seen == {}  # requests without them pass neither (old plugins keep working)
        sinks = torch.zeros(2)
        prepare(q, k, v, impl="takes_them", window_left=4, sinks=sinks).run()
        assert seen["window_left"] == 4 and seen["sinks"] is sinks
    finally:
        del OPS["attention"]["takes_them"]


class FakeFlashAttn:
    """flash_attn's two entry points in BSHD, computed by the float64 test reference from the window_size they are
    given: the route's translation of window_left is what is checked."""

    __version__ = "fake"

    @staticmethod
    def _run(q, k, v, causal, softmax_scale, window_size, seqlens=None):
        left, right = window_size
        assert right == (0 if causal else -1) or left == -1
        out = reference(*(t.transpose(1, 2) for t in (q, k, v)), causal=causal, scale=softmax_scale,
                        seqlens=seqlens, window_left=left)
        return out.to(q.dtype).transpose(1, 2)

    def flash_attn_func(self, q, k, v, *, softmax_scale, causal, window_size):
        return self._run(q, k, v, causal, softmax_scale, window_size)

    def flash_attn_with_kvcache(self, q, k, v, *, cache_seqlens, softmax_scale, causal, window_size):
        lens = None if cache_seqlens is None else tuple(cache_seqlens.tolist())
        return self._run(q, k, v, causal, softmax_scale, window_size, lens)


@pytest.mark.parametrize("q_len, kv_len, causal", [(1, 90, True), (30, 30, True), (12, 50, False)])
def test_the_flash_attn_route_passes_the_window_as_flash_attn_defines_it(q_len, kv_len, causal):
    q, k, v = make_qkv(1, 4, 2, q_len, kv_len, 32, seed=q_len)
    req = validate(q, k, v, causal=causal, window_left=9)
    out = flash._flash_attn_route(req, FakeFlashAttn()).run()
    assert_matches_reference(out, q, k, v, causal=causal, window_left=9)
    with pytest.raises(Unsupported, match="no attention-sink term"):
        flash._flash_attn_route(validate(q, k, v, causal=causal, sinks=torch.zeros(4)), FakeFlashAttn())


@pytest.mark.cuda
def test_flash_attn_serves_a_window_on_cuda():
    if flash.flash_attn_module() is None:
        pytest.skip("flash_attn is not installed: its window route is checked against a fake module above")
    q, k, v = make_qkv(2, 8, 2, 1, 700, 64, dtype=torch.bfloat16, device="cuda")
    call = prepare(q, k, v, impl="flash", causal=True, window_left=127)
    assert call.backend.startswith("flash_attn")
    assert_matches_reference(call.run().cpu(), q.cpu(), k.cpu(), v.cpu(), causal=True, window_left=127)
