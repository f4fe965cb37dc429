"""Restart-cost-aware decisions (policies/decide.py rule 4) and the re-measuring probe (advise.probe_for)."""

from __future__ import annotations

from policies.advise import probe_for
from policies.decide import DecideConfig, change_cost_of, change_pays
from policies.types import CurvePoint


def _curve(*speedups: float) -> tuple[CurvePoint, ...]:
    return tuple(
        CurvePoint(gamma=g, speedup=s, speedup_low=s, speedup_high=s, expected_accepted_length=1.0,
                   step_time_s=0.01, extrapolated=False)
        for g, s in enumerate((1.0, *speedups))
    )


def test_a_gain_that_pays_back_its_restart_is_recommended_and_a_small_one_is_not() -> None:
    # 1.40 -> 1.45: gain 0.05 / 1.40 = 3.57%, x 600 s = 21.4 s > 20 s of restart.
    assert change_pays(gain=1.45 / 1.40 - 1, batch=32, waiting=0, change_cost_s=20, payback_horizon_s=600)[0]
    # 1.40 -> 1.43: 2.14% x 600 = 12.9 s < 20 s.
    pays, text = change_pays(gain=1.43 / 1.40 - 1, batch=32, waiting=0, change_cost_s=20, payback_horizon_s=600)
    assert not pays
    assert "change cost 20.0s" in text


def test_queued_requests_raise_the_bar() -> None:
    # 32 waiting behind 32 running: 20 x (1 + 1) = 40 s, and 21.4 s no longer clears it.
    assert change_cost_of(batch=32, waiting=32, change_cost_s=20) == 40.0
    assert not change_pays(gain=1.45 / 1.40 - 1, batch=32, waiting=32, change_cost_s=20, payback_horizon_s=600)[0]


def test_free_changes_always_pay() -> None:
    assert change_pays(gain=0.001, batch=1, waiting=0, change_cost_s=0, payback_horizon_s=600) == (True, "")


def test_probe_waits_until_the_memory_is_old_enough_to_be_worth_a_look() -> None:
    config = DecideConfig(change_cost_s=20, payback_horizon_s=600, dwell_s=120)
    remembered = _curve(0.9, 0.8, 0.7)
    prior = _curve(1.3, 1.5, 1.4)
    args = {"gamma": 1, "remembered": remembered, "prior": prior, "batch": 4.0, "waiting": 0.0,
            "config": config, "half_life_s": 1800.0}
    # Cost: 2 x 20 + 120 s x (1 - 0.9) = 52 s. Gain: p x (1.5 - 1) x 600.
    # age 600 s: p = 1 - 2^(-1/3) = 0.206 -> 61.9 s > 52 s; age 450 s: p = 0.159 -> 47.7 s < 52 s.
    probe = probe_for(age_s=600.0, **args)  # type: ignore[arg-type]
    assert probe is not None and probe.gamma == 1
    assert probe_for(age_s=450.0, **args) is None  # type: ignore[arg-type]


def test_no_probe_when_even_the_prior_says_speculation_loses() -> None:
    config = DecideConfig(change_cost_s=0)
    below = _curve(0.9, 0.95)
    assert probe_for(age_s=1e5, gamma=1, remembered=below, prior=below, batch=64, waiting=0, config=config,
                     half_life_s=1800.0) is None
