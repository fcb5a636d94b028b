"""The routings of a mixture-of-experts case: seeded, prefix-stable across batch sizes, each one's shape (balanced
counts, Zipf's skew), and the expected coverage under uniform routing against draws."""

from __future__ import annotations

import numpy as np
import pytest
from phasebench.bench.spec.routing import draw_routing, expected_touched, touched_experts, zipf_exponent


@pytest.mark.parametrize("routing", ["uniform", "zipf-1.2", "balanced"])
def test_a_larger_batch_routes_its_first_tokens_as_a_smaller_one(routing):
    small, large = draw_routing(5, 12, 3, routing, 7), draw_routing(40, 12, 3, routing, 7)
    assert np.array_equal(small, large[:5]) and large.dtype == np.int32
    assert all(len(set(row)) == 3 for row in large.tolist()) and large.min() >= 0 and large.max() < 12
    assert not np.array_equal(draw_routing(40, 12, 3, routing, 8), large)  # another seed, another routing


def test_balanced_gives_each_expert_the_same_slots_give_or_take_one():
    counts = np.bincount(draw_routing(37, 10, 4, "balanced").ravel(), minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 148


def test_zipf_skews_toward_few_experts_and_the_exponent_sets_how_much():
    def top_share(routing):
        counts = np.sort(np.bincount(draw_routing(2000, 64, 2, routing).ravel(), minlength=64))[::-1]
        return counts[:4].sum() / counts.sum()

    assert top_share("uniform") < 0.1 < top_share("zipf-0.8") < top_share("zipf-1.5")


def test_uniform_coverage_follows_the_expected_curve():
    draws = [touched_experts(b, 128, 8, "uniform", seed) for b in (8, 32) for seed in range(20)]
    mean_8, mean_32 = np.mean(draws[:20]), np.mean(draws[20:])
    assert expected_touched(128, 8, 1) == 8
    assert abs(mean_8 - expected_touched(128, 8, 8)) < 2 and abs(mean_32 - expected_touched(128, 8, 32)) < 2
    assert np.allclose(expected_touched(128, 8, [8, 32]), [51.6, 111.8], atol=0.1)  # the 52 and 112


@pytest.mark.parametrize("bad", ["zipf", "zipf-0", "zipf-x", "Uniform", "zipf-1.2 ", 3])
def test_bad_routings_are_one_line(bad):
    with pytest.raises(ValueError, match="routing: must be uniform, balanced or zipf-S"):
        zipf_exponent(bad)
