"""The speculative loop: rolling back rejected tokens is exact (float64: the caches and the next outputs equal a loop
that never proposed them), and the tokens each iteration yields follow the seeded draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from phasebench.bench.phases import speculative_loop as sl
from phasebench.bench.phases.reference_decoder import ReferenceDecoder
from phasebench.bench.spec.models import DecoderConfig

TARGET = DecoderConfig(hidden=80, intermediate=136, layers=2, q_heads=5, kv_heads=1, head_dim=16, vocab=103,
                       name="spec-target")
DRAFT = DecoderConfig(hidden=48, intermediate=72, layers=1, q_heads=3, kv_heads=1, head_dim=16, vocab=103,
                      name="spec-draft")
CONTEXT, BATCH = 37, 3


def pair(seed=5, max_tokens=120):
    target = ReferenceDecoder(TARGET, 2, "cpu", torch.float64, max_tokens=max_tokens, max_batch=BATCH, seed=seed)
    draft = ReferenceDecoder(DRAFT, 1, "cpu", torch.float64, max_tokens=max_tokens, max_batch=BATCH, seed=seed + 1)
    return target, draft


def rows(model, end):
    return [t[:BATCH, :, :end] for layer in model.layers for t in (layer.k_cache, layer.v_cache)]


@pytest.mark.parametrize("first", [[True, False, True], [True, True, True], [False, False, False]])
def test_a_rollback_leaves_what_a_loop_that_never_proposed_the_rejected_tokens_holds(first):
    spec = sl.SpeculativeLoop(*pair(), BATCH, CONTEXT, seed=3)
    plain = sl.SpeculativeLoop(*pair(), BATCH, CONTEXT, seed=3)
    kept = spec.iteration(first)
    n = sl.accepted(first)
    assert kept.shape == (BATCH, n + 1)
    plain.feed(torch.cat((plain.last, kept[:, :-1]), dim=1))  # last and the kept proposals, as plain context
    assert torch.equal(plain.last, spec.last) and plain.length == spec.length == CONTEXT + n + 1
    for a, b in zip(rows(spec.target, spec.length), rows(plain.target, plain.length), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(rows(spec.draft, spec.draft_length), rows(plain.draft, spec.draft_length), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    then = [False, True, True, False]  # the next iteration: same draws, the same tokens and the same caches
    assert torch.equal(spec.iteration(then), plain.iteration(then))
    assert spec.length == plain.length
    for a, b in zip(rows(spec.target, spec.length), rows(plain.target, plain.length), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_verify_pass_equals_one_token_at_a_time():
    target, _ = pair()
    x = torch.randn(BATCH, 4, TARGET.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    at_once = target.extend(BATCH, CONTEXT, 4, x=x, every_position=True)
    one_by_one = torch.stack([target.decode_step(BATCH, CONTEXT + i, x=x[:, i:i + 1]) for i in range(4)], dim=1)
    assert torch.equal(at_once, one_by_one)


def test_realised_tokens_follow_the_seeded_draws_exactly():
    gamma, alpha, iterations = 4, 0.7, 23
    acceptance = sl.draws([11, 2], iterations + sl.WARMUP_ITERATIONS, gamma, alpha)
    again = np.random.default_rng([11, 2]).random((iterations + sl.WARMUP_ITERATIONS, gamma)) < alpha
    assert np.array_equal(acceptance, again)
    loop = sl.SpeculativeLoop(*pair(max_tokens=CONTEXT + 5 * (iterations + 3)), BATCH, CONTEXT)
    ms, tokens = sl.time_loop(loop, acceptance)
    by_hand = []
    for row in again[sl.WARMUP_ITERATIONS:]:
        leading = 0
        while leading < gamma and row[leading]:
            leading += 1
        by_hand.append(leading + 1)
    assert tokens == by_hand and len(ms) == iterations
    warm = sum(sl.accepted(r) + 1 for r in again[:sl.WARMUP_ITERATIONS])
    assert loop.length == CONTEXT + warm + sum(by_hand)


def test_a_draft_of_another_vocabulary_is_refused():
    target, _ = pair()
    other = ReferenceDecoder(DecoderConfig(48, 72, 1, 3, 1, 16, 97, "other"), 1, "cpu", torch.float64,
                             max_tokens=60, max_batch=BATCH)
    with pytest.raises(ValueError, match=r"^draft: vocabulary 97 is not the target's 103$"):
        sl.SpeculativeLoop(target, other, BATCH, CONTEXT)


def test_the_loops_draft_is_cut_in_the_whole_models_ratio_of_layers():
    import dataclasses

    target, draft = dataclasses.replace(TARGET, layers=32), dataclasses.replace(DRAFT, layers=16)
    assert [sl.draft_depth(target, draft, n) for n in (1, 2, 4)] == [1, 1, 2]  # at least one draft layer
    assert sl.draft_depth(dataclasses.replace(TARGET, layers=22), dataclasses.replace(DRAFT, layers=22), 2) == 2
    assert sl.draft_depth(target, dataclasses.replace(DRAFT, layers=3), 64) == 3  # never past its own
    assert [sl.draft_depth(target, draft, n) for n in (3, 5)] == [2, 3]  # halves round up, not to even
    plan = sl.LoopPlan(sl.cut(target, 4), sl.cut(draft, 2), "cpu", "float32", (1,), 8, (1,), (0.5,), 2,
                       depths=(2, 4), draft_depths=(1, 2))
    assert plan.depth_pairs(0) == [(2, 1), (4, 2)] and plan.depth_pairs(1) == [(4, 2), (2, 1)]
    assert sl.LoopPlan(TARGET, DRAFT, "cpu", "float32", (1,), 8, (1,), (0.5,), 2,
                       depths=(1, 2)).depth_pairs() == [(1, 1), (2, 1)]


@pytest.mark.slow
def test_phases_speculate_on_a_tiny_pair_writes_the_tables_and_checks_the_loop(tmp_path):
    import json

    import pandas as pd
    from phasebench.analysis.phases import speculative as sp

    from ...conftest import run_cli

    target = "name=spec-e2e-target,hidden=96,intermediate=160,layers=3,q_heads=6,kv_heads=2,head_dim=16,vocab=127"
    draft = "name=spec-e2e-draft,hidden=48,intermediate=64,layers=1,q_heads=3,kv_heads=1,head_dim=16,vocab=127"
    out = tmp_path / "phases"
    proc = run_cli("phases", "--model", target, "--speculate", "--draft", draft, "--gamma", "1", "3",
                   "--acceptance", "0.55", "0.85", "--prompt", "16", "--batch", "1", "--context", "23", "--chunk", "8",
                   "--chunk-batch", "1", "--reference-batch", "2", "--reference-rounds", "1", "--sample-time",
                   "0.02", "--warm", "--retry-noisy", "0", "--no-isolate", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(out / "speculative.csv")
    assert list(table.columns) == list(sp.COLUMNS) and len(table) == 2 * 2 and set(table["batch"]) == {2}
    for row in table.itertuples():  # E in the CSV is the formula, exactly
        assert row.expected_tokens_per_pass == (1 - row.alpha ** (row.gamma + 1)) / (1 - row.alpha)
    check = pd.read_csv(out / "speculative_check.csv")
    # two rounds of ops between three brackets of 8 timed iterations each; the loop's models cut to 2 layers
    assert len(check) == 4 and (check["brackets"] == 3).all() and (check["layers"] == 2).all()
    assert (check["draft_layers"] == 1).all() and (check["iterations"] == 3 * 8).all()
    assert (check["loop_tokens_per_s_per_user"] > 0).all()
    assert "error_pct" in check and check["over_goal"].dtype == bool
    ops = pd.read_csv(out / "speculative" / "results.csv")  # the loop's ops, a round between each two brackets
    assert set(ops["suite"]) == {"phases-speculate"} and set(ops["model"]) == {"spec-e2e-target", "spec-e2e-draft"}
    verify = ops[(ops["op"] == "attention") & (ops["q_len"] > 1)]
    assert sorted(set(zip(verify["q_len"], verify["kv_len"], strict=True))) == [(2, 25), (4, 27)]
    meta = json.loads((out / "phases.json").read_text())
    assert meta["speculate"]["gammas"] == [1, 3] and meta["speculate"]["draft"]["name"] == "spec-e2e-draft"
    assert "Against a real speculative loop" in proc.stdout and (out / "phases_speculative.png").is_file()
