"""Probe: while off, when to switch on for a while to measure the acceptance again (value of information).

Nothing is measured while speculation is off, so a workload that turned drafter-friendly stays invisible until
someone looks; `probe_for` weighs the chance the workload moved since the profile was measured against what
looking costs (`probe_for`'s docstring has the rule, its units and a worked example). `decide` publishes the probe
it returns when the rule would otherwise stay off, and holds it until a live window is measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.decide.change_cost import change_cost_of
from policies.decide.rule import DecideConfig, Probe, best_point
from policies.decide.value import point_at
from policies.types import CurvePoint


@dataclass(frozen=True, slots=True)
class Remembered:
    """What a probe would measure again: the profile's age `age_s` (s; inf: no usable profile), the k it was
    measured at (`gamma`, >= 1: where the probe runs) and the curve priced from it (`curve`)."""

    age_s: float
    gamma: int
    curve: Sequence[CurvePoint]


def probe_for(
    remembered: Remembered,
    *,
    prior: Sequence[CurvePoint],
    inflight_s: float,
    config: DecideConfig,
    half_life_s: float,
) -> Probe | None:
    """Whether to switch on for a while to re-measure acceptance, while off on a profile remembered
    `remembered.age_s` ago.

    Nothing is measured while off, so a workload that turned drafter-friendly (chat -> code) stays invisible
    until someone looks. Looking costs: two changes (on, and back off if the profile still holds), each
    `change_cost_s` + `inflight_s` seconds of full service (policies/decide/change_cost.py: the outage and the in-flight
    work a restart drops), plus the time it runs at the remembered speedup S_mem(gamma) (< 1 is a loss) before
    the advisor may turn it off again: on_s = max(dwell_s, probe_min_s), the dwell or one estimator window to
    measure, whichever is longer. It pays when the expected gain over the payback horizon exceeds that:

        p(age) x (S_prior* - 1) x payback_horizon_s > 2 x (change_cost_s + inflight_s) + on_s x max(0, 1 - S_mem)

    p(age) = 1 - 2^(-age / half_life_s) is the chance the workload has moved since the profile was measured, on
    the memory's own half-life (the rate at which it says a profile goes stale); S_prior* is the best point
    speedup in 1..gamma_max priced with the drafter's prior acceptance (what the drafter does on a typical
    workload) in the objective that applies. Under an ITL SLO both speedup terms are multiplied by share(off),
    plain decoding's share of tokens meeting the SLO, so that they count tokens moved across the SLO per
    delivered token, the unit of the cost (policies/decide/change_cost.py): S_prior* = 99 with 1% of tokens meeting the
    SLO off is a 98% gain in service, not 9800%. When speculation would not pay even at the prior (S_prior* <= 1) it
    never probes. The probe runs at the remembered k (`gamma`, >= 1), where the
    positions will be measured again; once published, decide holds it until a window is measured.
    `age_s` = inf stands for no usable profile (never measured, or too old): p = 1, and the caller passes the
    prior's own curve and its best gamma.
    Units: seconds; speedups are dimensionless ratios vs plain decoding.

    Example (cost 20 s, in-flight 0 s, horizon 600 s, dwell 120 s, half-life 1800 s): S_prior* 1.5, S_mem 0.9. At
    age 600 s p = 1 - 2^(-1/3) = 0.206, 0.206 x 0.5 x 600 = 61.9 s > 2 x 20 + 120 x 0.1 = 52 s -> probe at the
    remembered k. At age 450 s p = 0.159 -> 47.7 s < 52 s -> None. `config.explore` False: callers do not ask.
    """
    age_s, gamma = remembered.age_s, remembered.gamma
    star = best_point(prior, config.gamma_max)
    if star is None or star.speedup <= 1.0 or gamma < 1:
        return None
    here = point_at(remembered.curve, gamma)
    s_mem = here.speedup if here is not None else 1.0
    chance = 1.0 - 0.5 ** (max(0.0, age_s) / half_life_s)
    # Under an SLO the curve is SLO goodput over plain decoding's: per delivered token (the unit of the cost) a
    # gain is worth share(off) as much (policies/decide/change_cost.py).
    off = point_at(prior, 0)
    unit = off.slo_share if off is not None and off.slo_share is not None else 1.0
    won = chance * (star.speedup - 1.0) * unit * config.payback_horizon_s
    one_change = change_cost_of(change_cost_s=config.change_cost_s, inflight_s=inflight_s)
    on_for_s = max(config.dwell_s, config.probe_min_s)
    cost = 2.0 * one_change + on_for_s * max(0.0, 1.0 - s_mem) * unit
    if won <= cost:
        return None
    seen = f"remembered profile is {age_s:.0f}s old" if math.isfinite(age_s) else "no usable measured profile"
    why = (
        f"{seen}, P(workload moved) {chance:.1%} x prior S({star.gamma})="
        f"{star.speedup:.2f} gain{f' x share {unit:.2f} meeting the SLO off' if unit != 1.0 else ''} x "
        f"{config.payback_horizon_s:.0f}s = {won:.1f}s > probe cost {cost:.1f}s "
        f"(2 changes + {on_for_s:.0f}s at {'remembered' if math.isfinite(age_s) else 'prior'} S({gamma})={s_mem:.2f})"
    )
    return Probe(gamma=gamma, why=why)
