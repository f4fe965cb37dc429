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
turn-off kept at a measured gamma that does as well as off (`_keep_measuring`); where a turn-on or a move up goes
and how trials are spaced (`_trial`, `_try_more`, `_left_trial`); a plan over the recent load (`HorizonCurve`,
policies/decide/horizon.py); a deployed k off the curve (`_choose`); a probe while off on a remembered profile
(`_probe_hold`, policies/decide/probe.py); evidence that is not ok never flips anything (`_hold`). The first
decision publishes the current deployment as the baseline (not a change).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.decide.change_cost import change_cost_of, inflight_work_s
from policies.decide.summary import summarize
from policies.decide.value import (
    Key,
    Valued,
    best_on,
    expected_gain,
    point_at,
    trial_moments,
    trial_value,
    trial_value_of,
    value_options,
)
from policies.model.costmodel import step_batch
from policies.types import CurvePoint, DataState, Decision, Evidence, Why, WhyCode


@dataclass(frozen=True, slots=True)
class DecideConfig:
    """The narrow policy config. Gains are dimensionless shares of the service; times are seconds."""

    margin: float = 0.02  # the least pessimistic gain g a change must promise (module docstring)
    dwell_s: float = 120.0  # the longest wait, and the least time between two published changes
    confirm_s: float = 30.0  # the shortest wait: one bad scrape or window cannot change a deployment
    gamma_max: int = 8
    # Seconds of service one change interrupts (~ the engine's restart time; 0 = the engine adapts per batch).
    change_cost_s: float = 0.0
    # Seconds over which a change must pay its cost back (how long a recommendation is expected to hold).
    payback_horizon_s: float = 600.0
    # Probe while off on a remembered profile (probe.probe_for); a probe runs at least `probe_min_s` (one
    # estimator window, 60 s by default, to measure the positions again) before it can be undone.
    explore: bool = True
    probe_min_s: float = 60.0
    # A published probe is held until a live window is measured, at most this long (s): long enough for an
    # actuator's own dwell and cooldown (300 s + 900 s by default in actuation) and a restart to apply it.
    probe_timeout_s: float = 1800.0
    # After a probe that was never applied, no new probe for this long (s): whoever did not apply the last one
    # is unlikely to apply the next a dwell later, and each unapplied probe is two published changes.
    probe_backoff_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class DecideState:
    """What `decide` carries between ticks: the published decision and the candidate waiting to be published."""

    published: Decision | None = None  # what is currently published (enabled, gamma)
    pending_enabled: bool | None = None  # the change waiting to be published
    pending_gamma: int | None = None  # the last candidate's gamma
    pending_since_s: float | None = None  # since when some change has been worth making (the wait's clock)
    candidate_since_s: float | None = None  # since when the candidate has kept its side (more or less speculation)
    candidate_side: int | None = None  # that side: +1 more speculation than runs, -1 less (fewer drafts or off)
    not_worth_since_s: float | None = None  # since when the waiting candidate has not been worth a change (its
    # wait is held meanwhile, and lost after confirm_s of it)
    probe_since_s: float | None = None  # when a probe was published; held until a live window is measured
    probe_after_s: float | None = None  # no probe before this time (back-off after a probe nobody applied)
    last_change_s: float | None = None  # when a change (not the first baseline) was last published
    tried_s: float | None = None  # when a move to more drafts was last published as a trial (`_try_more`)
    tried_gamma: int | None = None  # the gamma that trial went to, until the next published change
    trial_left_s: float | None = None  # when a move down from it was published within H: the trial was left


def best_point(curve: Sequence[CurvePoint], gamma_max: int) -> CurvePoint | None:
    """The point with the highest point speedup among gamma in 1..gamma_max; ties go to the smaller gamma.

    `curve` may be in any order and may be empty; returns None when no point has 1 <= gamma <= gamma_max.
    Example: S(1)=1.20, S(2)=1.35, S(3)=1.35, S(4)=1.30 -> the gamma=2 point.
    """
    return best_on(curve, [(True, gamma) for gamma in range(1, gamma_max + 1)])


@dataclass(frozen=True, slots=True)
class Probe:
    """A request to switch speculation on at `gamma` (>= 1) to re-measure acceptance, with `why` for the reason
    (made by `probe.probe_for` while off on a remembered profile)."""

    gamma: int
    why: str


def reachable_gamma_limit(*, current_gamma: int, measured_k: int, gamma_max: int) -> int:
    """The largest gamma one move may reach while on: max(measured_k + 1, current_gamma) clipped to
    1..gamma_max, so a published gamma above what runs is never pulled down by the cap.

    Example: measured k=3, current 3, gamma_max 8 -> 4; measured k=3, current 5 -> 5; measured 10, max 8 -> 8.
    """
    return max(1, min(gamma_max, max(measured_k + 1, current_gamma)))


def wait_s(*, cost_s: float, gain: float, confirm_s: float, dwell_s: float) -> float:
    """How long a change must stay worth making before it is published: C / r (s) clipped to [confirm_s,
    dwell_s], r the expected gain now (`gain`); r <= 0 (nothing forgone by waiting) waits the dwell. The service
    forgone by waiting has then paid for the switch (the break-even rule; unclipped, it loses at most twice what
    hindsight would on a condition of any length). With no restart (C = 0) every change but a probe waits
    confirm_s: undoing it costs nothing. Example: C 22.6 s, r 0.057 -> 396 -> 120 (dwell); r 0.86 -> 26.3 -> 30
    (confirm); C 0 -> 30 (confirm)."""
    raw = cost_s / gain if gain > 0 else math.inf
    return min(dwell_s, max(confirm_s, raw))


@dataclass(frozen=True, slots=True)
class HorizonCurve:
    """The plan's curve (policies/decide/horizon.py; same gammas as the tick's curve) that options are valued on, and
    the factor (> 0) that converts a change's cost C from seconds of this window's service into the plan's units.
    With a plan, g is a ratio of planned values (the recent load's mix: the forecast over the horizon; the plan
    carries no SLO share) and C is scaled by `cost_scale`; the wait's C / r stays this window's (waiting forgoes
    the gain at today's rate), and so do the published speedups."""

    curve: Sequence[CurvePoint]
    cost_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class DecideInputs:
    """What a tick knows beyond the evidence and the curve.

    `probe`: a request to switch on to re-measure (probe.probe_for), or None. `measured`: this tick's acceptance
    was measured live while speculating (None: ok, speculating and acceptance present); it releases a held probe.
    `inflight_s` (s): the in-flight and weighed queued work a restart loses (None: `inflight_work_s(evidence)`).
    `plan`: the curve options are valued on, or None to value them on this window's curve.
    `acceptance_stands_in`: the curve was priced from a remembered profile standing in for this thin window
    (insufficient_data while speculating; policies/estimate/memory.py `acceptance_in_use`), so the tick is decided
    on as on ok evidence."""

    probe: Probe | None = None
    measured: bool | None = None
    inflight_s: float | None = None
    plan: HorizonCurve | None = None
    acceptance_stands_in: bool = False


NO_INPUTS = DecideInputs()


@dataclass(frozen=True, slots=True)
class _Tick:
    """One tick's fixed inputs, passed together to the stages of `decide`."""

    evidence: Evidence
    curve: Sequence[CurvePoint]
    config: DecideConfig
    now_s: float


@dataclass(frozen=True, slots=True)
class _Prices:
    """What options are valued on this tick: C today (s of this window's service), C in the valued curve's units,
    that curve, the options, and whether it is a plan."""

    today_s: float
    cost_s: float
    curve: Sequence[CurvePoint]
    options: Sequence[Key]
    planned: bool


@dataclass(frozen=True, slots=True)
class _Candidate:
    """The option this tick would publish, its wait (s), its side (`_side`), whether it is a probe, and the reason
    text that explains it."""

    key: Key
    wait_s: float
    side: int = 0
    probing: bool = False
    text: str = ""
    why: tuple[Why, ...] = ()
    trying: bool = False  # a move to more drafts while on, valued as a trial (`_try_more`)


@dataclass(frozen=True, slots=True)
class _ProbeHold:
    """A published probe's hold this tick: held (the engine has not run it yet), probe_since_s, probe_after_s, and
    a note for the reason."""

    held: bool = False
    since_s: float | None = None
    after_s: float | None = None
    note: str = ""


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
        return _hold(evidence, curve, state, now_s, kind=evidence.state, why=_why_not_ok(evidence))
    star = best_point(curve, config.gamma_max)
    if star is None:
        why = f"no predicted speedup for any gamma in 1..{config.gamma_max} (curve has {len(curve)} points)"
        return _hold(evidence, curve, state, now_s, kind=DataState.ERROR, why=why)
    tick = _Tick(evidence=evidence, curve=curve, config=config, now_s=now_s)
    prefix, published = "", state.published
    batch = max(step_batch(evidence), 1.0)
    whys = [_why(WhyCode.BEST, gamma=star.gamma, speedup=star.speedup, low=star.speedup_low,
                 high=star.speedup_high, batch=batch)]
    if published is None:
        base = _deployment(evidence)
        published = _decision(evidence, curve, base, reason="", now_s=now_s, changed_at_s=now_s)
        prefix = f"first decision, baseline is the current deployment ({_describe(base)}); "
        whys.insert(0, _why(WhyCode.BASELINE))
    current = _key(published)
    head = f"{_describe(current)}: best {_fmt_point(star)} at batch {batch:.1f}"
    head += "; planned over the recent load" if _plan_curve(inputs) else ""
    measured = inputs.measured
    if measured is None:
        measured = evidence.speculation_on and evidence.acceptance is not None
    hold = _probe_hold(state, current, measured=measured, config=config, now_s=now_s)
    may_try = (state.tried_s is None or now_s - state.tried_s >= config.payback_horizon_s) and (
        state.trial_left_s is None or now_s - state.trial_left_s >= config.probe_backoff_s)
    candidate = _candidate(tick, current, inputs, hold, may_try=may_try)
    candidate = replace(candidate, why=(*whys, *candidate.why))
    return _publish(tick, state, published, candidate, reason=prefix + head + candidate.text, hold=hold)


def _plan_curve(inputs: DecideInputs) -> Sequence[CurvePoint]:
    return inputs.plan.curve if inputs.plan is not None else ()


def _prices(tick: _Tick, current: Key, inputs: DecideInputs) -> _Prices:
    lost_s = inflight_work_s(tick.evidence) if inputs.inflight_s is None else inputs.inflight_s
    today_s = change_cost_of(change_cost_s=tick.config.change_cost_s, inflight_s=lost_s)  # C in this window's units
    plan = _plan_curve(inputs)
    scale = _valid_scale(inputs.plan.cost_scale) if inputs.plan is not None and plan else 1.0
    return _Prices(
        today_s=today_s, cost_s=today_s * scale, curve=plan if plan else tick.curve,
        options=_options(current, tick.evidence, tick.config), planned=bool(plan),
    )


def _candidate(tick: _Tick, current: Key, inputs: DecideInputs, hold: _ProbeHold, *, may_try: bool) -> _Candidate:
    """The option to wait for this tick: what runs while a probe is held; else, while on and `may_try` (no trial
    within H, none left within probe_backoff_s), a move to more drafts valued as a trial (`_try_more`: the
    destination of a sure move up, or with no sure change and `explore`, a gamma past the measured k); else the
    valued change; else a probe; else what runs."""
    config, prices = tick.config, _prices(tick, current, inputs)
    choice = _choose(prices.curve, current, prices.options, config, cost_s=prices.cost_s)
    if hold.held:
        # A published probe the engine has not run yet: the curve is still the remembered one.
        held_s = max(0.0, tick.now_s - hold.since_s) if hold.since_s is not None else 0.0
        return _Candidate(key=current, wait_s=config.dwell_s, text=hold.note,
                          why=(_why(WhyCode.PROBE_HELD, gamma=current[1], held_s=held_s),))
    sure = choice if choice is not None and choice.value_s > 0 and choice.gain >= config.margin else None
    # A trial saves restarts; with none to save (C = 0) the climb goes one measured gamma at a time.
    # The trial starts from what the engine runs: a published change it has not applied yet is not measured.
    up = current[0] and may_try and prices.cost_s > 0 and current == _deployment(tick.evidence) and (
        _side(sure.key, current) > 0 if sure is not None else config.explore)
    tried = _try_more(tick, prices, current, sure=sure, note=hold.note) if up else None
    if tried is not None:
        return tried
    if sure is not None:
        return _change(tick, current, sure, prices, note=hold.note)
    probe = inputs.probe
    if probe is not None and not current[0] and (hold.after_s is None or tick.now_s >= hold.after_s):
        # The probe's own test priced its restarts (probe.probe_for); it rests on the memory's age, which only
        # grows, so it does not wait for confirmation, only for the spacing after the last change.
        key = (True, max(1, min(probe.gamma, config.gamma_max)))
        return _Candidate(key=key, wait_s=0.0, side=1, probing=True, text=hold.note + f"; probing: {probe.why}",
                          why=(_why(WhyCode.PROBE, gamma=key[1]),))
    stays = _worth(choice, config, prices.cost_s, from_on=current[0]) if choice is not None else ""
    text = hold.note + (f"; stays: {stays}" if stays else "; stays")
    whys = _why_stays(choice, config, cost_s=prices.cost_s)
    if probe is not None and hold.after_s is not None and tick.now_s < hold.after_s:
        text += f"; no probe for another {hold.after_s - tick.now_s:.0f}s (back-off after an unapplied probe)"
        whys += (_why(WhyCode.PROBE_BACKOFF, left_s=hold.after_s - tick.now_s),)
    return _Candidate(key=current, wait_s=config.dwell_s, text=text, why=whys)


def _why_stays(choice: Valued | None, config: DecideConfig, *, cost_s: float) -> tuple[Why, ...]:
    """Why the best alternative is not a change: it gains less than the margin, or not what it costs."""
    if choice is None or math.isinf(choice.gain):
        return ()
    to_gamma = choice.key[1]  # an off key is (False, 0)
    if choice.gain < config.margin or cost_s <= 0:
        return (_why(WhyCode.BELOW_MARGIN, to_gamma=to_gamma, gain=choice.gain, margin=config.margin),)
    return (_why(WhyCode.COST, to_gamma=to_gamma, gain=choice.gain, cost_s=cost_s),)


def _change(tick: _Tick, current: Key, choice: Valued, prices: _Prices, *, note: str) -> _Candidate:
    """The valued change as the candidate, with its wait: C today over the expected gain now (waiting forgoes the
    gain expected at this window's rate: the rent is paid now, whatever the plan forecasts). r is the gain at the
    points' own speedups, not at the band's end (`value.expected_gain`): the band decides whether a change is
    worth making at all, while what waiting forgoes each second is the gain expected. A turn-on goes to the gamma
    with the greatest trial value (`_trial`), its rent that gamma's expected gain (at its point speedup,
    extrapolated or not: the way back bounds what it risks)."""
    config = tick.config
    trial = _trial(tick, prices, choice.key) if not current[0] and choice.key[0] else None
    key = trial[0] if trial is not None else choice.key
    now_gain = expected_gain(tick.curve, current, key, trial=trial is not None)
    rent = choice.gain if now_gain is None else now_gain
    wait = wait_s(cost_s=prices.today_s, gain=rent, confirm_s=config.confirm_s, dwell_s=config.dwell_s)
    worth = _worth(choice, config, prices.cost_s, from_on=current[0])
    text = note + f"; {worth}"
    if choice.surer is not None:
        text += (f" (as sure as {_describe(choice.surer.key)} at {choice.surer.gain:+.1%}, within the margin, and "
                 f"expected to gain more: {choice.expected:+.1%})")
    moved = trial is not None and key != choice.key
    # The gain named is the published option's: the band's low end where it chose, the trial's expectation where
    # the trial moved it.
    gain = rent if moved else choice.gain
    whys = [_why(WhyCode.GAIN, to_gamma=key[1], gain=gain, cost_s=prices.cost_s, wait_s=wait)]
    if trial is not None and moved:
        point = point_at(prices.curve, key[1])
        text += (f"; {_describe(key)}{f' {_fmt_point(point)}' if point is not None else ''} is worth more to try: "
                 f"{trial[1]:.0f}s over {config.payback_horizon_s:.0f}s against {trial[2]:.0f}s (it runs at least "
                 f"{_trial_s(config):.0f}s, which measures its acceptance, and a worse setting can be left at one "
                 f"more change's cost)")
        whys.append(_why(WhyCode.TRIAL, gamma=key[1], value_s=trial[1], against_s=trial[2], expected=rent))
    text += f", wait {wait:.0f}s (cost today {prices.today_s:.1f}s / gain "
    text += f"expected now {rent:+.1%}, in {config.confirm_s:.0f}..{config.dwell_s:.0f}s)"
    side = _side(choice.key, current)  # the option valued: a turn-off kept measuring is still a turn-off
    key, kept = _keep_measuring(key, prices.curve, prices.options)
    if math.isinf(choice.gain):
        whys.append(_why(WhyCode.OFF_CURVE, to_gamma=choice.key[1]))
    if kept:
        point = point_at(prices.curve, key[1])
        whys.append(_why(WhyCode.KEPT_MEASURING, gamma=key[1], speedup=point.speedup if point else math.nan))
    return _Candidate(key=key, wait_s=wait, side=side, text=text + kept, why=tuple(whys))


def _try_more(
    tick: _Tick, prices: _Prices, current: Key, *, sure: Valued | None, note: str
) -> _Candidate | None:
    """While on, a move to more drafts valued as a trial (value.trial_value from the running gamma: running it
    measures the positions past the measured k, and a worse gamma is left at one more change's cost). With a sure
    change to more drafts (`sure`), it goes to the gamma above the running one with the greatest trial value, as a
    turn-on does (None when that is `sure`'s own gamma: the sure change stands). With none, the gamma past the
    measured k (extrapolated: its positions never ran) with the greatest trial value, when that value is > 0 and
    its expected gain is at least the margin. Ties: the smaller gamma. Its wait is C today over this window's
    expected gain. The way back assumes the running gamma stays priced as measured; for a drafter whose shorter
    drafts are not prefixes of longer ones (suffix decoding) it is priced again from its band after the trial."""
    config = tick.config
    valued: dict[Key, tuple[float, float]] = {}
    for gamma in range(current[1] + 1, config.gamma_max + 1):
        key = (True, gamma)
        moments = trial_moments(prices.curve, current, key)
        value = None if moments is None else trial_value_of(
            moments, horizon_s=config.payback_horizon_s, cost_s=prices.cost_s, trial_s=_trial_s(config))
        if moments is not None and value is not None:
            valued[key] = (value, moments[0])
    against = valued[sure.key][0] if sure is not None and sure.key in valued else math.nan
    tries = {key: vm for key, vm in valued.items() if vm[1] >= config.margin and (
        sure is not None or (vm[0] > 0 and _extrapolated(prices.curve, key)))}
    if not tries:
        return None
    key = max(tries, key=lambda k: tries[k][0])  # in gamma order: max keeps the first of equals
    if sure is not None and key == sure.key:
        return None
    value, planned = tries[key]
    now_gain = expected_gain(tick.curve, current, key, trial=True)
    rent = planned if now_gain is None else now_gain
    wait = wait_s(cost_s=prices.today_s, gain=rent, confirm_s=config.confirm_s, dwell_s=config.dwell_s)
    point = point_at(prices.curve, key[1])
    text = (f"{note}; {_describe(key)}{f' {_fmt_point(point)}' if point is not None else ''} is worth trying: "
            f"expected {planned:+.1%}, worth {value:.0f}s over {config.payback_horizon_s:.0f}s net of the change's "
            f"{prices.cost_s:.1f}s (it runs at least {_trial_s(config):.0f}s, which measures its positions, and a "
            f"worse setting can be left at one more change's cost)")
    if sure is not None:
        text += f"; more than {_describe(sure.key)}, the sure change" + (f" ({against:.0f}s)" if math.isfinite(
            against) else "")
    text += (f", wait {wait:.0f}s (cost today {prices.today_s:.1f}s / gain expected now {rent:+.1%}, in "
             f"{config.confirm_s:.0f}..{config.dwell_s:.0f}s)")
    whys = (_why(WhyCode.GAIN, to_gamma=key[1], gain=rent, cost_s=prices.cost_s, wait_s=wait),
            _why(WhyCode.TRIAL, gamma=key[1], value_s=value, against_s=against if math.isfinite(against) else 0.0,
                 expected=rent))
    return _Candidate(key=key, wait_s=wait, side=1, text=text, why=whys, trying=True)


def _trial_s(config: DecideConfig) -> float:
    # A published change runs at least a dwell (and a window, to be measured) before it can be undone.
    return max(config.dwell_s, config.probe_min_s)


def _trial(tick: _Tick, prices: _Prices, choice: Key) -> tuple[Key, float, float] | None:
    """Where a turn-on that pays goes: the on option with the greatest trial value (value.trial_value: running it
    measures its acceptance, and a worse setting can be left at one change's cost), among the gammas whose
    acceptance is measured and the next one the curve offers past them (every gamma when none is). Returns (that
    key, its V_try, and the V_try of `choice`, the option the band's low end chose), or None when either cannot
    be priced. Ties: the smaller gamma."""
    config = tick.config
    on = sorted(key for key in prices.options if key[0] and point_at(prices.curve, key[1]) is not None)
    measured = [key[1] for key in on if not _extrapolated(prices.curve, key)]
    past = [key[1] for key in on if measured and key[1] > max(measured)]
    reach = (past[0] if past else max(measured)) if measured else config.gamma_max
    def value(key: Key) -> float | None:
        return trial_value(prices.curve, key, horizon_s=config.payback_horizon_s, cost_s=prices.cost_s,
                           trial_s=_trial_s(config))

    values = {key: v for key in on if key[1] <= reach and (v := value(key)) is not None}
    against = values[choice] if choice in values else value(choice)
    if not values or against is None:
        return None
    best = max(values, key=lambda key: values[key])  # `on` is sorted; max keeps the first of equals
    return best, values[best], against


def _extrapolated(curve: Sequence[CurvePoint], key: Key) -> bool:
    point = point_at(curve, key[1])
    return point is None or point.extrapolated


def _side(option: Key, current: Key) -> int:
    """Which way a change goes: +1 to more speculation (more drafts than run, on from off included), -1 to less
    (fewer drafts, or off): a candidate that moves between off and fewer drafts keeps its direction."""
    if not option[0]:
        return -1
    return 1 if not current[0] or option[1] > current[1] else -1


def _keep_measuring(key: Key, curve: Sequence[CurvePoint], options: Sequence[Key]) -> tuple[Key, str]:
    """A turn-off that pays goes to gamma* instead when gamma* is expected to do as well as plain decoding
    (S(gamma*) >= 1, gamma* among the measured gammas: an extrapolated one is a guess): the same expected service,
    and the acceptance stays measured (nothing is while off)."""
    star = best_on(curve, [o for o in options if (p := point_at(curve, o[1])) is not None and not p.extrapolated])
    if key[0] or star is None or star.speedup < 1.0:
        return key, ""
    return (True, star.gamma), f"; {_fmt_point(star)} is expected to do as well as off: gamma {star.gamma} instead"


def _options(current: Key, evidence: Evidence, config: DecideConfig) -> list[Key]:
    """Off and gamma 1..gamma_max; while on, no further than `reachable_gamma_limit`: past the measured k the
    acceptance is a guess, so each step up runs, gets its position measured, and the next is decided on data (a
    trial may go further: its value prices the guess and the way back)."""
    limit = config.gamma_max
    if current[0]:
        limit = reachable_gamma_limit(
            current_gamma=current[1], measured_k=_measured_k(evidence), gamma_max=config.gamma_max
        )
    return [(False, 0), *((True, g) for g in range(1, limit + 1))]


def _choose(
    curve: Sequence[CurvePoint], current: Key, options: Sequence[Key], config: DecideConfig, *, cost_s: float
) -> Valued | None:
    """The option with the greatest V (ties: the smaller gamma, off first), or, when that is a change worth making
    while on, the likeliest of the options on its side as sure as it (`_likeliest`; a turn-on's destination is
    the trial's, `_trial`); None when none can be priced."""
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
        return best  # a turn-on's destination is the trial's (`_trial`)
    side = _side(best.key, current)
    as_sure = [v for v in every if _side(v.key, current) == side]
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


def _worth(choice: Valued, config: DecideConfig, cost_s: float, *, from_on: bool) -> str:
    """The numbers behind a candidate (or the best option that is not one), for the reason."""
    seen = f" {_fmt_point(choice.point)}" if choice.point is not None else ""
    if math.isinf(choice.gain):
        return f"{_describe(choice.key)}{seen}, the running gamma is not on the curve"
    # Off is priced against the running option at its best (its band's high end); a gamma at its own low end, or
    # on its expected value when it is a free move between gammas (policies/decide/value.py).
    if not choice.key[0]:
        basis = "against the running option's band high end"
    elif not from_on or cost_s > 0 or choice.point is None or choice.point.extrapolated:
        basis = "at its band's low end"
    else:
        basis = "expected (a free move)"
    text = f"{_describe(choice.key)}{seen} gains {choice.gain:+.1%} {basis}"
    if choice.gain < config.margin:
        return text + f" < margin {config.margin:.0%}"
    if cost_s <= 0:
        return text
    won = config.payback_horizon_s * choice.gain
    text += f" x {config.payback_horizon_s:.0f}s = {won:.1f}s vs change cost {cost_s:.1f}s"
    return text if choice.value_s > 0 else text + ": held back by its cost"


def _publish(
    tick: _Tick, state: DecideState, published: Decision, candidate: _Candidate, *, reason: str, hold: _ProbeHold
) -> tuple[Decision, DecideState]:
    """Run the wait clock (module docstring) and build the Decision and the next state. `hold.since_s`: when a
    held probe was published (None: none held). What is published is the candidate of the tick the wait ends on:
    near the optimum, neighbouring gammas alternate within noise, and the side, not the gamma, must hold."""
    now_s, key = tick.now_s, candidate.key
    current, pending = _key(published), _pending(state)
    changed, since, steady, tail, whys = False, None, None, "", candidate.why
    confirm_s = tick.config.confirm_s
    not_worth_since = state.not_worth_since_s if state.not_worth_since_s is not None else now_s
    not_worth: float | None = None  # since when the waiting candidate has not been worth a change
    if key == current and pending is not None and now_s - not_worth_since < confirm_s:
        # One outlying window can no more withdraw a waiting change than publish one: the wait is held, not lost.
        not_worth, key = not_worth_since, pending
        since, steady = state.pending_since_s, state.candidate_since_s
        tail = (f"; candidate {_describe(pending)} not worth a change this window, withdrawn after "
                f"{confirm_s:.0f}s of it ({now_s - not_worth:.0f}s so far)")
    elif key == current:
        tail = f"; candidate {_describe(pending)} withdrawn" if pending is not None else ""
        if pending is not None:
            whys += (_why(WhyCode.WITHDRAWN, to_gamma=pending[1]),)
    else:
        # Back after a spell without being worth a change: the clocks resume where they stood (they count only
        # time the change was worth making), or, after confirm_s or more of it, a new wait begins.
        spell = now_s - state.not_worth_since_s if state.not_worth_since_s is not None else 0.0
        if pending is not None and state.not_worth_since_s is not None and spell >= confirm_s:
            whys += (_why(WhyCode.WITHDRAWN, to_gamma=pending[1]),)  # withdrawn in the gap between two ticks
            pending, spell = None, 0.0
        since = state.pending_since_s + spell if pending is not None and state.pending_since_s is not None else now_s
        same_side = pending is not None and state.candidate_side == candidate.side
        steady = state.candidate_since_s + spell if same_side and state.candidate_since_s is not None else now_s
        changed, tail, clock = _clock(tick, state, published, candidate, since_s=since, steady_s=steady)
        whys += clock
        if changed:
            since, steady = None, None
    publish = key if changed else current
    decision = _decision(tick.evidence, tick.curve, publish, reason=reason + tail, now_s=now_s,
                         changed_at_s=now_s if changed else published.changed_at_s)
    decision = _explained(decision, whys)
    waiting = None if changed or key == current else key
    next_state = DecideState(
        published=decision,
        pending_enabled=None if waiting is None else waiting[0],
        pending_gamma=None if waiting is None else waiting[1],
        pending_since_s=since,
        candidate_since_s=steady,
        candidate_side=None if steady is None else (state.candidate_side if not_worth is not None else candidate.side),
        not_worth_since_s=not_worth,
        # A probe published now is held until it is measured; any other change ends a hold.
        probe_since_s=now_s if candidate.probing and changed else (None if changed else hold.since_s),
        probe_after_s=hold.after_s,
        last_change_s=now_s if changed else state.last_change_s,
        tried_s=now_s if changed and candidate.trying else state.tried_s,
        tried_gamma=(key[1] if candidate.trying else None) if changed else state.tried_gamma,
        trial_left_s=now_s if changed and _left_trial(tick, state, current, key) else state.trial_left_s,
    )
    return decision, next_state


def _left_trial(tick: _Tick, state: DecideState, current: Key, published: Key) -> bool:
    """Whether publishing `published` over `current` leaves the last trial: the first change after it, a move down
    from the gamma it tried, which the engine ran, within H of the trial (a later move down is the load's). A
    trial starts from the k the engine runs, not from a published change it has not applied; no second one comes
    within H of the last, nor within probe_backoff_s of leaving one (the guess was wrong for this traffic)."""
    tried, at = state.tried_gamma, state.tried_s
    if tried is None or at is None or current != (True, tried) or _deployment(tick.evidence) != current:
        return False
    return _side(published, current) < 0 and tick.now_s - at <= tick.config.payback_horizon_s


def _clock(
    tick: _Tick, state: DecideState, published: Decision, candidate: _Candidate, *, since_s: float, steady_s: float
) -> tuple[bool, str, tuple[Why, ...]]:
    """Whether the candidate is published now, the reason's tail and its causes: it has been worth a change for its
    wait, has held its side for min(wait, confirm_s), and the last change is dwell_s old."""
    config, now_s = tick.config, tick.now_s
    current, wait = _key(published), candidate.wait_s
    waited, held_s = max(0.0, now_s - since_s), max(0.0, now_s - steady_s)
    # A probe rests on the memory's age; the first one is spaced from the baseline, so a restarted sidecar
    # does not probe on its first tick.
    last = state.last_change_s if state.last_change_s is not None or not candidate.probing else published.changed_at_s
    spacing = 0.0 if last is None else max(0.0, last + config.dwell_s - now_s)
    move = _transition(current, candidate.key)
    to_gamma = candidate.key[1]
    if waited >= wait and held_s >= min(wait, config.confirm_s) and spacing <= 0:
        changed = _why(WhyCode.CHANGED, from_gamma=current[1], to_gamma=to_gamma, waited_s=waited)
        return True, f"; {move} after {waited:.0f}s", (changed,)
    tail = f"; waiting {waited:.0f}s of {wait:.0f}s before {move}"
    if held_s < min(wait, config.confirm_s) <= waited:
        tail += f" (its side held {held_s:.0f}s of {config.confirm_s:.0f}s)"
    left_s = max(wait - waited, min(wait, config.confirm_s) - held_s, spacing)
    whys = [_why(WhyCode.WAITING, to_gamma=to_gamma, waited_s=waited, wait_s=wait, left_s=left_s)]
    if last is not None and spacing > 0:
        tail += f" ({spacing:.0f}s more: last change {now_s - last:.0f}s ago)"
        whys.append(_why(WhyCode.SPACING, left_s=spacing))
    return False, tail, tuple(whys)


def _valid_scale(cost_scale: float) -> float:
    return cost_scale if math.isfinite(cost_scale) and cost_scale > 0 else 1.0


def _probe_hold(state: DecideState, current: Key, *, measured: bool, config: DecideConfig, now_s: float) -> _ProbeHold:
    """Whether a published probe is held this tick (the engine has not run it yet), with a note for the reason.

    While off on a remembered profile, `probe.probe_for` may ask to switch on to measure again; it is the candidate
    when the rule would stay off, published at once when the last change (or the first baseline) is a dwell old,
    then held until a live window is measured, or `probe_timeout_s` passes (then no probe for `probe_backoff_s`)."""
    since, after = state.probe_since_s, state.probe_after_s
    if since is None or not current[0]:
        return _ProbeHold(after_s=after)
    if measured:
        return _ProbeHold(after_s=after, note=f"; probe at gamma {current[1]} measured, deciding on live data")
    waited = max(0.0, now_s - since)
    if waited >= config.probe_timeout_s:
        note = (
            f"; probe at gamma {current[1]} not applied after {waited:.0f}s, given up "
            f"(no probe for {config.probe_backoff_s:.0f}s)"
        )
        return _ProbeHold(after_s=now_s + config.probe_backoff_s, note=note)
    note = (
        f"; probing at gamma {current[1]}: held until the engine speculates and a window is measured "
        f"({waited:.0f}s of at most {config.probe_timeout_s:.0f}s)"
    )
    return _ProbeHold(held=True, since_s=since, after_s=after, note=note)


# ----------------------------------------------------------------------------------------------------------
# Holding on without good evidence
# ----------------------------------------------------------------------------------------------------------


def _hold(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    state: DecideState,
    now_s: float,
    *,
    kind: DataState,
    why: str,
) -> tuple[Decision, DecideState]:
    """Evidence that is not ok (`kind`, `why`) never flips anything: the last published decision stays, with the
    new state and a reason, and any pending change is dropped (its wait restarts on the next ok tick)."""
    dropped = "" if _pending(state) is None else "; pending change dropped, its wait restarts"
    published = state.published
    if published is None:
        shown = _deployment(evidence)
        reason = (
            f"{kind.value}: nothing published yet, showing the current deployment ({_describe(shown)}); {why}"
        )
        decision = Decision(
            target=evidence.target,
            model=evidence.model,
            state=kind,
            enabled=shown[0],
            num_speculative_tokens=shown[1],
            expected_speedup=1.0,
            expected_speedup_low=1.0,
            expected_speedup_high=1.0,
            reason=reason + dropped,
            evaluated_at_s=now_s,
            curve=tuple(curve),
            changed_at_s=None,
        )
        return _explained(decision, (_why(WhyCode(kind.value)),)), DecideState()
    age_s = now_s - published.evaluated_at_s
    kept = _describe(_key(published))
    reason = f"{kind.value}: keeping {kept} from the last good decision {age_s:.0f}s ago; {why}"
    # The last good decision's speedups and curve stay together: the band shown is the one it was decided on.
    decision = held(replace(published, evaluated_at_s=now_s), kind=kind, reason=reason + dropped, age_s=age_s)
    # A held probe and its back-off outlive a spell of bad data (the engine restarting to apply the probe is one).
    kept_state = DecideState(
        published=published, probe_since_s=state.probe_since_s, probe_after_s=state.probe_after_s,
        last_change_s=state.last_change_s, tried_s=state.tried_s, tried_gamma=state.tried_gamma,
        trial_left_s=state.trial_left_s,
    )
    return decision, kept_state


def held(decision: Decision, *, kind: DataState, reason: str, age_s: float) -> Decision:
    """`decision` kept through data that cannot be trusted: its setting, speedups and curve stay (the band shown is
    the one it was decided on), with `kind` (not ok) as its state, `reason`, and the cause and sentence saying it
    is kept, `age_s` (s) after it last rested on good data."""
    return _explained(replace(decision, state=kind, reason=reason), (_why(WhyCode(kind.value), age_s=age_s),))


def _why_not_ok(evidence: Evidence) -> str:
    told = _one_line(evidence.reason)
    if told:
        return told
    if evidence.state is DataState.INSUFFICIENT_DATA:
        drafts = 0.0 if evidence.acceptance is None else evidence.acceptance.drafts
        return f"{drafts:.0f} drafts seen in the window"
    return f"evidence state {evidence.state.value}"


# ----------------------------------------------------------------------------------------------------------
# Small conversions and formatting
# ----------------------------------------------------------------------------------------------------------


def _measured_k(evidence: Evidence) -> int:
    # Positions 0..k-1 are measured only while the engine speculates at k.
    return evidence.deployed_k if evidence.speculation_on else 0


def _deployment(evidence: Evidence) -> Key:
    # "On with 0 drafts" is not a state the engine can be in for our purposes: normalise to off.
    if evidence.speculation_on and evidence.deployed_k >= 1:
        return True, evidence.deployed_k
    return False, 0


def _key(decision: Decision) -> Key:
    return decision.enabled, decision.num_speculative_tokens if decision.enabled else 0


def _pending(state: DecideState) -> Key | None:
    if state.pending_enabled is None or state.pending_gamma is None or state.pending_since_s is None:
        return None
    return state.pending_enabled, state.pending_gamma if state.pending_enabled else 0


def _decision(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    key: Key,
    *,
    reason: str,
    now_s: float,
    changed_at_s: float | None,
) -> Decision:
    enabled, gamma = key
    point = point_at(curve, gamma) if enabled else None
    # Disabled is plain decoding: 1.0 by definition. Enabled but off the curve: no prediction, claim no gain.
    speedups = (
        (point.speedup, point.speedup_low, point.speedup_high) if point is not None else (1.0, 1.0, 1.0)
    )
    return Decision(
        target=evidence.target,
        model=evidence.model,
        state=DataState.OK,
        enabled=enabled,
        num_speculative_tokens=gamma,
        expected_speedup=speedups[0],
        expected_speedup_low=speedups[1],
        expected_speedup_high=speedups[2],
        reason=reason,
        evaluated_at_s=now_s,
        curve=tuple(curve),
        changed_at_s=changed_at_s,
    )


def _why(code: WhyCode, **numbers: float) -> Why:
    return Why(code=code, numbers=tuple(numbers.items()))


def _explained(decision: Decision, whys: Sequence[Why]) -> Decision:
    """The decision with its causes and the sentence made of them (policies/decide/summary.py)."""
    decision = replace(decision, why=tuple(whys))
    return replace(decision, summary=summarize(decision))


def _fmt_point(point: CurvePoint) -> str:
    extrapolated = " extrapolated" if point.extrapolated else ""
    band = f"[{point.speedup_low:.2f}..{point.speedup_high:.2f}]"
    return f"S({point.gamma})={point.speedup:.2f} {band}{extrapolated}"


def _describe(key: Key) -> str:
    return f"on, gamma {key[1]}" if key[0] else "off"


def _transition(before: Key, after: Key) -> str:
    if before[0] and after[0]:
        return f"switching gamma {before[1]}->{after[1]}"
    if after[0]:
        return f"switching on at gamma {after[1]}"
    return f"switching off (from gamma {before[1]})"


def _one_line(text: str) -> str:
    return " ".join(text.split())
