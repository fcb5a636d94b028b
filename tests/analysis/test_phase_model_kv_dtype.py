"""An fp8 KV cache in the phase model: the decode calls that read a cached prefix (attention of a few query tokens,
MLA's absorbed decode) take the rows of that cache, never rows in the dtype, and the sweep sets the TPOT over a cache
in the dtype beside it."""

from __future__ import annotations

import pytest
from phasebench.analysis.phases import model as pm
from phasebench.bench.spec import steps as step_defs

from ..bench.spec.test_steps import MLA
from .phase_rows import TINY, op_rows
from .test_phase_model import hand_tpot, power_latency


def latency(use):  # an fp8 cache's attention half as long: it reads half the bytes
    return power_latency(use) / (2 if use.field_dict.get("kv_dtype") else 1)


def test_only_the_calls_that_read_the_cache_take_the_kv_dtype():
    decode = step_defs.with_kv_dtype(step_defs.decode_step(TINY, 2, 40), "fp8")
    assert [u.field_dict.get("kv_dtype") for u in decode if u.op == "attention"] == ["fp8"]
    assert all("kv_dtype" not in u.field_dict for u in decode if u.op != "attention")
    verify = step_defs.with_kv_dtype(step_defs.verify_step(TINY, 2, 40, 3), "fp8")
    assert [u.field_dict.get("kv_dtype") for u in verify if u.op == "attention"] == ["fp8"]
    prompt = step_defs.with_kv_dtype(step_defs.prefill_step(TINY, 64), "fp8")
    assert all("kv_dtype" not in u.field_dict for u in prompt)  # a prompt's attention reads no cached prefix
    chunk = step_defs.with_kv_dtype(step_defs.hybrid_step(TINY, 4, 40, 32, 32, True), "fp8")
    assert [u.field_dict.get("kv_dtype") for u in chunk if u.op == "attention"] == ["fp8", None]
    assert step_defs.with_kv_dtype(decode, "") is decode
    small_chunk = step_defs.with_kv_dtype(step_defs.hybrid_step(TINY, 4, 40, 5, 11, False), "fp8")
    assert [u.field_dict.get("kv_dtype") for u in small_chunk if u.op == "attention"] == ["fp8", None]
    alone = step_defs.with_kv_dtype(step_defs.hybrid_step(TINY, 0, 40, 3, 20, True), "fp8")
    assert all("kv_dtype" not in u.field_dict for u in alone)  # as few query tokens as a verify, still a chunk


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_mla_reads_its_latent_in_fp8_only_where_it_runs_absorbed(gamma):
    """A verify of more than MLA_ABSORBED_MAX tokens runs decompressed: its attention reads kv_b's output, not the
    cache, so it keeps the dtype; the absorbed mla call over the latent takes the kv dtype."""
    mla = step_defs.with_kv_dtype(step_defs.verify_step(MLA, 3, 40, gamma), "fp8")
    calls = [(u.op, u.field_dict.get("kv_dtype")) for u in mla if u.op in ("mla", "attention")]
    absorbed = gamma + 1 <= step_defs.MLA_ABSORBED_MAX
    assert calls == ([("mla", "fp8")] * 2 if absorbed else [("attention", None)] * 2)
    decode = step_defs.with_kv_dtype(step_defs.decode_step(MLA, 2, 40), "fp8")
    assert [(u.op, u.field_dict.get("kv_dtype")) for u in decode if u.op in ("mla", "attention")] == [
        ("mla", "fp8")] * 2


def test_fp8_kv_composes_from_its_own_rows_beside_the_cache_in_the_dtype():
    batches, context = (1, 3), 40
    plain = [step_defs.decode_step(TINY, b, context) for b in batches]
    rows = op_rows(step_defs.distinct_uses(plain + [step_defs.with_kv_dtype(s, "fp8") for s in plain]), latency)
    dense = pm.Measured(rows, model="tiny", dtype="float32")
    fp8 = pm.Measured(rows, model="tiny", dtype="float32", kv_dtype="fp8")
    for batch in batches:
        t_dense, t_fp8 = pm.tpot(dense, TINY, batch, context), pm.tpot(fp8, TINY, batch, context)
        assert t_dense.total_ms == hand_tpot(batch, context)  # the fp8 rows never join the dtype's
        assert t_fp8.parts["attention"] == t_dense.parts["attention"] / 2
        assert t_fp8.parts["weights"] == t_dense.parts["weights"]
    both = pm.beside_unquantized(pm.batch_sweep(fp8, TINY, batches, context),
                                 pm.batch_sweep(dense, TINY, batches, context), base="dtype_kv", gain="kv_dtype")
    for batch, row in zip(batches, both.itertuples(), strict=True):
        assert row.dtype_kv_tpot_ms == hand_tpot(batch, context)
        assert row.kv_dtype_speedup == pytest.approx(hand_tpot(batch, context) / row.tpot_ms)
        assert row.kv_dtype_speedup > 1
    # no fp8 rows measured: named missing, never the dtype's rows
    none = pm.tpot(pm.Measured(op_rows(step_defs.distinct_uses(plain), latency), model="tiny", dtype="float32",
                               kv_dtype="fp8"), TINY, 1, context)
    assert not none.complete and "kv_dtype" in none.missing[0]
