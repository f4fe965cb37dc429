"""Wilson score interval: closed forms at the edges, coverage of the point, narrowing with more trials."""

from __future__ import annotations

import pytest

from policies.estimate.intervals import wilson_interval


def test_fixture_position_zero_matches_hand_computation() -> None:
    # 515 of 540, z = 1.96: p = 0.953704, z²/n = 3.8416/540 = 0.0071141,
    # centre = (0.953704 + 0.0035570) / 1.0071141 = 0.950499,
    # half = 1.96 / 1.0071141 * sqrt(0.953704 * 0.046296 / 540 + 3.8416 / (4 * 540²)) = 1.946155 * 0.0092227
    #      = 0.017949  ->  (0.93255, 0.96845)
    low, high = wilson_interval(515, 540, z=1.96)
    assert low == pytest.approx(0.93255, abs=1e-5)
    assert high == pytest.approx(0.96845, abs=1e-5)


def test_all_successes_lower_bound_is_n_over_n_plus_z_squared() -> None:
    # At p = 1 the Wilson lower bound simplifies to n / (n + z²): 10 / (10 + 3.8416) = 0.722459.
    low, high = wilson_interval(10, 10, z=1.96)
    assert low == pytest.approx(10 / 13.8416)
    assert high == 1.0


def test_no_successes_upper_bound_is_z_squared_over_n_plus_z_squared() -> None:
    # Mirror image of the p = 1 case: upper = z² / (n + z²) = 3.8416 / 13.8416 = 0.277541.
    low, high = wilson_interval(0, 10, z=1.96)
    assert low == 0.0
    assert high == pytest.approx(3.8416 / 13.8416)


@pytest.mark.parametrize(("successes", "trials"), [(0, 1), (1, 1), (3, 7), (199, 200), (1, 200), (0.5, 2.5)])
def test_interval_contains_the_point_and_stays_in_unit_range(successes: float, trials: float) -> None:
    low, high = wilson_interval(successes, trials, z=1.96)
    assert 0.0 <= low <= successes / trials <= high <= 1.0


def test_interval_narrows_with_more_trials_at_the_same_proportion() -> None:
    # Width ~ 2z*sqrt(p(1-p)/n): 100x the trials should shrink it about 10x.
    low_small, high_small = wilson_interval(90, 100, z=1.96)
    low_large, high_large = wilson_interval(9000, 10000, z=1.96)
    assert high_large - low_large < (high_small - low_small) / 5


def test_bounds_are_monotone_in_successes() -> None:
    bounds = [wilson_interval(k, 50, z=1.96) for k in range(51)]
    lows = [low for low, _ in bounds]
    highs = [high for _, high in bounds]
    assert lows == sorted(lows)
    assert highs == sorted(highs)


def test_interval_is_symmetric_under_swapping_successes_and_failures() -> None:
    low, high = wilson_interval(30, 40, z=1.96)
    mirror_low, mirror_high = wilson_interval(10, 40, z=1.96)
    assert low == pytest.approx(1 - mirror_high)
    assert high == pytest.approx(1 - mirror_low)


def test_zero_z_collapses_to_the_point() -> None:
    assert wilson_interval(3, 4, z=0.0) == pytest.approx((0.75, 0.75))


@pytest.mark.parametrize(
    ("successes", "trials", "z"),
    [(1, 0, 1.96), (-1, 10, 1.96), (11, 10, 1.96), (5, 10, -1.0), (float("nan"), 10, 1.96)],
)
def test_invalid_inputs_are_rejected(successes: float, trials: float, z: float) -> None:
    with pytest.raises(ValueError):
        wilson_interval(successes, trials, z=z)
