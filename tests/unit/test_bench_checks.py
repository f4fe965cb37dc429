"""Per-tick quality checks: crossover lag, flapping, steady-load changes (pure functions over k sequences)."""

from __future__ import annotations

from service.bench.checks import (
    QualityChecks,
    Truth,
    Utility,
    change_ticks,
    crossing_lags,
    flaps,
    steady_changes,
    steady_ticks,
    worst_wrong_spell_s,
)


def on_off_utility(best: list[int]) -> Utility:
    """u(i, g): 1.0 when g is the best gamma of interval i, 0.5 otherwise."""

    def utility(i: int, g: int) -> float:
        return 1.0 if g == best[min(i, len(best) - 1)] else 0.5

    return utility


def test_change_ticks_compares_the_first_tick_with_the_initial_k() -> None:
    assert change_ticks(3, [3, 0, 0, 2]) == [1, 3]
    assert change_ticks(0, [3, 3]) == [0]


def test_lag_counts_ticks_until_the_policy_agrees() -> None:
    oracle = [3, 3, 0, 0, 0, 0, 0, 0]
    policy = [3, 3, 3, 3, 3, 0, 0, 0]
    best = [3, 3, 3, 0, 0, 0, 0, 0, 0]  # interval i+1 is what tick i's choice runs in
    utility = on_off_utility(best)
    [crossing] = crossing_lags(policy, oracle, oracle_initial_k=3, interval_s=5.0, utility=utility)
    # The oracle switched at tick 2 (t = 3 x 5 s = 15 s); the policy agreed at tick 5: 3 ticks x 5 s = 15 s.
    assert crossing.t_s == 15.0
    assert crossing.lag_s == 15.0
    checks = QualityChecks(crossings=(crossing,), window_s=60.0, flaps=0, steady_changes=0)
    assert checks.worst_lag_windows == 15.0 / 60.0


def test_a_crossing_never_matched_is_missed() -> None:
    oracle = [0, 0, 3, 3]
    policy = [3, 3, 0, 0]
    best = [0, 0, 0, 3, 3]
    crossings = crossing_lags(policy, oracle, oracle_initial_k=3, interval_s=5.0,
                              utility=on_off_utility(best))
    # Two oracle changes (tick 0: 3 -> 0, tick 2: 0 -> 3); the policy is opposite throughout.
    assert [c.lag_s for c in crossings] == [None, None]
    assert QualityChecks(crossings=crossings, window_s=60.0, flaps=0, steady_changes=0).worst_lag_windows == float(
        "inf"
    )


def test_an_equally_good_gamma_agrees() -> None:
    oracle = [3, 2]
    policy = [3, 3]

    def utility(i: int, g: int) -> float:
        return 0.99 if g == 3 else 1.0  # gamma 3 is within the 2% margin of the best

    [crossing] = crossing_lags(policy, oracle, oracle_initial_k=3, interval_s=5.0, utility=utility)
    assert crossing.lag_s == 0.0


def test_flaps_are_changes_within_a_dwell_of_the_previous() -> None:
    # Gaps: 30 s (flap at dwell 120), 200 s, 100 s (flap).
    assert flaps([100.0, 130.0, 330.0, 430.0], dwell_s=120.0) == 2
    assert flaps([100.0], dwell_s=120.0) == 0


def test_steady_changes_skip_corrections_and_count_the_rest() -> None:
    best = [5] * 10
    utility = on_off_utility(best)
    policy = [3, 5, 3, 5, 5]
    steady = [True] * 5
    # Tick 1 (3 -> 5) raises utility 0.5 -> 1.0: a correction. Tick 2 (5 -> 3) lowers it and tick 3 raises it back
    # (a correction again): one noise change.
    assert steady_changes(policy, steady, initial_k=3, truth=Truth(utility=utility)) == 1
    assert steady_changes(policy, [False] * 5, initial_k=3, truth=Truth(utility=utility)) == 0


def test_steady_ticks_need_constant_rate_and_acceptance_over_the_span() -> None:
    rates = [1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0]
    acceptance = [0.7] * 7
    # Span 10 s = 2 ticks back: ticks 3 and 4 still have 1.0 within their span (ticks 1..3, 2..4); tick 5 looks
    # at ticks 3..5, all 5.0: steady again.
    assert steady_ticks(rates, acceptance, interval_s=5.0, span_s=10.0) == [True, True, True, False, False, True,
                                                                           True]
    drifting = [0.7, 0.7, 0.75, 0.75, 0.75]
    assert steady_ticks([1.0] * 5, drifting, interval_s=5.0, span_s=10.0) == [True, True, False, False, True]


def test_a_steady_change_onto_the_oracles_gamma_is_not_noise_even_when_nearly_tied() -> None:
    # Every gamma within 1% of the others (no SLO: latency only breaks ties): 3 -> 0 raises utility by 0.005 <
    # 0.02, but 0 is what the oracle runs, so it moved towards the oracle; 0 -> 2 did not (the oracle stays at 0).
    def tied(i: int, g: int) -> float:
        return 1.0 if g == 0 else 0.995

    policy = [0, 0, 2, 2]
    oracle = [0, 0, 0, 0]
    assert steady_changes(policy, [True] * 4, initial_k=3, oracle_k=oracle, truth=Truth(utility=tied)) == 1
    # Without the oracle's choices both count (the utility test alone).
    assert steady_changes(policy, [True] * 4, initial_k=3, truth=Truth(utility=tied)) == 2


def test_a_steady_change_for_a_real_latency_gain_is_not_noise() -> None:
    # Goodput tied (no SLO, the server keeps up): utility 0.995 for every gamma but 1 (1.0, the oracle's).
    # 3 -> 0 halves the true ITL (20 -> 10 ms) at no loss of utility: a real gain, not noise. 0 -> 4 raises the
    # ITL (10 -> 30 ms): noise.
    def tied(i: int, g: int) -> float:
        return 1.0 if g == 1 else 0.995

    def itl(i: int, g: int) -> float:
        return {0: 0.010, 1: 0.012, 3: 0.020, 4: 0.030}[g]

    policy = [0, 0, 4, 4]
    assert steady_changes(policy, [True] * 4, initial_k=3, oracle_k=[1] * 4, truth=Truth(tied, itl_s=itl)) == 1
    # Without the ITL both count.
    assert steady_changes(policy, [True] * 4, initial_k=3, oracle_k=[1] * 4, truth=Truth(utility=tied)) == 2


def test_a_move_made_in_a_light_spell_is_judged_on_the_heavy_phase_that_follows() -> None:
    # Light for ticks 0..9 (every gamma ties), heavy from tick 10 (gamma 1 is 10% better than gamma 3). A move
    # 3 -> 1 at tick 2 makes nothing better in the next interval, but over a 20-tick horizon it gains 0.1 x 10/20.
    def utility(i: int, g: int) -> float:
        return 1.0 if i < 10 or g == 1 else 0.9

    policy = [3, 3, 1, 1, 1, 1]
    assert steady_changes(policy, [True] * 6, initial_k=3, truth=Truth(utility=utility)) == 1
    # The run ends before the horizon does.
    assert steady_changes(policy, [True] * 6, initial_k=3, truth=Truth(utility=utility, horizon_ticks=20)) == 1
    long_run = policy + [1] * 20
    assert steady_changes(long_run, [True] * 26, initial_k=3, truth=Truth(utility=utility, horizon_ticks=20)) == 0
    # The other way round (1 -> 3 before the heavy phase) stays noise over any horizon.
    worse = [1, 1, 3] + [3] * 23
    assert steady_changes(worse, [True] * 26, initial_k=1, truth=Truth(utility=utility, horizon_ticks=20)) == 1


def test_a_wrong_spell_counts_even_when_the_oracle_moved_before_it() -> None:
    # The oracle moves to 1 at tick 1, while 3 is still as good (the load has not risen yet); from tick 4 gamma 1
    # is better and the policy only moves at tick 7: no crossing lag (it agreed at tick 1), a 3-tick wrong spell.
    oracle = [3, 1, 1, 1, 1, 1, 1, 1, 1]
    policy = [3, 3, 3, 3, 3, 3, 3, 1, 1]

    def utility(i: int, g: int) -> float:
        return 1.0 if i < 5 or g == 1 else 0.6  # interval i+1 is what tick i's choice runs in

    [crossing] = crossing_lags(policy, oracle, oracle_initial_k=3, interval_s=5.0, utility=utility)
    assert crossing.lag_s == 0.0
    spell = worst_wrong_spell_s(policy, oracle, interval_s=5.0, utility=utility)
    assert spell == 15.0
    checks = QualityChecks(crossings=(crossing,), window_s=60.0, flaps=0, steady_changes=0, worst_wrong_spell_s=spell)
    assert checks.worst_lag_windows == 15.0 / 60.0


def test_the_first_ticks_correction_is_not_a_wrong_spell() -> None:
    # Deployed at 3 where 1 is best from the start: the policy corrects at tick 3, then agrees; /best grades it.
    oracle = [1, 1, 1, 1, 1]
    policy = [3, 3, 3, 1, 1]

    def utility(i: int, g: int) -> float:
        return 1.0 if g == 1 else 0.5

    assert worst_wrong_spell_s(policy, oracle, interval_s=5.0, utility=utility) == 0.0
    assert worst_wrong_spell_s([1, 3, 3, 1, 1], oracle, interval_s=5.0, utility=utility) == 10.0
