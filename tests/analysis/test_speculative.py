"""Speculative decoding's arithmetic: E(α, γ), its spread, iteration time, speedup, best γ and break-even α, checked
in float64 against values worked by hand and against the limits α -> 0 and α -> 1."""

import math

import numpy as np
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


def test_the_loop_check_compares_at_the_realised_tokens_and_flags_over_goal():
    composed = {("tpot", 2): (11.0, 0), ("draft", 2): (2.0, 0), ("verify", 2, 3): (13.0, 0)}  # 19 ms per iteration
    published = {("tpot", 2): (11.0, 0), ("draft", 2): (3.0, 0), ("verify", 2, 3): (12.0, 0)}  # 21 ms
    table = sp.loop_check_table(_loops(), composed, published, layers=2, draft_layers=1, goal_pct=15.0)
    (row,) = table.itertuples()
    assert row.realised_tokens_per_pass == 2.5 and row.iterations == 4 and row.loop_iteration_ms == 21.0
    assert row.loop_tokens_per_s_per_user == pytest.approx(1e3 * 2.5 / 21.0, rel=1e-14)
    assert row.composed_tokens_per_s_per_user == pytest.approx(1e3 * 2.5 / 19.0, rel=1e-14)
    assert row.error_pct == pytest.approx(100 * (21.0 / 19.0 - 1), rel=1e-12) and not row.over_goal
    assert row.published_error_pct == pytest.approx(0.0, abs=1e-12)
    assert row.plain_ms == 11.0 and row.loop_speedup == pytest.approx(2.5 * 11.0 / 21.0, rel=1e-14)
    e, std = sp.expected_tokens(0.7, 3), sp.tokens_std(0.7, 3)
    assert row.expected_tokens_per_pass == e and row.realised_z == pytest.approx((2.5 - e) / (std / 2), rel=1e-12)
    assert row.noisy_brackets == 1 and row.brackets == 2
    slow = {**composed, ("verify", 2, 3): (7.0, 0)}  # 13 ms composed against 21 measured: +61.5%
    assert sp.loop_check_table(_loops(), slow, published, layers=2, draft_layers=1, goal_pct=15.0)["over_goal"].all()
    gone = {**composed, ("verify", 2, 3): (math.nan, 3)}
    missing = sp.loop_check_table(_loops(), gone, published, layers=2, draft_layers=1, goal_pct=15.0).iloc[0]
    assert math.isnan(missing["error_pct"]) and missing["over_goal"]


def test_the_figures_mark_break_even_points_and_the_summary_flags_over_goal():
    from phasebench.analysis.figures.kit import SERIES_GID
    from phasebench.analysis.phases import speculative_figures as figs

    batches, gammas, alphas = (1, 3), (1, 2, 5), (0.55, 0.8, 0.93)
    table = sp.speculative_table(_steps(batches, gammas), batches, 37, gammas, alphas)
    composed = {**_steps(batches, gammas), ("verify", 2, 3): (7.0, 0), ("draft", 2): (2.0, 0), ("tpot", 2): (11.0, 0)}
    check = sp.loop_check_table(_loops(), composed, composed, layers=2, draft_layers=1, goal_pct=15.0)
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
