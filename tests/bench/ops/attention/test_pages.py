"""Paged cases in the harness: shuffled seeded pools, the reference read back through the table, the cost and the
memory charge, and the gate, which records a kernel that ignores the block table as incorrect."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from phasebench.bench.instruments.timing import TimerConfig
from phasebench.bench.ops.attention import baseline, cost, inputs, memory, pages, reference
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.sweep import runner
from phasebench.kernels import attention, register, triton_mode
from phasebench.kernels.registry import OPS

CPU = torch.device("cpu")
FAST = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=2, max_samples=2, flush_l2=False)


def paged(page=16, **over):
    args = dict(batch=3, q_heads=4, kv_heads=2, q_len=1, kv_len=100, head_dim=32, causal=True, dtype="float32",
                seqlens=(100, 1, 47), page_size=page)
    return AttentionCase(**{**args, **over})


def test_the_pool_is_a_seeded_shuffled_permutation_of_every_sequences_pages():
    case = paged(batch=4, kv_len=200, seqlens=(200, 1, 16, 90))  # 13, 1, 1 and 6 pages
    x = inputs.make_inputs(case, CPU, seed=3)
    assert x.k.shape == x.v.shape == (22, 16, 2, 32) and x.block_table.shape == (4, 13)  # 21 pages and a spare
    assert x.block_table.dtype == torch.int32 and x.cache_seqlens.tolist() == [200, 1, 16, 90]
    used = torch.cat([x.block_table[b, :n] for b, n in enumerate(case.pages)])
    spare = sorted(set(range(22)) - set(used.tolist()))
    assert len(spare) == 1 and len(set(used.tolist())) == 21  # each page held by one sequence, one held by none
    assert used.tolist() != sorted(used.tolist())  # not in order
    assert all((x.block_table[b, n:] == spare[0]).all() for b, n in enumerate(case.pages))  # past: the spare
    poisoned = x.k.clone()
    inputs.fill_past_the_end(case, (poisoned,), x.block_table)
    assert poisoned[spare[0]].isnan().all()  # the gate's NaN: a kernel that reads through a padding entry fails
    again = inputs.make_inputs(case, CPU, seed=3)
    assert torch.equal(again.block_table, x.block_table) and torch.equal(again.k, x.k)
    assert not torch.equal(inputs.make_inputs(case, CPU, seed=4).block_table, x.block_table)


def test_keys_in_order_follow_the_table():
    case = paged(page=16)
    x = inputs.make_inputs(case, CPU, seed=1)
    k, v = pages.keys_in_order(x, case, 5, 40)
    for b in range(case.batch):
        for j in range(5, 40):
            page, slot = int(x.block_table[b, j // 16]), j % 16
            assert torch.equal(k[b, :, j - 5], x.k[page, slot]) and torch.equal(v[b, :, j - 5], x.v[page, slot])


@pytest.mark.parametrize("page,q_len", [(16, 1), (64, 1), (16, 5)])
def test_the_reference_of_a_paged_case_is_that_of_its_keys_in_order(page, q_len, monkeypatch):
    monkeypatch.setattr(reference, "REFERENCE_SCORE_BYTES", 1 << 14)  # several key chunks, each gathered on its own
    case = paged(page=page, q_len=q_len, seqlens=(100, q_len, 47))
    x = inputs.make_inputs(case, CPU, seed=2)
    k, v = pages.keys_in_order(x, case, 0, case.kv_len)
    dense = dataclasses.replace(case, page_size=0)
    expected = reference.reference(dense, inputs.CaseInputs(x.q, k.contiguous(), v.contiguous(), x.cache_seqlens), CPU)
    assert torch.allclose(reference.reference(case, x, CPU), expected, rtol=0, atol=1e-12)
    half = dataclasses.replace(case, dtype="bfloat16")
    xh = inputs.make_inputs(half, CPU, seed=2)
    err = baseline.baseline_error(half, xh, reference.reference(half, xh, CPU))
    assert 0 < err < 0.01  # the same math in bf16, read through the table too


def test_cost_adds_the_block_table_reads_to_the_contiguous_bytes():
    case, dense = paged(page=16), paged(page=0)
    assert cost.flops(case) == cost.flops(dense)
    assert case.pages == (7, 1, 3)
    assert cost.min_bytes(case) == cost.min_bytes(dense) + 4 * 11
    # the same K/V bytes at every page size: their GB/s compare directly
    assert cost.min_bytes(paged(page=256)) == cost.min_bytes(dense) + 4 * 3


def test_memory_charges_the_pools_and_the_gather_routes():
    case, dense = paged(page=16), paged(page=0)
    elem, d = 4, 32
    pool = 2 * (11 + 1) * 16 * 2 * d * elem + 4 * 3 * 7  # 11 pages held and the spare
    assert memory.input_bytes(case) == memory.input_bytes(dense) - 2 * 3 * 2 * 100 * d * elem + pool
    gather = 3 * 2 * 100 * (2 * d * elem + 8)
    assert memory.impl_bytes(case, "naive", CPU) == memory.impl_bytes(dense, "naive", CPU) + gather
    assert memory.impl_bytes(case, "flash", CPU) == memory.impl_bytes(dense, "flash", CPU) + gather
    assert memory.impl_bytes(case, "triton", CPU) == memory.impl_bytes(dense, "triton", CPU)


def reads_pages_in_pool_order(q, k, v, *, causal, scale, cache_seqlens, block_table):
    """Ignores the block table: takes sequence b's pages to be the pool's pages in order, from b * max_pages."""
    in_order = torch.arange(block_table.numel(), dtype=torch.int32).view(block_table.shape) % k.shape[0]
    return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens,
                     block_table=in_order)


@pytest.fixture
def table_ignoring_kernel():
    register("attention", "ignores_table", reads_pages_in_pool_order, paged=True, dtypes=("float32", "bfloat16"))
    yield "ignores_table"
    OPS["attention"].pop("ignores_table", None)


def test_the_gate_records_a_kernel_that_ignores_the_block_table_as_incorrect(tmp_path, table_ignoring_kernel):
    cases = [paged(page=16), paged(page=64, dtype="bfloat16", seqlens=None, kv_len=128, batch=2)]
    impls = ["naive", "flash", table_ignoring_kernel] + (["triton"] if triton_mode.interpreted() else [])
    df = runner.run(runner.RunConfig(cases, impls, CPU, tmp_path, suite="test", detect_contention=False, timer=FAST))
    for r in df.itertuples():
        assert r.page_size in (16, 64) and "page" in r.shape
        if r.impl == table_ignoring_kernel:
            assert r.status == "incorrect" and math.isnan(r.latency_ms), (r.page_size, r.reason)
            assert r.backend.startswith("plugin:")
        else:
            assert r.status == "ok", (r.impl, r.page_size, r.reason)
            assert r.backend.startswith("gather+") or r.backend.startswith("triton-splitkv+paged")
    assert len(df) == len(cases) * len(impls)


def test_the_gate_fills_nan_where_no_sequence_holds_a_key():
    case = paged(batch=4, kv_len=200, seqlens=(200, 1, 16, 90))  # tails of 8, 15 and 6 slots; pages 1 and 16 full
    x = inputs.make_inputs(case, CPU, seed=3)
    spare = torch.ones((2, *x.k.shape[1:]))  # two pages no table entry names, as a server's free list holds
    x = dataclasses.replace(x, k=torch.cat([x.k, spare]), v=torch.cat([x.v, spare]))
    clean = (x.k.clone(), x.v.clone())
    inputs.poison_unread(case, x)
    for pool, before in zip((x.k, x.v), clean, strict=True):
        held = torch.isfinite(pool).all(dim=(2, 3))  # [pages, slots]
        assert held.sum().item() == sum(case.lengths) and torch.isnan(pool[~held]).all()
        assert torch.isnan(pool[-2:]).all()
        assert torch.equal(pool[held], before[held])
    k, v = pages.keys_in_order(x, case, 0, case.kv_len)
    for b, n in enumerate(case.lengths):  # every key of every length as it was; everything past each NaN
        assert torch.isfinite(k[b, :, :n]).all() and torch.isfinite(v[b, :, :n]).all()
        assert torch.isnan(k[b, :, n:(n + 15) // 16 * 16]).all()


def test_a_ragged_contiguous_cache_gets_nan_past_each_length_and_a_full_one_none():
    case = AttentionCase(3, 4, 2, 1, 100, 32, True, "bfloat16", seqlens=(100, 1, 47))
    x = inputs.make_inputs(case, CPU, seed=5)
    inputs.poison_unread(case, x)
    for b, n in enumerate(case.lengths):
        for t in (x.k, x.v):
            assert torch.isfinite(t[b, :, :n]).all() and torch.isnan(t[b, :, n:]).all()
    dense = dataclasses.replace(case, seqlens=None)
    y = inputs.make_inputs(dense, CPU, seed=5)
    inputs.poison_unread(dense, y)
    assert torch.isfinite(y.k).all() and torch.isfinite(y.v).all()
