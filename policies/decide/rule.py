"""Decide: the predicted speedup curve -> the published recommendation.

The rule: publish the option worth most over the payback horizon H, once waiting for it has cost what a change costs.

    V(o) = H x g(o) - C             C = (change_cost_s + in-flight work + weighed queue) x cost_scale    (s)
    V_try(gamma) = T x mu + (H - T) x E[max(g, -C / (H - T))] - C      g ~ N(mu = S - 1, sigma = band / 3.29)
    wait = C / r, clipped to [confirm_s, dwell_s]                      r = the candidate's expected gain now

Every option o (off, or on at gamma 1..gamma_max; while on, at most one gamma past the measured k) is valued
against the one that runs, c: g(o) is its gain over c per delivered token at the pessimistic end of its 90% band
(policies/decide/value.py; a free move between gammas: its expected gain), C what one change destroys in seconds
of service (policies/decide/change_cost.py; 0 for an engine that adapts per batch). The candidate is the option
with the greatest V among those with g >= margin; when none has V > 0, what runs stays. The low end decides
whether to change at all. Where the unknown is the acceptance of positions never run (a turn-on, a move past the
measured k), running them measures them within T = max(dwell_s, probe_min_s) and a worse setting can be left at
one more change's cost: the downside is bounded, so V_try (the value of information) decides where a turn-on or
a sure move up goes, and whether to explore one gamma past the measured k with no sure change. Where only the
cost model is unsure (moves down, off, a measured gamma) the low end stands: while one k runs the point estimate
of the verification cost is its prior (policies/model/calibrate.py), which can be off by a factor
(policies/model/profiles.py `per_token_step_s`). The candidate is published once some change has been worth
making for its wait, has kept its side (more speculation, or less) for min(wait, confirm_s) (one outlying window
cannot publish a change, nor withdraw one: a spell of windows without the change being worth it holds its wait,
which is lost once the spell reaches confirm_s), and the last change is dwell_s old: the break-even rule, which
loses at most twice what hindsight would on a condition of any length. Hysteresis and dwell follow from the band
and the cost: to switch on, S's low end must clear 1 + margin; to switch off, the running option's high end must
fall short of 1 by margin x S(c); a grossly wrong setting (r >= C / confirm_s) is corrected after confirm_s, a gain
below C / dwell_s waits dwell_s.

Worked example (H 600 s, C 22.6 s, margin 0.02, confirm 30 s, dwell 120 s): running gamma 3 at S 1.40, gamma 2
priced at 1.48 with gain_sd 0.01: g = (1.48 x 0.984 - 1.40) / 1.40 = 4.0%, V = 23.9 - 22.6 = +1.3 s, r = 0.08 /
1.40 = 5.7%, wait 22.6 / 0.057 = 396 s -> 120 s. Running gamma 8 at S 0.70 at moderate load, gamma 2 at 1.30
(gain_sd 0.05): g = 71%, r = 86%, wait 26 s -> 30 s. Off with nothing measured, S(1) = 1.39 [1.11..1.64], S(3) =
1.64 [1.04..2.31], C 20 s: gamma 1 pays at its low end (+11% x 600 = 66 s > 20 s), so speculation goes on;
V_try(1) = 214 s, V_try(3) = 367 s: it goes on at gamma 3, after 20 / 0.64 = 31 s.

Refinements, each stated where it lives: of the options as sure as the best, the likeliest (`_likeliest`); a
turn-off kept at a measured gamma that does as well as off (`_keep_measuring`); a deployed k off the curve
(`_choose`); where a turn-on or a move up goes (policies/decide/trial.py) and how trials are spaced
(policies/decide/publish.py `left_trial`); a plan over the recent load (policies/decide/state.py `HorizonCurve`,
policies/decide/horizon.py); a probe while off on a remembered profile (policies/decide/hold.py `probe_hold`,
policies/decide/probe.py); evidence that is not ok never flips anything (policies/decide/hold.py). The first
decision publishes the current deployment as the baseline (not a change).

Where the stages live: this file values the options and picks the candidate (`decide`, `_candidate`, `_choose`,
`_change`); policies/decide/state.py holds the config, the carried state and the tick's inputs;
policies/decide/publish.py runs the wait clock; policies/decide/trial.py values trials; policies/decide/hold.py
holds on without good evidence; policies/decide/explain.py words the reason and its causes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from policies.decide.change_cost import change_cost_of, inflight_work_s
from policies.decide.explain import cause, decision_for, describe, fmt_point, why_not_ok, why_stays, worth_text
from policies.decide.hold import held, hold_last, probe_hold
from policies.decide.publish import publish_tick, wait_s
from policies.decide.state import (
    NO_INPUTS,
    Candidate,
    DecideConfig,
    DecideInputs,
    DecideState,
    HorizonCurve,
    Prices,
    Probe,
    ProbeHold,
    Tick,
    deployment_of,
    key_of,
    least_trial_s,
    measured_k_of,
    side_of,
)
from policies.decide.trial import trial_for, try_more
from policies.decide.value import (
    Key,
    Valued,
    best_on,
    expected_gain,
    point_at,
    value_options,
)
from policies.model.costmodel import step_batch
from policies.types import CurvePoint, DataState, Decision, Evidence, WhyCode

__all__ = [
    "DecideConfig",
    "DecideInputs",
    "DecideState",
    "HorizonCurve",
    "Probe",
    "best_point",
    "decide",
    "held",
    "reachable_gamma_limit",
    "wait_s",
]


def best_point(curve: Sequence[CurvePoint], gamma_max: int) -> CurvePoint | None:
    """The point with the highest point speedup among gamma in 1..gamma_max; ties go to the smaller gamma.

    `curve` may be in any order and may be empty; returns None when no point has 1 <= gamma <= gamma_max.
    Example: S(1)=1.20, S(2)=1.35, S(3)=1.35, S(4)=1.30 -> the gamma=2 point.
    """
    return best_on(curve, [(True, gamma) for gamma in range(1, gamma_max + 1)])


def reachable_gamma_limit(*, current_gamma: int, measured_k: int, gamma_max: int) -> int:
    """The largest gamma one move may reach while on: max(measured_k + 1, current_gamma) clipped to
    1..gamma_max, so a published gamma above what runs is never pulled down by the cap.

    Example: measured k=3, current 3, gamma_max 8 -> 4; measured k=3, current 5 -> 5; measured 10, max 8 -> 8.
    """
    return max(1, min(gamma_max, max(measured_k + 1, current_gamma)))


def decide(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    config: DecideConfig,
    state: DecideState,
    now_s: float,
    *,
    inputs: DecideInputs = NO_INPUTS,
) -> tuple[Decision, DecideState]:
    """One decision tick (module docstring): returns the Decision to publish and the state for the next tick.

    `curve` holds one point per gamma 0..gamma_max (speedups vs plain decoding); `now_s` is epoch seconds from the
    caller's clock; `inputs` the probe, the measured flag, the work a restart loses and the plan (`DecideInputs`).
    The Decision's band is the published option's on `curve`.
    """
    stood_in = inputs.acceptance_stands_in and evidence.state is DataState.INSUFFICIENT_DATA
    if evidence.state is not DataState.OK and not stood_in:
        return hold_last(evidence, curve, state, now_s, kind=evidence.state, why=why_not_ok(evidence))
    star = best_point(curve, config.gamma_max)
    if star is None:
        why = f"no predicted speedup for any gamma in 1..{config.gamma_max} (curve has {len(curve)} points)"
        return hold_last(evidence, curve, state, now_s, kind=DataState.ERROR, why=why)
    tick = Tick(evidence=evidence, curve=curve, config=config, now_s=now_s)
    prefix, published = "", state.published
    batch = max(step_batch(evidence), 1.0)
    whys = [cause(WhyCode.BEST, gamma=star.gamma, speedup=star.speedup, low=star.speedup_low,
                 high=star.speedup_high, batch=batch)]
    if published is None:
        base = deployment_of(evidence)
        published = decision_for(evidence, curve, base, reason="", now_s=now_s, changed_at_s=now_s)
        prefix = f"first decision, baseline is the current deployment ({describe(base)}); "
        whys.insert(0, cause(WhyCode.BASELINE))
    current = key_of(published)
    head = f"{describe(current)}: best {fmt_point(star)} at batch {batch:.1f}"
    head += "; planned over the recent load" if _plan_curve(inputs) else ""
    measured = inputs.measured
    if measured is None:
        measured = evidence.speculation_on and evidence.acceptance is not None
    hold = probe_hold(state, current, measured=measured, config=config, now_s=now_s)
    may_try = (state.tried_s is None or now_s - state.tried_s >= config.payback_horizon_s) and (
        state.trial_left_s is None or now_s - state.trial_left_s >= config.probe_backoff_s)
    candidate = _candidate(tick, current, inputs, hold, may_try=may_try)
    candidate = replace(candidate, why=(*whys, *candidate.why))
    return publish_tick(tick, state, published, candidate, reason=prefix + head + candidate.text, hold=hold)


def _plan_curve(inputs: DecideInputs) -> Sequence[CurvePoint]:
    return inputs.plan.curve if inputs.plan is not None else ()


def _prices(tick: Tick, current: Key, inputs: DecideInputs) -> Prices:
    lost_s = inflight_work_s(tick.evidence) if inputs.inflight_s is None else inputs.inflight_s
    today_s = change_cost_of(change_cost_s=tick.config.change_cost_s, inflight_s=lost_s)  # C in this window's units
    plan = _plan_curve(inputs)
    scale = _valid_scale(inputs.plan.cost_scale) if inputs.plan is not None and plan else 1.0
    return Prices(
        today_s=today_s, cost_s=today_s * scale, curve=plan if plan else tick.curve,
        options=_options(current, tick.evidence, tick.config), planned=bool(plan),
    )


def _valid_scale(cost_scale: float) -> float:
    return cost_scale if math.isfinite(cost_scale) and cost_scale > 0 else 1.0


def _candidate(tick: Tick, current: Key, inputs: DecideInputs, hold: ProbeHold, *, may_try: bool) -> Candidate:
    """The option to wait for this tick: what runs while a probe is held; else, while on and `may_try` (no trial
    within H, none left within probe_backoff_s), a move to more drafts valued as a trial (`try_more`: the
    destination of a sure move up, or with no sure change and `explore`, a gamma past the measured k); else the
    valued change; else a probe; else what runs."""
    config, prices = tick.config, _prices(tick, current, inputs)
    choice = _choose(prices.curve, current, prices.options, config, cost_s=prices.cost_s)
    if hold.held:
        # A published probe the engine has not run yet: the curve is still the remembered one.
        held_s = max(0.0, tick.now_s - hold.since_s) if hold.since_s is not None else 0.0
        return Candidate(key=current, wait_s=config.dwell_s, text=hold.note,
                          why=(cause(WhyCode.PROBE_HELD, gamma=current[1], held_s=held_s),))
    sure = choice if choice is not None and choice.value_s > 0 and choice.gain >= config.margin else None
    # A trial saves restarts; with none to save (C = 0) the climb goes one measured gamma at a time.
    # The trial starts from what the engine runs: a published change it has not applied yet is not measured.
    up = current[0] and may_try and prices.cost_s > 0 and current == deployment_of(tick.evidence) and (
        side_of(sure.key, current) > 0 if sure is not None else config.explore)
    tried = try_more(tick, prices, current, sure=sure, note=hold.note) if up else None
    if tried is not None:
        return tried
    if sure is not None:
        return _change(tick, current, sure, prices, note=hold.note)
    probe = inputs.probe
    if probe is not None and not current[0] and (hold.after_s is None or tick.now_s >= hold.after_s):
        # The probe's own test priced its restarts (probe.probe_for); it rests on the memory's age, which only
        # grows, so it does not wait for confirmation, only for the spacing after the last change.
        key = (True, max(1, min(probe.gamma, config.gamma_max)))
        return Candidate(key=key, wait_s=0.0, side=1, probing=True, text=hold.note + f"; probing: {probe.why}",
                          why=(cause(WhyCode.PROBE, gamma=key[1]),))
    stays = worth_text(choice, config, prices.cost_s, from_on=current[0]) if choice is not None else ""
    text = hold.note + (f"; stays: {stays}" if stays else "; stays")
    whys = why_stays(choice, config, cost_s=prices.cost_s)
    if probe is not None and hold.after_s is not None and tick.now_s < hold.after_s:
        text += f"; no probe for another {hold.after_s - tick.now_s:.0f}s (back-off after an unapplied probe)"
        whys += (cause(WhyCode.PROBE_BACKOFF, left_s=hold.after_s - tick.now_s),)
    return Candidate(key=current, wait_s=config.dwell_s, text=text, why=whys)


def _change(tick: Tick, current: Key, choice: Valued, prices: Prices, *, note: str) -> Candidate:
    """The valued change as the candidate, with its wait: C today over the expected gain now (waiting forgoes the
    gain expected at this window's rate: the rent is paid now, whatever the plan forecasts). r is the gain at the
    points' own speedups, not at the band's end (`value.expected_gain`): the band decides whether a change is
    worth making at all, while what waiting forgoes each second is the gain expected. A turn-on goes to the gamma
    with the greatest trial value (`trial_for`), its rent that gamma's expected gain (at its point speedup,
    extrapolated or not: the way back bounds what it risks)."""
    config = tick.config
    trial = trial_for(tick, prices, choice.key) if not current[0] and choice.key[0] else None
    key = trial[0] if trial is not None else choice.key
    now_gain = expected_gain(tick.curve, current, key, trial=trial is not None)
    rent = choice.gain if now_gain is None else now_gain
    wait = wait_s(cost_s=prices.today_s, gain=rent, confirm_s=config.confirm_s, dwell_s=config.dwell_s)
    worth = worth_text(choice, config, prices.cost_s, from_on=current[0])
    text = note + f"; {worth}"
    if choice.surer is not None:
        text += (f" (as sure as {describe(choice.surer.key)} at {choice.surer.gain:+.1%}, within the margin, and "
                 f"expected to gain more: {choice.expected:+.1%})")
    moved = trial is not None and key != choice.key
    # The gain named is the published option's: the band's low end where it chose, the trial's expectation where
    # the trial moved it.
    gain = rent if moved else choice.gain
    whys = [cause(WhyCode.GAIN, to_gamma=key[1], gain=gain, cost_s=prices.cost_s, wait_s=wait)]
    if trial is not None and moved:
        point = point_at(prices.curve, key[1])
        text += (f"; {describe(key)}{f' {fmt_point(point)}' if point is not None else ''} is worth more to try: "
                 f"{trial[1]:.0f}s over {config.payback_horizon_s:.0f}s against {trial[2]:.0f}s (it runs at least "
                 f"{least_trial_s(config):.0f}s, which measures its acceptance, and a worse setting can be left at one "
                 f"more change's cost)")
        whys.append(cause(WhyCode.TRIAL, gamma=key[1], value_s=trial[1], against_s=trial[2], expected=rent))
    text += f", wait {wait:.0f}s (cost today {prices.today_s:.1f}s / gain "
    text += f"expected now {rent:+.1%}, in {config.confirm_s:.0f}..{config.dwell_s:.0f}s)"
    side = side_of(choice.key, current)  # the option valued: a turn-off kept measuring is still a turn-off
    key, kept = _keep_measuring(key, prices.curve, prices.options)
    if math.isinf(choice.gain):
        whys.append(cause(WhyCode.OFF_CURVE, to_gamma=choice.key[1]))
    if kept:
        point = point_at(prices.curve, key[1])
        whys.append(cause(WhyCode.KEPT_MEASURING, gamma=key[1], speedup=point.speedup if point else math.nan))
    return Candidate(key=key, wait_s=wait, side=side, text=text + kept, why=tuple(whys))


def _keep_measuring(key: Key, curve: Sequence[CurvePoint], options: Sequence[Key]) -> tuple[Key, str]:
    """A turn-off that pays goes to gamma* instead when gamma* is expected to do as well as plain decoding
    (S(gamma*) >= 1, gamma* among the measured gammas: an extrapolated one is a guess): the same expected service,
    and the acceptance stays measured (nothing is while off)."""
    star = best_on(curve, [o for o in options if (p := point_at(curve, o[1])) is not None and not p.extrapolated])
    if key[0] or star is None or star.speedup < 1.0:
        return key, ""
    return (True, star.gamma), f"; {fmt_point(star)} is expected to do as well as off: gamma {star.gamma} instead"


def _options(current: Key, evidence: Evidence, config: DecideConfig) -> list[Key]:
    """Off and gamma 1..gamma_max; while on, no further than `reachable_gamma_limit`: past the measured k the
    acceptance is a guess, so each step up runs, gets its position measured, and the next is decided on data (a
    trial may go further: its value prices the guess and the way back)."""
    limit = config.gamma_max
    if current[0]:
        limit = reachable_gamma_limit(
            current_gamma=current[1], measured_k=measured_k_of(evidence), gamma_max=config.gamma_max
        )
    return [(False, 0), *((True, g) for g in range(1, limit + 1))]


def _choose(
    curve: Sequence[CurvePoint], current: Key, options: Sequence[Key], config: DecideConfig, *, cost_s: float
) -> Valued | None:
    """The option with the greatest V (ties: the smaller gamma, off first), or, when that is a change worth making
    while on, the likeliest of the options on its side as sure as it (`_likeliest`; a turn-on's destination is
    the trial's, `trial_for`); None when none can be priced."""
    if current[0] and point_at(curve, current[1]) is None:
        # The running gamma is off the curve (deployed k > gamma_max): nothing to weigh against, so the best
        # option against plain decoding is the move, off when none clears the margin.
        plain = [v for v in value_options(curve, (False, 0), options=options, horizon_s=1.0, cost_s=0.0)
                 if v.gain >= config.margin]
        top = max(plain, key=lambda v: v.gain, default=None)
        key = top.key if top is not None else (False, 0)
        return Valued(key=key, gain=math.inf, value_s=math.inf, point=point_at(curve, key[1]) if key[0] else None)
    best: Valued | None = None
    every = value_options(curve, current, options=options, horizon_s=config.payback_horizon_s, cost_s=cost_s)
    for valued in every:
        if best is None or valued.value_s > best.value_s:
            best = valued
    if best is None or not current[0] or best.value_s <= 0 or best.gain < config.margin:
        return best  # a turn-on's destination is the trial's (`trial_for`)
    side = side_of(best.key, current)
    as_sure = [v for v in every if side_of(v.key, current) == side]
    found = _likeliest(curve, current, as_sure, floor=max(config.margin, best.gain - config.margin))
    if found is None or found[0].key == best.key:
        return best
    return replace(found[0], surer=best, expected=found[1])


def _likeliest(
    curve: Sequence[CurvePoint], current: Key, every: Sequence[Valued], *, floor: float
) -> tuple[Valued, float] | None:
    """Among `every` (options on one side of what runs), those as sure as the best (g >= `floor`: within the margin
    of the best g, and V > 0), the one with the greatest expected gain (`value.expected_gain`; ties: the first in
    `every`, off first, then the smaller gamma), with that gain; None when none can be priced. A difference of
    pessimistic gains below the margin is one the rule does not act on, so it does not decide between them either.
    Example: on at 3, S(3) = 0.60 [0.40..0.90], S(1) = 0.84 with gain_sd 0.11: off g = (1 - 0.90) / 0.60 = 16.7%,
    gamma 1 g = (0.84 x exp(-1.645 x 0.11) - 0.60) / 0.60 = 16.8%: as sure (margin 2%); expected, off (1 - 0.60) /
    0.60 = 66.7%, gamma 1 (0.84 - 0.60) / 0.60 = 40%: off."""
    ranked: list[tuple[Valued, float]] = []
    for valued in every:
        gain = expected_gain(curve, current, valued.key) if valued.value_s > 0 and valued.gain >= floor else None
        if gain is not None:
            ranked.append((valued, gain))
    return max(ranked, key=lambda pair: pair[1], default=None)
