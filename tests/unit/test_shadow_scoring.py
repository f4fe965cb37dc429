"""Shadow mode's scoring (policies/act/shadow.py): an action's predicted gain at its tick, and its realised gain as
the geometric mean of the same ratio over the ticks of the horizon that followed."""

from __future__ import annotations

import math

import pytest

from policies.act.shadow import ShadowLedger, gain_on, observe_tick, record_action, with_deployed
from policies.types import CurvePoint


def curve(**speedups: float) -> tuple[CurvePoint, ...]:
    """A curve from k<gamma>=S pairs; gamma 0 is always 1.0."""
    points = {0: 1.0, **{int(name[1:]): value for name, value in speedups.items()}}
    return tuple(CurvePoint(gamma=g, speedup=s, speedup_low=s, speedup_high=s, expected_accepted_length=1.0,
                            step_time_s=0.01) for g, s in sorted(points.items()))


def test_the_gain_is_a_ratio_of_the_curves_speedups() -> None:
    assert gain_on(curve(k3=0.9), 0, 3) == pytest.approx(1 / 0.9)
    assert gain_on(curve(k3=1.4), 3, 0) == pytest.approx(1.4)
    assert gain_on(curve(k3=1.4), 5, 0) is None  # no such point


def test_an_action_is_scored_over_the_horizon_that_followed_it() -> None:
    ledger = with_deployed(ShadowLedger(), 0)
    ledger, closed = record_action(ledger, at_s=100.0, to_k=3, curve=curve(k3=1.40))
    assert closed is None
    assert ledger.running_k == 3 and ledger.open_action is not None
    assert ledger.open_action.predicted_gain == pytest.approx(1.40)
    # The load rose: k 3 priced 1.30, then 1.10, then 0.95 over the next ticks; the horizon is 30 s.
    for t, s in ((110.0, 1.30), (120.0, 1.10), (130.0, 0.95)):
        ledger, closed = observe_tick(ledger, now_s=t, curve=curve(k3=s), horizon_s=30.0)
    assert closed is not None
    assert closed.realised_gain == pytest.approx(math.exp((math.log(1.30) + math.log(1.10) + math.log(0.95)) / 3))
    assert closed.ticks == 3
    assert ledger.open_action is None and ledger.evaluated == 1 and ledger.last == closed


def test_ticks_that_are_not_ok_add_nothing_and_no_ok_tick_leaves_no_realised_gain() -> None:
    ledger, _ = record_action(with_deployed(ShadowLedger(), 3), at_s=0.0, to_k=0, curve=curve(k3=0.8))
    ledger, closed = observe_tick(ledger, now_s=5.0, curve=None, horizon_s=10.0)
    assert closed is None
    ledger, closed = observe_tick(ledger, now_s=10.0, curve=None, horizon_s=10.0)
    assert closed is not None and closed.realised_gain is None and closed.ticks == 0
    assert closed.action.predicted_gain == pytest.approx(1 / 0.8)


def test_the_next_action_closes_the_open_one_early_and_starts_from_its_k() -> None:
    ledger, _ = record_action(with_deployed(ShadowLedger(), 0), at_s=0.0, to_k=3, curve=curve(k3=1.5))
    ledger, _ = observe_tick(ledger, now_s=5.0, curve=curve(k3=1.2), horizon_s=600.0)
    ledger, closed = record_action(ledger, at_s=10.0, to_k=1, curve=curve(k1=1.1, k3=1.0))
    assert closed is not None and closed.realised_gain == pytest.approx(1.2) and closed.ticks == 1
    assert ledger.open_action is not None
    assert (ledger.open_action.from_k, ledger.open_action.to_k) == (3, 1)
    assert ledger.open_action.predicted_gain == pytest.approx(1.1)


def test_the_engines_k_is_taken_only_until_the_first_action() -> None:
    ledger = with_deployed(ShadowLedger(), 3)
    ledger, _ = record_action(ledger, at_s=0.0, to_k=0, curve=curve(k3=0.8))
    assert with_deployed(ledger, 3).running_k == 0  # the shadow deployment runs what the shadow action chose
