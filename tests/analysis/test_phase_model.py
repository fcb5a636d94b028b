"""The phase model's arithmetic on synthetic rows of known latency: TTFT, TPOT, the batch sweep, chunking, limits."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis.phases import model as pm
from phasebench.analysis.phases import remedies
from phasebench.analysis.phases.coverage import coverage_lines
from phasebench.analysis.phases.remedies import remedy_lines
from phasebench.bench.spec import steps as step_defs
from phasebench.bench.spec.models import DecoderConfig
from phasebench.bench.spec.routing import touched_experts

from .phase_rows import IMPLS, TINY, op_rows

# Exact in binary floating point: each op's latency is a power of two times its rows (attention: its pairs / 2).
BASE = {"rmsnorm": 1, "rotary": 2, "kv_append": 4, "silu_mul": 8, "residual_add": 16, "greedy_pick": 32,
        "qkv": 64, "o": 128, "gate_up": 256, "down": 512, "lm_head": 1024}


def power_latency(use) -> float:
    f = use.field_dict
    if use.op == "attention":
        return 0.5 * f["batch"] * f["q_len"] * f["kv_len"]
    return BASE[f.get("kind") or f.get("projection")] * f["m"]


def measured(steps, latency=power_latency, **kwargs) -> pm.Measured:
    return pm.Measured(op_rows(step_defs.distinct_uses(steps), latency, **kwargs), model="tiny", dtype="float32")


def hand_ttft(prompt: int) -> float:
    # per layer: 2 rmsnorm, qkv, o, gate_up, down, rotary, kv_append, silu_mul, 2 residual_add at M = prompt,
    # attention over prompt x prompt; then final norm, lm_head and the pick on the last token
    layer = (2 * 1 + 64 + 128 + 256 + 512 + 2 + 4 + 8 + 2 * 16) * prompt + 0.5 * prompt * prompt
    return TINY.layers * layer + (1 + 1024 + 32)


def hand_tpot(batch: int, context: int) -> float:
    layer = 1008 * batch + 0.5 * batch * (context + 1)
    return TINY.layers * layer + (1 + 1024 + 32) * batch


def test_ttft_and_tpot_are_the_hand_sums():
    prompts, cases = (7, 33), ((1, 40), (5, 19))
    m = measured([step_defs.prefill_step(TINY, p) for p in prompts]
                 + [step_defs.decode_step(TINY, b, c) for b, c in cases])
    for prompt in prompts:
        t = pm.ttft(m, TINY, prompt)
        assert t.complete and t.total_ms == hand_ttft(prompt)
        assert math.isnan(t.parts.pop("iteration"))  # none measured
        assert t.parts == {"weights": 3 * 960 * prompt, "attention": 3 * 0.5 * prompt ** 2, "experts": 0.0,
                           "elementwise": 3 * 48 * prompt, "head": 1057}
    for batch, context in cases:
        t = pm.tpot(m, TINY, batch, context)
        assert t.complete and t.total_ms == hand_tpot(batch, context)
        assert t.parts["attention"] == 3 * 0.5 * batch * (context + 1) and t.parts["head"] == 1057 * batch
    table = pm.prefill_table(m, TINY, prompts)
    assert table["ttft_ms"].tolist() == [hand_ttft(p) for p in prompts]
    assert table["prompt_tokens_per_s"].tolist() == pytest.approx([1e3 * p / hand_ttft(p) for p in prompts])
    assert (table["missing"] == 0).all()


def test_only_ok_rows_of_the_chosen_impl_and_dtype_count_and_repeats_take_the_median():
    steps = [step_defs.prefill_step(TINY, 11)]
    uses = step_defs.distinct_uses(steps)
    good = op_rows(uses, power_latency)
    qkv = next(u for u in uses if u.label == "qkv")
    decoys = pd.concat([
        op_rows(uses, lambda u: 1e6, impls={"attention": "naive", "linear": "naive", "elementwise": "naive"}),
        op_rows(uses, lambda u: 1e6, dtype="bfloat16"),
        op_rows(uses, lambda u: 1e6).assign(status="failed"),
        op_rows([qkv, qkv], lambda u: 1e6).assign(device="another", status="skipped"),
        op_rows([qkv], lambda u: 0.25 * power_latency(u)),  # repeats: the median is the good row's latency
        op_rows([qkv], lambda u: 4 * power_latency(u)),
    ], ignore_index=True)
    frame = pd.concat([decoys, good], ignore_index=True).sample(frac=1.0, random_state=5)
    m = pm.Measured(frame, model="tiny", dtype="float32")
    assert pm.ttft(m, TINY, 11).total_ms == hand_ttft(11)


def test_batch_sweep_tokens_per_second_and_the_saturation_batch():
    batches = (1, 2, 4, 8, 16, 32)
    steps = [step_defs.decode_step(TINY, b, 64) for b in batches]

    def flat_until_8(use):  # every op costs the same up to 8 rows, then grows with them: TPOT = k * max(B, 8)
        f = use.field_dict
        return 0.125 * max(f.get("m") or f["batch"], 8)

    m = measured(steps, flat_until_8)
    table = pm.batch_sweep(m, TINY, batches, 64)
    tpot = table["tpot_ms"].to_numpy()
    ops = sum(u.count for u in step_defs.decode_step(TINY, 1, 64))
    assert tpot.tolist() == [ops * 0.125 * max(b, 8) for b in batches]
    assert table["tokens_per_s"].tolist() == pytest.approx(1e3 * np.array(batches) / tpot)
    assert table["tokens_per_s_per_user"].tolist() == pytest.approx(1e3 / tpot)
    assert table.loc[table["saturated"], "batch"].tolist() == [8]
    growing = pm.batch_sweep(m, TINY, (1, 2, 4, 8), 64)
    assert not growing["saturated"].any()


def test_saturation_is_the_smallest_batch_that_no_larger_batch_beats_by_the_margin():
    batches, tps = [8, 1, 4, 2], [300.0, 100.0, 186.0, 180.0]  # unsorted on purpose; 2 -> 4 adds 3.3 %, 8 far more
    assert pm.saturation_batch(batches, tps, margin=0.05) is None
    assert pm.saturation_batch([8, 1, 4, 2], [187.0, 100.0, 186.0, 180.0], margin=0.05) == 2
    assert pm.saturation_batch([8, 1, 4, 2], [187.0, 100.0, 186.0, 180.0], margin=0.02) == 4
    assert pm.saturation_batch([1, 2], [50.0, 49.0]) == 1
    assert pm.saturation_batch([4], [50.0]) is None  # one batch says nothing
    # the committed host sample's sweep: a dip at batch 2, then throughput grows 4x to batch 16
    assert pm.saturation_batch([1, 2, 4, 8, 16], [0.575, 0.569, 1.01, 1.62, 2.46]) is None


def test_noisy_and_profiled_rows_are_left_out_and_counted():
    steps = [step_defs.prefill_step(TINY, 11)]
    uses = step_defs.distinct_uses(steps)
    quiet = op_rows(uses, power_latency)
    qkv = next(u for u in uses if u.label == "qkv")
    loud = pd.concat([op_rows([qkv], lambda u: 1e6).assign(noisy=True),
                      op_rows([qkv], lambda u: 1e6).assign(profiled=True)], ignore_index=True)
    m = pm.Measured(pd.concat([quiet, loud], ignore_index=True), model="tiny", dtype="float32")
    t = pm.ttft(m, TINY, 11)
    assert t.total_ms == hand_ttft(11) and t.noisy == 2
    assert pm.prefill_table(m, TINY, (11,))["noisy_left_out"].tolist() == [2]
    only_loud = quiet[quiet["projection"] != "qkv"]
    m = pm.Measured(pd.concat([only_loud, loud], ignore_index=True), model="tiny", dtype="float32")
    t = pm.ttft(m, TINY, 11)
    assert math.isnan(t.total_ms) and any("qkv" in name for name in t.missing)  # never composed from noisy rows


def test_chunk_table_steps_ttft_itl_and_the_cost_of_chunking():
    prompt, decode_batch, context = 10, 2, 5
    steps = [step_defs.prefill_step(TINY, prompt), step_defs.decode_step(TINY, decode_batch, context)]
    for chunk in (4, 10, 16):
        for batch in (decode_batch, 0):
            steps += step_defs.chunked_prefill_steps(TINY, prompt, chunk, batch, context)

    def unit_but_linear(use):  # a linear op costs its rows, everything else 1 ms
        return float(use.field_dict["m"]) if use.op == "linear" else 1.0

    m = measured(steps, unit_but_linear)
    table = pm.chunk_table(m, TINY, prompt, (4, 10, 16), decode_batch, context).set_index("chunk")

    def hybrid(chunk, last):  # 7 elementwise + 2 attention + 4 linear at 2 + chunk rows, per layer; head on the users
        return 3 * (9 + 4 * (decode_batch + chunk)) + 1 + (decode_batch + last) + 1

    def alone(chunk, last):  # 7 elementwise + 1 attention + 4 linear at chunk rows; head on the last token only
        return 3 * (8 + 4 * chunk) + (3 if last else 0)

    whole = 3 * (8 + 4 * prompt) + 3
    decode_only = 3 * (8 + 4 * decode_batch) + 1 + decode_batch + 1
    four = [hybrid(4, 0), hybrid(4, 0), hybrid(2, 1)]
    assert table.loc[4, "steps"] == 3 and table.loc[10, "steps"] == table.loc[16, "steps"] == 1
    assert table.loc[4, "ttft_ms"] == sum(four) and table.loc[4, "itl_ms"] == pytest.approx(sum(four) / 3)
    assert table.loc[4, "itl_max_ms"] == max(four)
    assert table.loc[10, "ttft_ms"] == table.loc[16, "ttft_ms"] == hybrid(10, 1)
    assert (table["decode_only_ms"] == decode_only).all() and (table["unchunked_ttft_ms"] == whole).all()
    assert table.loc[4, "itl_increase_pct"] == pytest.approx(100 * (sum(four) / 3 / decode_only - 1))
    cost = alone(4, 0) + alone(4, 0) + alone(2, 1)
    assert table.loc[4, "chunking_cost_pct"] == pytest.approx(100 * (cost / whole - 1))
    assert table.loc[10, "chunking_cost_pct"] == 0 and (table["missing"] == 0).all()


def test_interactive_limits_for_designed_thresholds():
    prompts, batches = (8, 24), tuple(2 ** i for i in range(10))
    steps = [step_defs.prefill_step(TINY, p) for p in prompts]
    steps += [step_defs.decode_step(TINY, b, p) for b in batches for p in prompts]
    scale = 2.0 ** -12
    m = measured(steps, lambda use: scale * power_latency(use))
    limits = pm.interactive_limits(m, TINY, prompts, batches, ttft_s=0.01, user_tokens_per_s=(3.0, 10.0))
    got = {(r.prompt, r.user_tokens_per_s_target): r.largest_batch for r in limits.itertuples()}

    def largest(prompt, target):
        if scale * hand_ttft(prompt) > 10.0:
            return 0
        return max([b for b in batches if 1e3 / (scale * hand_tpot(b, prompt)) >= target], default=0)

    assert got == {(p, t): largest(p, t) for p in prompts for t in (3.0, 10.0)}
    # by hand: TTFT(8) = 6.2 ms is within 10 ms, TPOT(B, 8) = 0.9996 B ms; TTFT(24) = 18 ms is not
    assert got == {(8, 3.0): 256, (8, 10.0): 64, (24, 3.0): 0, (24, 10.0): 0}
    assert limits.loc[limits["prompt"] == 8, "ttft_ms"].iloc[0] == scale * hand_ttft(8)


def test_a_missing_op_is_named_and_the_total_is_nan():
    uses = step_defs.distinct_uses([step_defs.prefill_step(TINY, 9)])
    kept = [u for u in uses if u.label != "lm_head"]
    m = pm.Measured(op_rows(kept, power_latency), model="tiny", dtype="float32")
    t = pm.ttft(m, TINY, 9)
    assert not t.complete and math.isnan(t.total_ms)
    assert len(t.missing) == 1 and "lm_head" in t.missing[0] and "linear" in t.missing[0]
    assert t.parts["weights"] == 3 * 960 * 9  # what was measured is still split by part
    table = pm.prefill_table(m, TINY, [9])
    assert table["missing"].tolist() == [1] and table["ttft_ms"].isna().all()


def test_nothing_measured_for_the_model_means_everything_missing():
    step = step_defs.decode_step(TINY, 3, 17)
    m = pm.Measured(op_rows(step_defs.distinct_uses([step]), power_latency), model="another", dtype="float32")
    t = pm.tpot(m, TINY, 3, 17)
    assert len(t.missing) == len(step) and math.isnan(t.total_ms) and t.items.empty


@pytest.mark.parametrize("column, other", [("device", "cuda"), ("mode", "interpreter"), ("timer", "cuda-events")])
def test_rows_of_two_groups_are_refused(column, other):
    uses = step_defs.distinct_uses([step_defs.decode_step(TINY, 2, 13)])
    frame = op_rows(uses, power_latency)
    frame = pd.concat([frame, frame.iloc[:3].assign(**{column: other})], ignore_index=True)
    with pytest.raises(ValueError, match="device/mode/timer"):
        pm.Measured(frame, model="tiny", dtype="float32")


def test_model_error_is_relative_to_the_measured_pass():
    assert pm.model_error(90.0, 120.0) == pytest.approx(-25.0)
    assert pm.model_error(150.0, 120.0) == pytest.approx(25.0)


def interference_rows(rows, **fields) -> pd.DataFrame:
    """`phasebench interference` rows: (mode, mechanism, stretch, prefill_slowdown, noisy, context) per row, on the
    device the op rows name and with TINY's layers unless `fields` say otherwise."""
    base = {"model": "tiny", "dtype": "float32", "batch": 3, "prompt": 12, "device": "cpu", "device_name": "cpu",
            "layers": TINY.layers, "covered": 0.999, "status": "ok", **fields}
    return pd.DataFrame([{**base, "mode": mode, "mechanism": mech, "stretch": s, "prefill_slowdown": slow,
                          "noisy": noisy, "context": context}
                         for mode, mech, s, slow, noisy, context in rows])


def test_colocated_estimate_is_a_fair_share_until_measured():
    prompt, batch, context = 12, 3, 9
    m = measured([step_defs.prefill_step(TINY, prompt), step_defs.decode_step(TINY, batch, context)])
    first, step = hand_ttft(prompt), hand_tpot(batch, context)
    table = remedies.colocated_table(m, TINY, prompt, batch, context).set_index("option")
    assert list(table.index) == ["separated", "co-located", "protected"]
    assert table.loc["separated", "itl_ms"] == step and table.loc["separated", "ttft_ms"] == first
    # each decode step yields up to its own length to the prefill, which gets half the device
    assert table.loc["co-located", "itl_ms"] == step + min(step, first)
    assert table.loc["co-located", "ttft_ms"] == 2 * first
    assert table.loc["co-located", "source"] == "fair share (composed)"
    assert math.isnan(table.loc["protected", "itl_ms"]) and "not measured" in table.loc["protected", "source"]
    assert table["tokens_per_s_per_user"].iloc[:2].tolist() == pytest.approx([1e3 / step, 1e3 / (step + min(step,
                                                                                                            first))])
    assert (table["decode_only_ms"] == step).all() and (table["context"] == context).all()

    measured_rows = interference_rows([
        ("alone", "alone", 1.0, 1.0, False, context), ("colocated", "stream", 1.5, 1.25, False, context),
        ("colocated", "process", 2.5, 1.5, False, context),  # the worst mechanism is taken
        ("colocated", "process", 9.0, 9.0, True, context),  # noisy: left out
        ("protected", "priority stream", 1.25, 2.0, False, context),
        ("protected", "priority stream", 0.5, 1.0, False, context + 1)])  # another context: left out
    table = remedies.colocated_table(m, TINY, prompt, batch, context, measured_rows).set_index("option")
    assert table.loc["co-located", "itl_ms"] == 2.5 * step and table.loc["co-located", "ttft_ms"] == 1.5 * first
    assert table.loc["co-located", "source"] == "measured: colocated/process on cpu"
    assert table.loc["protected", "itl_ms"] == 1.25 * step and table.loc["protected", "ttft_ms"] == 2 * first
    assert table.loc["protected", "stretch"] == 1.25 and table.loc["separated", "stretch"] == 1


@pytest.mark.parametrize("fields, says", [
    ({"device_name": "NVIDIA H200"}, "colocated measured on NVIDIA H200 with 3 layers, not on cpu with 3 layers"),
    ({"layers": 1}, "colocated measured on cpu with 1 layers, not on cpu with 3 layers"),
    ({"device_name": ""}, "colocated measured on an unnamed device with 3 layers, not on cpu"),
    ({"covered": 0.6}, "colocated rows noisy or their prefill under 95% of a window"),
])
def test_a_stretch_of_another_device_or_layer_count_is_not_used_and_the_table_says_why(fields, says):
    prompt, batch, context = 12, 3, 9
    m = measured([step_defs.prefill_step(TINY, prompt), step_defs.decode_step(TINY, batch, context)])
    step, first = hand_tpot(batch, context), hand_ttft(prompt)
    rows = interference_rows([("alone", "alone", 1.0, 1.0, False, context),
                              ("colocated", "process", 2.5, 1.5, False, context)], **fields)
    table = remedies.colocated_table(m, TINY, prompt, batch, context, rows).set_index("option")
    assert table.loc["co-located", "itl_ms"] == step + min(step, first)  # the fair share, as if none were given
    source = table.loc["co-located", "source"]
    assert source.startswith("fair share (composed); ") and says in source and source.endswith("not used")
    assert says in "\n".join(remedy_lines({"colocated": table.reset_index()}))  # the phases summary says it too
    assert table.loc["protected", "source"] == "not measured (phasebench interference)"  # none of any device
    same = remedies.colocated_table(m, TINY, prompt, batch, context, interference_rows(
        [("colocated", "process", 2.5, 1.5, False, context)])).set_index("option")
    assert same.loc["co-located", "itl_ms"] == 2.5 * step  # the same rows keyed to this device and layers: used


def test_a_paged_cache_composes_from_the_rows_of_its_page_size_only():
    # the same decode shapes measured contiguous and in pages of 16, the paged attention 3x slower: never pooled
    def latency(use):
        return power_latency(use) * (3 if use.field_dict.get("page_size") else 1)

    steps = [step_defs.decode_step(TINY, 2, 40), step_defs.decode_step(TINY, 2, 40, page_size=16)]
    m = measured(steps, latency)
    contiguous, paged = pm.tpot(m, TINY, 2, 40), pm.tpot(m, TINY, 2, 40, page_size=16)
    assert contiguous.total_ms == hand_tpot(2, 40)
    assert paged.parts["attention"] == 3 * contiguous.parts["attention"]
    assert paged.total_ms - contiguous.total_ms == 2 * contiguous.parts["attention"]
    missing = pm.tpot(m, TINY, 2, 40, page_size=64)
    assert not missing.complete and "'page_size': 64" in missing.missing[0]
    sweep = pm.batch_sweep(m, TINY, [2], 40, page_size=16)
    assert sweep["tpot_ms"].tolist() == [paged.total_ms]


def test_rows_without_a_page_size_column_read_as_contiguous():
    rows = op_rows(step_defs.distinct_uses([step_defs.decode_step(TINY, 2, 40)]), power_latency)
    old = pm.Measured(rows.drop(columns="page_size"), model="tiny", dtype="float32")
    assert pm.tpot(old, TINY, 2, 40).total_ms == hand_tpot(2, 40)


def test_quantized_weights_compose_from_their_own_rows_never_scaled():
    # the projections measured unquantized and packed as int4-g128 (4x faster here); the lm_head stays unquantized
    def latency(use):
        return power_latency(use) / (4 if use.op == "qlinear" else 1)

    plain = step_defs.decode_step(TINY, 2, 40)
    packed = step_defs.with_weights(plain, "int4-g128")
    assert {u.op for u in packed if u.part == "weights"} == {"qlinear"}
    assert [u.op for u in packed if u.label == "lm_head"] == ["linear"]
    rows = op_rows(step_defs.distinct_uses([plain, packed]), latency,
                   impls={**pm.DEFAULT_IMPLS, "qlinear": "torch", "attention": "flash"})
    dense = pm.Measured(rows, model="tiny", dtype="float32")
    quant = pm.Measured(rows, model="tiny", dtype="float32", weights="int4-g128")
    t_dense, t_quant = pm.tpot(dense, TINY, 2, 40), pm.tpot(quant, TINY, 2, 40)
    assert t_dense.total_ms == hand_tpot(2, 40)
    assert t_quant.parts["weights"] == t_dense.parts["weights"] / 4
    assert t_quant.parts["head"] == t_dense.parts["head"] and t_quant.parts["attention"] == t_dense.parts["attention"]
    # another scheme was not measured: named missing, not scaled from the rows that exist
    other = pm.tpot(pm.Measured(rows, model="tiny", dtype="float32", weights="int8"), TINY, 2, 40)
    assert not other.complete and all("qlinear" in m and "int8" in m for m in other.missing)


def test_a_quantized_sweep_is_set_beside_the_float_sweep_of_the_same_rows():
    # projections 3x faster packed; the float TPOT and the gain come from the same rows, per batch
    def latency(use):
        return power_latency(use) / (3 if use.op == "qlinear" else 1)

    batches, context = (1, 5), 37
    plain = [step_defs.decode_step(TINY, b, context) for b in batches]
    rows = op_rows(step_defs.distinct_uses(plain + [step_defs.with_weights(s, "int8") for s in plain]), latency,
                   impls={**pm.DEFAULT_IMPLS, "qlinear": "torch", "attention": "flash"})
    quant = pm.batch_sweep(pm.Measured(rows, model="tiny", dtype="float32", weights="int8"), TINY, batches, context)
    dense = pm.batch_sweep(pm.Measured(rows, model="tiny", dtype="float32"), TINY, batches, context)
    both = pm.beside_unquantized(quant, dense)
    assert list(both["batch"]) == list(batches)
    for batch, row in zip(batches, both.itertuples(), strict=True):
        assert row.unquantized_tpot_ms == hand_tpot(batch, context)
        weights = pm.tpot(pm.Measured(rows, model="tiny", dtype="float32"), TINY, batch, context).parts["weights"]
        assert row.tpot_ms == pytest.approx(hand_tpot(batch, context) - weights * 2 / 3)
        assert row.weights_speedup == pytest.approx(hand_tpot(batch, context) / row.tpot_ms)
    # a batch the float sweep lacks reads empty, not a gain of 1
    assert np.isnan(pm.beside_unquantized(quant, dense[dense["batch"] == 1])["weights_speedup"].iloc[1])


MOE = DecoderConfig(hidden=96, intermediate=40, layers=3, q_heads=6, kv_heads=2, head_dim=16, vocab=97,
                    name="tiny", experts=12, top_k=3, shared_intermediate=64)


def test_a_mixture_composes_its_router_routed_and_shared_experts_and_names_where_every_expert_is_touched():
    batches = (1, 4, 16)
    steps = [step_defs.decode_step(MOE, b, 31) for b in batches]

    def latency(use):  # the routed experts cost their touched experts; every other op 1 ms
        f = use.field_dict
        return touched_experts(f["m"], f["experts"], f["top_k"], f["routing"]) if use.op == "moe" else 1.0

    m = pm.Measured(op_rows(step_defs.distinct_uses(steps), latency, config=MOE,
                            impls={**IMPLS, "moe": "torch"}), model="tiny", dtype="float32")
    labels = [u.label for u in steps[0] if u.part != "head"]
    assert {"router", "experts", "gate_up", "down", "silu_mul"} <= set(labels) and "moe" in {u.op for u in steps[0]}
    table = pm.batch_sweep(m, MOE, batches, 31)
    drawn = [touched_experts(b, 12, 3, "uniform") for b in batches]
    assert table["touched_experts"].tolist() == drawn and table["experts_ms"].tolist() == [3.0 * t for t in drawn]
    ops = sum(u.count for u in steps[0] if u.op != "moe")
    assert table["tpot_ms"].tolist() == [ops + 3.0 * t for t in drawn] and (table["missing"] == 0).all()
    assert table["expected_touched"].tolist() == pytest.approx([12 * (1 - 0.75 ** b) for b in batches])
    every = next(b for b, t in zip(batches, drawn, strict=True) if t == 12)
    (line,) = coverage_lines(table)
    assert f"every one from batch {every}" in line and "passes 11.5 at batch 12" in line  # 12 · 0.75^12 < 1/2
    assert coverage_lines(pm.batch_sweep(measured([step_defs.decode_step(TINY, 1, 8)]), TINY, (1,), 8)) == []


def test_a_step_of_rows_in_rounds_takes_the_interval_where_a_repeat_lands_from_its_per_round_totals():
    """Each row's rounds scaled alike by the round's drift (1.0, 1.3, 0.9): the step's per-round totals move by the
    same factors, and its interval is t(2) · s · sqrt(2/3) about the sum of the rows' figures, s the spread of the
    totals' logs; a round a row lacks is filled with its others' geometric mean, one taken again keeps its value."""
    from phasebench.bench.spec.between_runs import repeat_interval

    step = step_defs.decode_step(TINY, 2, 11)
    drift = (1.0, 1.3, 0.9)
    rows = op_rows(step_defs.distinct_uses([step]), power_latency)
    rows["round_latencies_ms"] = ["/".join(f"{v * d:.6g}" for d in drift) for v in rows["latency_ms"]]
    rows["latency_ms"] *= float(np.prod(drift)) ** (1 / 3)  # each row's figure: its rounds' geometric mean
    t = pm.tpot(pm.Measured(rows, model="tiny", dtype="float32"), TINY, 2, 11)
    totals = [hand_tpot(2, 11) * d for d in drift]
    assert t.total_ms == pytest.approx(hand_tpot(2, 11) * float(np.prod(drift)) ** (1 / 3), rel=1e-5)
    low, high = repeat_interval(totals, t.total_ms)
    assert (t.low_ms, t.high_ms) == pytest.approx((low, high), rel=1e-5) and low < t.total_ms < high
    # one row without its second round, another with its third taken again at the end: still three rounds
    gap = rows.copy()
    first, second = gap.index[:2]
    values = [float(v) for v in gap.loc[first, "round_latencies_ms"].split("/")]
    gap.loc[first, "round_latencies_ms"] = f"{values[0]:.6g}//{values[2]:.6g}"
    gap.loc[second, "round_latencies_ms"] = gap.loc[second, "round_latencies_ms"] + "r"
    again = pm.tpot(pm.Measured(gap, model="tiny", dtype="float32"), TINY, 2, 11)
    # by hand: every round's total as before, the second less the first row's share plus its filled value
    use = step_defs.distinct_uses([step])[0]
    count = sum(u.count for u in step if (u.op, u.fields) == (use.op, use.fields))
    filled = math.sqrt(values[0] * values[2])
    by_hand = [totals[0], totals[1] - count * values[1] + count * filled, totals[2]]
    point = again.total_ms  # the rows' figures did not change: the same point
    assert point == pytest.approx(t.total_ms)
    assert (again.low_ms, again.high_ms) == pytest.approx(repeat_interval(by_hand, point), rel=1e-5)
    assert pm.in_turn(f"{values[0]:.6g}//{values[2]:.6g}")[1] == pytest.approx(filled, rel=1e-5)
    assert pm.in_turn("1.5/2r/2.5") == (1.5, 2.0, 2.5) and pm.in_turn("1.5//") is None and pm.in_turn("") is None


def test_the_checks_rounds_keep_their_noisy_rows_and_the_tables_leave_them_out():
    step = step_defs.decode_step(TINY, 1, 7)
    rows = op_rows(step_defs.distinct_uses([step]), power_latency).assign(noisy=False)
    rows.loc[rows.index[0], "noisy"] = True
    assert pm.tpot(pm.Measured(rows, model="tiny", dtype="float32"), TINY, 1, 7).missing
    kept = pm.tpot(pm.Measured(rows, model="tiny", dtype="float32", keep_noisy=True), TINY, 1, 7)
    assert kept.complete and kept.total_ms == hand_tpot(1, 7)


def test_float_and_packed_experts_of_one_shape_compose_apart():
    # one frame holds float and mxfp4 moe rows of the same shapes (a served run measures both): a float use must
    # not match a packed row, nor a packed use a float one
    import dataclasses

    mix = dataclasses.replace(TINY, name="tiny-mix", experts=5, top_k=2, intermediate=40)

    def latency(use):
        return 0.5 if use.field_dict.get("scheme") else 2.0 if use.op == "moe" else 0.25

    plain = step_defs.decode_step(mix, 3, 40)
    packed = step_defs.with_weights(plain, "", "mxfp4")
    impls = {**pm.DEFAULT_IMPLS, "moe": "naive", "attention": "flash"}
    rows = op_rows(step_defs.distinct_uses([plain, packed]), latency, config=mix, impls=impls)
    dense = pm.tpot(pm.Measured(rows, model="tiny-mix", dtype="float32", impls=impls), mix, 3, 40)
    served = pm.tpot(pm.Measured(rows, model="tiny-mix", dtype="float32", impls=impls, experts="mxfp4"), mix, 3, 40)
    assert dense.complete and served.complete and served.parts["experts"] > 0
    assert served.parts["experts"] == pytest.approx(dense.parts["experts"] / 4)
    assert served.parts["weights"] == dense.parts["weights"]
