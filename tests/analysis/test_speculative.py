"""Speculative decoding's arithmetic: E(α, γ), its spread, iteration time, speedup, best γ and break-even α, checked
in float64 against values worked by hand and against the limits α -> 0 and α -> 1."""

import math

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis.phases import speculative as sp


@pytest.mark.parametrize(("alpha", "gamma", "expected"), [
    (0.5, 1, 1.5), (0.5, 2, 1.75), (0.8, 4, (1 - 0.32768) / 0.2), (0.6, 3, 1 + 0.6 + 0.36 + 0.216),
    (1.0, 4, 5.0), (1.0, 1, 2.0), (0.0, 7, 1.0)])
def test_expected_tokens_by_hand(alpha, gamma, expected):
    assert sp.expected_tokens(alpha, gamma) == pytest.approx(expected, rel=1e-15, abs=0)


def test_expected_tokens_is_continuous_at_the_limits_and_equals_the_formula():
    for gamma in (1, 3, 8, 13):
        assert sp.expected_tokens(1 - 1e-9, gamma) == pytest.approx(gamma + 1, rel=1e-6)
        assert sp.expected_tokens(1e-12, gamma) == pytest.approx(1.0, rel=1e-11)
    rng = np.random.default_rng(37)
    for alpha, gamma in zip(rng.uniform(0.01, 0.99, 20), rng.integers(1, 17, 20), strict=True):
        assert sp.expected_tokens(float(alpha), int(gamma)) == (1 - alpha ** (gamma + 1)) / (1 - alpha)


def test_tokens_distribution_sums_to_one_and_its_mean_is_e():
    for alpha, gamma in ((0.3, 1), (0.77, 5), (0.95, 11), (1.0, 3), (0.0, 2)):
        p = sp.tokens_distribution(alpha, gamma)
        assert len(p) == gamma + 1 and p.sum() == pytest.approx(1.0, abs=1e-15)
        assert p @ np.arange(1, gamma + 2) == pytest.approx(sp.expected_tokens(alpha, gamma), rel=1e-14)


def test_tokens_std_by_hand():
    assert sp.tokens_std(0.5, 1) == pytest.approx(0.5, rel=1e-15)  # 1 or 2 tokens, each half the time
    # γ = 2, α = 0.5: P(1) = 0.5, P(2) = 0.25, P(3) = 0.25 -> mean 1.75, E[T²] = 0.5 + 1 + 2.25 = 3.75
    assert sp.tokens_std(0.5, 2) == pytest.approx(math.sqrt(3.75 - 1.75 ** 2), rel=1e-14)
    assert sp.tokens_std(1.0, 6) == 0.0 and sp.tokens_std(0.0, 6) == 0.0


def test_iteration_tokens_per_s_and_speedup_by_hand():
    assert sp.iteration_ms(4, 2.0, 12.0) == 20.0
    assert sp.tokens_per_s_per_user(0.8, 4, 2.0, 12.0) == pytest.approx(1e3 * 3.3616 / 20, rel=1e-14)
    assert sp.speedup(0.8, 4, 2.0, 12.0, 10.0) == pytest.approx(3.3616 * 10 / 20, rel=1e-14)
    # Leviathan et al.'s form: a verify as long as a decode step and a draft c times one: E / (γc + 1)
    assert sp.speedup(0.7, 3, 0.05 * 9.0, 9.0, 9.0) == pytest.approx(sp.expected_tokens(0.7, 3) / (3 * 0.05 + 1),
                                                                      rel=1e-14)


def test_break_even_alpha_is_solved():
    assert sp.break_even_alpha(1, 2.0, 12.0, 10.0) == pytest.approx(0.4, rel=1e-14)  # 1 + α = 1.4
    root = (-1 + math.sqrt(1 + 4 * 0.6)) / 2  # 1 + α + α² = 1.6
    assert sp.break_even_alpha(2, 2.0, 12.0, 10.0) == pytest.approx(root, rel=1e-14)
    rng = np.random.default_rng(7)
    for _ in range(30):
        gamma = int(rng.integers(1, 13))
        draft, verify, tpot = rng.uniform(0.05, 3.0), rng.uniform(5.0, 30.0), rng.uniform(5.0, 20.0)
        alpha = sp.break_even_alpha(gamma, draft, verify, tpot)
        if math.isnan(alpha):
            assert (gamma * draft + verify) / tpot > gamma + 1
        elif alpha == 0.0:
            assert gamma * draft + verify <= tpot
        else:
            assert sp.speedup(alpha, gamma, draft, verify, tpot) == pytest.approx(1.0, rel=1e-12)


def test_break_even_alpha_at_the_ends():
    assert sp.break_even_alpha(4, 0.1, 5.0, 10.0) == 0.0  # the iteration is shorter than a decode step
    assert math.isnan(sp.break_even_alpha(2, 5.0, 30.0, 10.0))  # 4 x TPOT > γ + 1 tokens: never pays
    assert sp.break_even_alpha(2, 5.0, 20.0, 10.0) == pytest.approx(1.0, abs=1e-12)  # pays only at α = 1


def test_best_gamma_by_hand_and_on_a_tie():
    verify = {1: 11.0, 2: 12.0, 4: 14.0, 8: 18.0}
    assert sp.best_gamma(0.9, verify, 1.0) == 8  # 6.1258/26 beats 4.0951/18
    assert sp.best_gamma(0.5, verify, 1.0) == 1  # 1.5/12 == 1.75/14: the smaller γ


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), True, "0.5", None])
def test_bad_alpha_is_one_line(alpha):
    with pytest.raises(ValueError, match=r"^alpha: [^\n]+$"):
        sp.expected_tokens(alpha, 2)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_the_cli_interval_is_open(alpha):
    with pytest.raises(ValueError, match=r"alpha: the acceptance rate must lie in \(0, 1\)"):
        sp.check_alpha(alpha, open_interval=True)


@pytest.mark.parametrize("gamma", [0, -2, 1.5, True, "3"])
def test_bad_gamma_is_one_line(gamma):
    with pytest.raises(ValueError, match=r"^gamma: [^\n]+$"):
        sp.expected_tokens(0.5, gamma)


def _steps(batches, gammas, missing_verify=()):
    steps = {}
    for b in batches:
        steps[("tpot", b)] = (10.0 + b, 0)
        steps[("draft", b)] = (1.3 + 0.1 * b, 0)
        for g in gammas:
            gone = (b, g) in missing_verify
            steps[("verify", b, g)] = (math.nan if gone else 10.5 + b + 0.7 * g, 2 if gone else 0)
    return steps


def test_table_matches_the_arithmetic_row_by_row():
    batches, gammas, alphas = (1, 3), (1, 2, 5), (0.55, 0.8, 0.93)
    table = sp.speculative_table(_steps(batches, gammas), batches, 37, gammas, alphas)
    assert list(table.columns) == list(sp.COLUMNS) and len(table) == 2 * 3 * 3
    for row in table.itertuples():
        draft, verify, tpot = 1.3 + 0.1 * row.batch, 10.5 + row.batch + 0.7 * row.gamma, 10.0 + row.batch
        assert row.expected_tokens_per_pass == (1 - row.alpha ** (row.gamma + 1)) / (1 - row.alpha)
        assert row.iteration_ms == row.gamma * draft + verify
        assert row.speedup == pytest.approx(sp.speedup(row.alpha, row.gamma, draft, verify, tpot), rel=1e-14)
        assert row.tokens_per_s == pytest.approx(row.batch * row.tokens_per_s_per_user, rel=1e-15)
        assert row.break_even_alpha == sp.break_even_alpha(row.gamma, draft, verify, tpot)
    best = sp.best_gammas(table)
    assert len(best) == 2 * 3  # one per (batch, α)
    for row in best.itertuples():
        verify = {g: 10.5 + row.batch + 0.7 * g for g in gammas}
        assert row.gamma == sp.best_gamma(row.alpha, verify, 1.3 + 0.1 * row.batch)
    evens = sp.break_evens(table)
    assert len(evens) == 2 * 3 and set(evens["gamma"]) == set(gammas)


def test_a_missing_step_is_nan_and_never_best():
    batches, gammas, alphas = (2,), (1, 4), (0.9,)
    steps = _steps(batches, gammas, missing_verify={(2, 4)})
    table = sp.speculative_table(steps, batches, 64, gammas, alphas)
    gone = table[table["gamma"] == 4].iloc[0]
    assert gone["missing"] == 2 and math.isnan(gone["speedup"]) and math.isnan(gone["break_even_alpha"])
    assert not gone["best_gamma"] and table[table["gamma"] == 1]["best_gamma"].all()


def _loops():
    import pandas as pd

    rows = [{"kind": "plain", "bracket": k, "batch": 2, "gamma": 0, "alpha": float("nan"), "ms": [10.0, 12.0],
             "tokens": [1, 1], "noisy": False} for k in range(2)]
    rows.append({"kind": "plain", "bracket": 2, "batch": 2, "gamma": 0, "alpha": float("nan"), "ms": [90.0],
                 "tokens": [1], "noisy": True})  # a busy bracket of plain decode is left out too
    rows += [{"kind": "speculative", "bracket": 0, "batch": 2, "gamma": 3, "alpha": 0.7, "ms": [20.0, 22.0],
              "tokens": [4, 1], "noisy": False},
             {"kind": "speculative", "bracket": 1, "batch": 2, "gamma": 3, "alpha": 0.7, "ms": [90.0, 95.0],
              "tokens": [2, 3], "noisy": True},  # its times are left out, its draws are not
             {"kind": "error", "bracket": 2, "error": "a worker died"}]
    return pd.DataFrame(rows)


def test_the_loop_check_compares_at_the_realised_tokens_with_the_reference_checks_sign():
    composed = {("tpot", 2): (11.0, 0), ("draft", 2): (2.0, 0), ("verify", 2, 3): (13.0, 0)}  # 19 ms per iteration
    published = {("tpot", 2): (11.0, 0), ("draft", 2): (3.0, 0), ("verify", 2, 3): (12.0, 0)}  # 21 ms
    table = sp.loop_check_table(_loops(), composed, published, layers=2, draft_layers=1, goal_pct=15.0)
    (row,) = table.itertuples()
    assert row.realised_tokens_per_pass == 2.5 and row.iterations == 4 and row.loop_iteration_ms == 21.0
    assert row.loop_tokens_per_s_per_user == pytest.approx(1e3 * 2.5 / 21.0, rel=1e-14)
    assert row.composed_tokens_per_s_per_user == pytest.approx(1e3 * 2.5 / 19.0, rel=1e-14)
    # composed / measured - 1 on times, as every check: < 0, the composition is faster
    assert row.error_pct == pytest.approx(100 * (19.0 / 21.0 - 1), rel=1e-12)
    assert row.published_error_pct == pytest.approx(0.0, abs=1e-12)
    assert row.plain_ms == 11.0 and row.loop_speedup == pytest.approx(2.5 * 11.0 / 21.0, rel=1e-14)
    assert row.composed_speedup == pytest.approx(2.5 * 11.0 / 21.0, rel=1e-14) and row.speedup_error_pct == 0.0
    e, std = sp.expected_tokens(0.7, 3), sp.tokens_std(0.7, 3)
    assert row.expected_tokens_per_pass == e and row.realised_z == pytest.approx((2.5 - e) / (std / 2), rel=1e-12)
    assert row.noisy_brackets == 1 and row.brackets == 2
    # 4 iterations and 2 plain steps per side: too few for an interval, so no verdict on any error
    assert row.verdict == "unresolved" and not row.over_goal
    gone = {**published, ("verify", 2, 3): (math.nan, 3)}
    missing = sp.loop_check_table(_loops(), composed, gone, layers=2, draft_layers=1, goal_pct=15.0).iloc[0]
    assert math.isnan(missing["published_error_pct"]) and missing["published_verdict"] == "unresolved"


def _timed_loops(depth: int, iteration_ms: float, plain_ms: float, spread: float, seed: int):
    """Three brackets of 8 iterations at one depth, each time iteration_ms (plain_ms) x (1 ± spread)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for k in range(3):
        rows.append({"kind": "plain", "bracket": k, "layers": depth, "batch": 2, "gamma": 0, "alpha": float("nan"),
                     "ms": list(plain_ms * (1 + spread * rng.uniform(-1, 1, 8))), "tokens": [1] * 8, "noisy": False})
        rows.append({"kind": "speculative", "bracket": k, "layers": depth, "batch": 2, "gamma": 3, "alpha": 0.7,
                     "ms": list(iteration_ms * (1 + spread * rng.uniform(-1, 1, 8))),
                     "tokens": list(rng.integers(1, 5, 8)), "noisy": False})
    return pd.DataFrame(rows)


def _steps_with_ends(tpot, draft, verify, rel=0.01, layer=None):
    """Steps with ±rel intervals; layer: one layer's (draft, verify) ms for the per-layer interval."""
    layer = layer or (draft / 2, verify / 2)

    def one(ms, per_layer):
        return (ms, 0, ms * (1 - rel), ms * (1 + rel), (per_layer, per_layer * (1 - rel), per_layer * (1 + rel)))

    return {("tpot", 2): one(tpot, tpot / 2), ("draft", 2): one(draft, layer[0]),
            ("verify", 2, 3): one(verify, layer[1])}


@pytest.mark.parametrize(("verify", "spread", "expected"), [(12.0, 0.01, "within"), (6.0, 0.01, "over"),
                                                             (9.5, 0.15, "unresolved")])
def test_the_loop_check_answers_within_over_or_unresolved_on_the_published_figures(verify, spread, expected):
    # the loop: 21 ms per iteration at 2 layers, 33 ms at 4 (12 ms per layer more: one verify layer and 3 draft
    # layers of 2 ms); plain decode 11 ms. The published composition: 3 x 3 + verify ms at 2 layers
    loops = pd.concat([_timed_loops(2, 21.0, 11.0, spread, 1), _timed_loops(4, 33.0, 17.0, spread, 2)])
    shallow = _steps_with_ends(11.0, 3.0, verify, layer=(2.0, 6.0))
    deep = {"layers": 4, "draft_layers": 2, "published": _steps_with_ends(17.0, 5.0, verify + 12.0 - 6.0,
                                                                           layer=(2.0, 6.0))}
    row = sp.loop_check_table(loops, shallow, shallow, layers=2, draft_layers=1, goal_pct=15.0, deep=deep).iloc[0]
    assert row["published_iteration_ms"] == 9.0 + verify and row["deep_layers"] == 4
    assert row["published_error_low_pct"] < row["published_error_pct"] < row["published_error_high_pct"]
    assert row["per_layer_composed_ms"] == pytest.approx(((15.0 + verify + 6.0) - (9.0 + verify)) / 2)
    assert row["per_layer_error_low_pct"] < row["per_layer_error_pct"] < row["per_layer_error_high_pct"]
    assert row["published_verdict"] == expected and row["verdict"] in (expected, "over")
    assert row["over_goal"] == (row["verdict"] == "over")


def test_the_figures_mark_break_even_points_and_the_summary_flags_over_goal():
    from phasebench.analysis.figures.kit import SERIES_GID
    from phasebench.analysis.phases import speculative_figures as figs

    batches, gammas, alphas = (1, 3), (1, 2, 5), (0.55, 0.8, 0.93)
    table = sp.speculative_table(_steps(batches, gammas), batches, 37, gammas, alphas)
    loops = _timed_loops(2, 21.0, 11.0, 0.01, 3)
    composed = {**_steps(batches, gammas), **_steps_with_ends(11.0, 2.0, 7.0)}  # 13 ms against 21: over
    check = sp.loop_check_table(loops, composed, composed, layers=2, draft_layers=1, goal_pct=15.0)
    assert check["verdict"].tolist() == ["over"]
    tables = {"speculative": table, "speculative_check": check,
              "meta": {"speculate": {"draft": {"name": "the-draft"}}}}
    fig = figs.speculative_figure(tables)
    assert len(fig.axes) == 2
    for ax, batch in zip(fig.axes, batches, strict=True):
        evens = [line for line in ax.get_lines() if line.get_gid() == figs.BREAK_EVEN_GID]
        finite = table[(table["batch"] == batch)].drop_duplicates("gamma")["break_even_alpha"].dropna()
        assert sorted(float(line.get_xdata()[0]) for line in evens) == sorted(finite)
        assert all(line.get_ydata()[0] == 1.0 for line in evens)
        dots = [line for line in ax.get_lines() if line.get_gid() == SERIES_GID]
        assert len(dots) == len(gammas)
    best = figs.best_gamma_figure(tables)
    assert len([line for line in best.axes[0].get_lines() if line.get_gid() == SERIES_GID]) == 2
    text = figs.speculative_summary(tables)
    assert "the-draft" in text and "Break-even α per γ" in text and "OVER GOAL" in text
    assert figs.speculative_summary({}) == ""
    assert "no speculative.csv" in figs.speculative_figure({}).axes[0].texts[0].get_text()


def test_a_phases_folder_with_speculation_loads_and_reports_it(tmp_path):
    import shutil
    from pathlib import Path

    import phasebench.analysis as pa
    from phasebench.analysis.report.sections import speculative_tables

    folder = tmp_path / "phases"
    shutil.copytree(Path(pa.__file__).parent / "sample" / "cpu-phases", folder)
    for name in ("speculative.csv", "speculative_check.csv", "speculative_loops.csv"):  # a sample run with them
        (folder / name).unlink(missing_ok=True)
    assert pa.load_phases(folder).get("speculative") is None and speculative_tables(pa.load_phases(folder)) == []
    batches, gammas, alphas = (1,), (2, 4), (0.6, 0.8)
    sp.speculative_table(_steps(batches, gammas), batches, 128, gammas, alphas).to_csv(folder / "speculative.csv",
                                                                                       index=False)
    composed = {**_steps(batches, gammas), ("draft", 2): (2.0, 0), ("verify", 2, 3): (13.0, 0), ("tpot", 2): (11.0, 0)}
    sp.loop_check_table(_loops(), composed, composed, layers=2, draft_layers=1, goal_pct=15.0).to_csv(
        folder / "speculative_check.csv", index=False)
    tables = pa.load_phases(folder)
    assert len(tables["speculative"]) == 4 and len(tables["speculative_check"]) == 1
    html = "".join(speculative_tables(tables))
    assert "the best γ per α" in html and "the break-even α per γ" in html and "against a real loop" in html
    assert "speedup over plain decode" in pa.speculative_figure(tables).axes[0].get_ylabel()


def test_plain_decode_and_the_verify_pass_take_the_fastest_shape_a_server_could_pad_to():
    # plain decode at batch 1 and 2 slower than at 4 (a slow BLAS shape): a server pads to 4; the verify of 1 x 2
    # positions slower than 1 x 3; a step with a missing op is never padded to
    steps = {("tpot", 1): (10.0, 0), ("tpot", 2): (14.0, 0), ("tpot", 4): (8.0, 0), ("tpot", 8): (5.0, 3),
             ("draft", 1): (1.0, 0), ("draft", 2): (1.5, 0),
             ("verify", 1, 1): (12.0, 0), ("verify", 1, 2): (11.0, 0), ("verify", 2, 1): (13.0, 0),
             ("verify", 2, 2): (15.0, 0)}
    table = sp.speculative_table(steps, (1, 2), 40, (1, 2), (0.6,)).set_index(["batch", "gamma"])
    assert table.loc[(1, 1), "tpot_ms"] == 8.0 and table.loc[(1, 1), "plain_padded_to"] == "4"
    assert table.loc[(2, 1), "tpot_ms"] == 8.0 and table.loc[(2, 1), "plain_padded_to"] == "4"
    assert table.loc[(1, 1), "verify_ms"] == 11.0 and table.loc[(1, 1), "verify_padded_to"] == "1x3"
    assert table.loc[(2, 1), "verify_ms"] == 13.0 and table.loc[(2, 1), "verify_padded_to"] == "2x2"
    assert table.loc[(1, 2), "draft_padded_to"] == "1" and table.loc[(2, 2), "draft_step_ms"] == 1.5
    e = sp.expected_tokens(0.6, 1)
    assert table.loc[(1, 1), "speedup"] == pytest.approx(e * 8.0 / (1.0 + 11.0), rel=1e-14)
    # against the padded plain decode no speedup passes E (every verify here costs more than 8 ms)
    assert not table["exceeds_e"].any() and (table["speedup"] <= table["expected_tokens_per_pass"]).all()
    quick = sp.speculative_table({**steps, ("verify", 1, 1): (4.0, 0)}, (1,), 40, (1,), (0.6,)).iloc[0]
    assert quick["exceeds_e"] and quick["speedup"] > quick["expected_tokens_per_pass"]
    assert not quick["best_gamma"]  # a speedup past E is never the best γ
    # the loop check runs the unpadded shapes: only a row padded nowhere is the figure it checks
    assert not table["loop_shapes"].any()
    plain = {k: v for k, v in steps.items() if k != ("tpot", 4)} | {("verify", 1, 2): (30.0, 0)}
    assert sp.speculative_table(plain, (1,), 40, (1,), (0.6,)).iloc[0]["loop_shapes"]
    # without intervals the speedup has none; with them, its ends bracket it
    assert math.isnan(table.loc[(1, 1), "speedup_low"])
    ends = {k: (v[0], v[1], 0.95 * v[0], 1.05 * v[0], (math.nan,) * 3) for k, v in steps.items()}
    row = sp.speculative_table(ends, (1,), 40, (1,), (0.6,)).iloc[0]
    assert row["speedup_low"] < row["speedup"] < row["speedup_high"]
