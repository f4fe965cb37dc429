"""Decide: evidence x predicted speedup curve -> the published recommendation (DESIGN.md section 5).

`decide` is a pure function that takes its state in and hands the next state out (STYLE.md habit 2); time is
the caller's `now_s`. It is built from the helpers in `hysteresis.py`:

1. gamma* = argmax over gamma in 1..gamma_max of the point speedup S(gamma) (ties -> the smaller gamma).
2. Bounds: off -> on only when the low end of S(gamma*) >= 1 + margin; on -> off only when its high end < 1. The
   band holds the acceptance's uncertainty and the cost model's own (policies/uncertainty.py): what the
   calibration has not identified (while one k runs, how fast plain decoding would be) keeps the advisor where
   it is, and the reason names the measurement that would settle it.
3. Minimum change: while on, move gamma only for a predicted gain S(gamma*) - S(current) >= min gain.
   One step past what was measured: while on, when gamma* is extrapolated (it rests on acceptance positions the
   engine never ran), the gamma moved to is the best among 1..max(deployed k + 1, current gamma), and when that
   point is extrapolated too, its LOW end, not its point value, must clear S(current) + min gain. The extrapolation
   beyond k is a stated guess whose band is wide: moving on it one gamma at a time means each step up runs,
   gets its new position measured, and the next step is decided on data. Without it a k=3 deployment whose
   extrapolated S(8)=2.99 edges out the measured S(3) would be told to jump 3 -> 8 on no evidence at all.
   Switching on from off is not capped here: that is governed by the low end clearing 1 + margin (rule 2).
4. Cost of changing (when `change_cost_s` > 0): a change (on, off, or another gamma) must also pay for the
   service it destroys. vLLM cannot change speculation without restarting the engine, and a restart loses two
   things, both counted in seconds of full service (the server's whole output rate for that long):

   - the outage: nothing is served for about the restart time, `change_cost_s` (the operator's rollout time;
     for a rolling update, N replicas x delay x 1/N of the capacity is the same number);
   - the in-flight work: the B running requests are dropped with, on average, half their decode done (a request
     is caught at a uniformly random point of its life), and that work must be redone. Half a request's decode
     time is O/2 tokens x ITL, with ITL = B / G the seconds per token of one sequence (G = generated tokens/s of
     the whole server) and O the mean output length, read from the running context c (prompt + O/2 on average)
     and the prompt/generation token-rate ratio rho = P / O (`inflight_work_s`): O = c / (rho + 1/2). In
     full-service seconds: B sequences x O/2 tokens / G tokens/s = O/2 x B / G.

   The queue: queued requests lose no computed work, but a restart errors them, and in a transient overload they
   are service the server would have delivered once the load fell (the decision benchmark's load-shift dropped
   830 queued requests 90 s before its heavy phase ended). `advise_target` adds their output
   (`queued_work_s`, W x O / G) weighted by the chance the server would have caught up with them, one minus the
   recent share of capacity-bound time (policies/plan.py `queue_weight`): 0 in a persistent overload, where
   the queue a restart drops is replaced within seconds and a faster setting pays most; and no more of it than
   the server could serve within the payback horizon (`plan.queue_cost_s`). The caller passes that in
   `inflight_s`; called alone, decide counts the running requests only. The change is recommended only when

       gain x payback_horizon_s > change_cost_s + in-flight work (s)        gain = S(new) / S(current) - 1

   (off: S = 1), with S(new) for a move on (another gamma, or on from off) taken at the low end of its gain's 90%
   band, S(new) exp(-1.645 gain_sd): gain_sd is the cost model's uncertainty of S(new) / S(running)
   (CurvePoint.gain_sd, policies/uncertainty.py), so a restart is paid for only by a gain the model is sure of,
   not by one resting on a cost it has never measured (while one k runs, the per-draft-token cost is the prior's,
   and S(1) vs S(3) differs mostly by it). gain is the relative improvement of the objective's rate (per-sequence
   speed, server throughput or SLO goodput, whichever `objectives.py` chose: the curve is in its units), so gain x
   horizon is the seconds of service at the current rate the change wins back over the horizon. Under an SLO the gain is
   counted per delivered token, the unit the cost is in: gain = (S(new) / S(current) - 1) x share(current),
   share = the current option's share of tokens meeting the SLO (`CurvePoint.slo_share`), i.e. the tokens the
   change moves across the SLO over the tokens served now. A ratio of SLO goodputs alone is blind to how few
   tokens are at stake: with 1% of tokens meeting the SLO either way, 1% -> 2% is a "100% gain" worth 1% of
   the service, not a whole horizon of it. The same rule prices
   latency-driven changes (no queue, no SLO): a 10% faster token stream for 600 s is 60 s of decoding time
   saved per sequence against a 20 s stall, so a large latency gain is still taken, a 2% one is not. A change
   held back by its cost keeps what runs, and the reason says so.
   Switching off is priced at speculation's best: the gain is (S(new) - S_high(current)) / S(current) x share,
   the HIGH end of the running option's band in the difference, its point (what it delivers now) in the divisor.
   Off, nothing is measured (acceptance, the drafting split), so a turn-off that pays only on the point value,
   inside the model's own uncertainty, would blind the advisor for a gain it cannot confirm. Under an SLO this
   matters at the tail: with 1% of tokens meeting it at gamma 3, the point value gave plain decoding 12%
   (pickup-while-off, a predicted ITL ratio of 0.65 where the world's was 0.80), 11% of the service, and the
   band's high end (S 0.80 against the point's 0.083) (1 - 0.80) / 0.083 x 1% = 2.4%.
   Example: change_cost_s 20 s, horizon 600 s, B 32 running at G 1600 tokens/s (ITL 20 ms), context 640 with
   prompts at twice the generation rate (O = 640 / 2.5 = 256 tokens): in-flight work 128 x 0.02 = 2.56 s, cost
   22.56 s. Moving S 1.40 -> 1.45 gains 3.6% x 600 = 21.4 s: held back; 1.40 -> 1.48 gains 5.7% x 600 = 34 s:
   recommended. change_cost_s = 0 (an engine that adapts per batch, no restart) switches the rule off, the
   in-flight term with it.
   Planned (`plan` given, policies/plan.py): rules 1-4 and the dwell's gamma rule run on the plan's curve (the
   recent load's mix in tokens/s) instead of this window's, and the cost is scaled to the plan's units by
   `cost_scale` (today's delivered tokens/s over the planned value), so a restart made while the load is light costs
   what it drops then; the published speedups stay this window's.
5. Probe: while off on a remembered profile, `advise.probe_for` may ask to switch on to re-measure (the only way
   to see acceptance again); the probe is the candidate. It is published at once when the last published
   change is at least a dwell old (else it waits out the rest of the dwell like any change): the dwell filters
   noise in this tick's measurements, and a probe rests on the memory's age, which only grows, so waiting would
   only delay the look (by a whole dwell on a workload that changed while off). Once a probe
   is published it is HELD (`DecideState.probe_since_s`) until the engine actually speculates and a window is
   measured (`measured`): until then the engine still runs off, the curve is still the remembered one that
   says off, and without the hold the advisor would withdraw its own probe one dwell later and probe again,
   flipping on/off every dwell for as long as nobody applies it. The hold ends when a live window is measured
   (the rules then run on fresh data) or after `probe_timeout_s` (the operator or actuator did not apply it:
   the advisor gives up, the usual rules apply, and no probe is asked again for `probe_backoff_s`). So an
   unapplied probe costs two published changes per timeout + back-off + two dwells, not two per dwell.
6. Dwell: the resulting (enabled, gamma) candidate, if it differs from what is published, becomes the pending
   change, which must persist for `dwell_s` before it is published. One exception besides the probe: a change
   weighed on the plan (rule 4, planned) whose gain is at least `decisive_gain` and moves at least
   MIN_DECISIVE_SERVICE (5%) of the delivered tokens (the gain x the plan's SLO share, `plan.planned_share`: under
   an SLO a running share of 2% makes 2% -> 3% a "+50%" gain worth 1% of the service) persists `planned_confirm_s`
   instead, once the last published change is a dwell old. The plan already averages the load over the payback
   horizon, and a gain past the model's error is not noise; the full dwell on top delayed slo-load-rise's 3 -> 1
   by 115 s under a load where gamma 3 kept ~3% of tokens within the SLO and gamma 1 ~61% (advisor/oracle 0.53 ->
   0.72). Changes stay at least a dwell apart. Example (dwell 120 s, confirm 30 s, last change at t=1000): a
   planned 60% gain first seen at t=1150 is published at t=1180; one first seen at t=1050 waits until t=1120; an
   8% gain seen at t=1150 waits until t=1270.

How the dwell and the gamma choice share one clock. Near the optimum S(gamma) is flat, so the best gamma can
alternate between neighbours whose speedups differ by noise (S(3)=1.42, S(4)=1.43, then 1.43 and 1.42). Were
the dwell to time the exact (enabled, gamma) pair, each alternation would restart it and a clearly warranted
switch would never publish. So the dwell clock times the on/off state, and the gamma it will publish follows
the minimum-change rule against the pending gamma:

- a candidate whose on/off state differs from the pending one (on vs off) restarts the clock: that is a
  different change, not noise;
- a candidate back at the published (enabled, gamma) withdraws the pending change and clears the clock;
- a candidate with the pending on/off state but another gamma restarts the clock (and becomes the pending
  change) only when its S beats the pending gamma's S by at least `min_speedup_gain_to_change_gamma` on this
  tick's curve (or the pending gamma has no point on it). Within that gain the pending change keeps its clock,
  and keeps its gamma unless, while on, the pending gamma no longer clears the minimum change over the running
  gamma (which the candidate does): then the candidate's gamma takes its place, still without a restart, since
  the two are equal within the noise floor.

What is published when the dwell is served is the pending change, so a published gamma has been the choice,
up to the minimum-change gain, for a whole dwell.

First decision (nothing published yet) with evidence state ok: the evidence's current deployment
(speculation_on, deployed_k) is published at once as the baseline, then the rule runs against it. So the
advisor never announces a change on its first tick: a first recommendation that differs from what runs waits
out the dwell like any other.

Evidence that is not ok (stale, error, insufficient_data) never flips anything: the last published decision
stays visible with the new state and a reason, and any pending candidate is dropped, because a spell without
good data must not count toward the dwell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.costmodel import step_batch
from policies.hysteresis import apply_dwell, clears_min_change, hysteresis_on
from policies.types import CurvePoint, Decision, Evidence, TargetState
from policies.uncertainty import Z_90

# (enabled, gamma); gamma is 0 whenever enabled is False.
_Key = tuple[bool, int]


@dataclass(frozen=True, slots=True)
class DecideConfig:
    """The narrow policy config. Speedups are dimensionless ratios vs plain decoding; times are seconds."""

    margin: float = 0.05  # switch on only when the LOW end of S(gamma*) >= 1 + margin
    dwell_s: float = 120.0  # a changed recommendation must persist this long before it is published
    gamma_max: int = 8
    min_speedup_gain_to_change_gamma: float = 0.02  # don't move gamma for a predicted gain smaller than this
    # Seconds of service one change interrupts (~ the engine's restart time; 0 = the engine adapts per batch).
    change_cost_s: float = 0.0
    # Seconds over which a change must pay its cost back (how long a recommendation is expected to hold).
    payback_horizon_s: float = 600.0
    # Probe while off on a remembered profile (advise.probe_for); a probe runs at least `probe_min_s` (one
    # estimator window, 60 s by default, to measure the positions again) before it can be undone.
    explore: bool = True
    probe_min_s: float = 60.0
    # A published probe is held until a live window is measured, at most this long (s): long enough for an
    # actuator's own dwell and cooldown (300 s + 900 s by default in actuation) and a restart to apply it.
    probe_timeout_s: float = 1800.0
    # After a probe that was never applied, no new probe for this long (s): whoever did not apply the last one
    # is unlikely to apply the next a dwell later, and each unapplied probe is two published changes.
    probe_backoff_s: float = 3600.0
    # A change weighed on the plan (a restart's worth, over the recent load) must stay the candidate this long
    # (s) once the last change is a dwell old (rule 6): a few scrapes, so that one bad window cannot restart a
    # server, and no more, since the plan has already averaged the load over its horizon.
    planned_confirm_s: float = 30.0
    # ...when its planned gain is at least this (a share of the service, rule 4's gain): 25% is past the cost
    # model's error on published measurements (tests/unit/test_model_published.py: within 20% for EAGLE), so such
    # a gain is not the model's error. Smaller gains wait out the whole dwell: at 5-8% (bursty, diurnal and
    # acceptance-drift in the decision benchmark) the 30 s confirm published gamma moves that lost 0.5-1%.
    decisive_gain: float = 0.25


@dataclass(frozen=True, slots=True)
class DecideState:
    """What `decide` carries between ticks: the published decision and the candidate waiting out the dwell."""

    published: Decision | None = None  # what is currently published (enabled, gamma)
    pending_enabled: bool | None = None  # the change waiting out the dwell
    pending_gamma: int | None = None  # may move within the minimum-change gain without restarting the clock
    pending_since_s: float | None = None  # when the pending change (its on/off state) was first the candidate
    probe_since_s: float | None = None  # when a probe was published; held until a live window is measured
    probe_after_s: float | None = None  # no probe before this time (back-off after a probe nobody applied)


def best_point(curve: Sequence[CurvePoint], gamma_max: int) -> CurvePoint | None:
    """The point with the highest point speedup among gamma in 1..gamma_max; ties go to the smaller gamma.

    `curve` may be in any order and may be empty; returns None when no point has 1 <= gamma <= gamma_max. Ties
    favour the smaller gamma because, at equal predicted speed, fewer drafts reserve fewer KV slots and waste
    less work when acceptance drops.

    Example: S(1)=1.20, S(2)=1.35, S(3)=1.35, S(4)=1.30 -> the gamma=2 point.
    """
    best: CurvePoint | None = None
    for point in sorted(curve, key=lambda p: p.gamma):
        if 1 <= point.gamma <= gamma_max and (best is None or point.speedup > best.speedup):
            best = point
    return best


def point_at(curve: Sequence[CurvePoint], gamma: int) -> CurvePoint | None:
    """The curve point for `gamma` (an int >= 0), or None when the curve has none.

    Example: point_at(curve, 3) on a curve for gamma 0..8 returns the gamma=3 point; point_at(curve, 9) ->
    None.
    """
    return next((p for p in curve if p.gamma == gamma), None)


@dataclass(frozen=True, slots=True)
class Probe:
    """A request to switch speculation on at `gamma` (>= 1) to re-measure acceptance, with `why` for the reason.

    Made by `advise.probe_for` while off on a remembered profile (nothing is measured while off); `decide` takes
    it as the candidate in place of "stay off", and it then waits out the dwell like any change.
    """

    gamma: int
    why: str


def decide(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    config: DecideConfig,
    state: DecideState,
    now_s: float,
    *,
    probe: Probe | None = None,
    measured: bool | None = None,
    inflight_s: float | None = None,
    plan: Sequence[CurvePoint] | None = None,
    cost_scale: float = 1.0,
    plan_share: float = 1.0,
) -> tuple[Decision, DecideState]:
    """One decision tick: returns the Decision to publish and the state to pass to the next tick.

    `curve` holds one point per gamma 0..gamma_max (speedups are ratios vs plain decoding, gamma 0 = 1.0);
    `now_s` is epoch seconds from the caller's clock. The returned Decision's expected speedup band is that of
    the published (enabled, gamma) on this curve (1.0 when disabled) and its reason names the numbers behind
    it. `measured` says this tick's acceptance was measured live while speculating (None: read from the
    evidence, ok + speculating + acceptance present; `advise_target` passes False when a remembered profile
    stood in for a thin window); it releases a held probe (rule 5). `inflight_s` (s, >= 0) is the in-flight work
    a restart loses (rule 4; None: `inflight_work_s(evidence)`). `plan` (policies/plan.py), when given, is the
    curve the rules choose and weigh changes on (the recent load's mix, same gammas as `curve`); `curve` stays
    what is published (this window's speedups); `cost_scale` (> 0) converts the restart's cost into the plan's
    units (today's delivered tokens/s over the planned value of the running option); `plan_share` (0..1) the
    running option's planned value per planned delivered token (plan.planned_share: 1 without an SLO), by which a
    planned gain is counted per delivered token for the decisive test (rule 6).

    Example (margin 0.05, dwell 120 s, min gamma gain 0.02): published off, S(3)=1.42 [1.31..1.55] is the best
    point. 1.31 >= 1.05, so (on, 3) becomes the pending change at t=1000; ticks at t=1040 keep publishing off
    ("waiting 40s of 120s dwell"); a tick at t=1080 whose best point is S(4)=1.43 (1.43 - 1.42 = 0.01 < 0.02)
    keeps (on, 3) pending since t=1000; the tick at t=1120 publishes on, gamma 3, expected speedup 1.42
    [1.31..1.55], changed_at_s=1120.
    """
    if evidence.state is not TargetState.OK:
        return _hold(evidence, curve, state, now_s, kind=evidence.state, why=_why_not_ok(evidence))
    choose = plan if plan else curve
    star = best_point(choose, config.gamma_max)
    if star is None:
        why = f"no predicted speedup for any gamma in 1..{config.gamma_max} (curve has {len(curve)} points)"
        return _hold(evidence, curve, state, now_s, kind=TargetState.ERROR, why=why)
    if measured is None:
        measured = evidence.speculation_on and evidence.acceptance is not None
    if inflight_s is None:
        inflight_s = inflight_work_s(evidence)

    prefix = ""
    published = state.published
    if published is None:
        base = _deployment(evidence)
        published = _decision(evidence, curve, base, reason="", now_s=now_s, changed_at_s=now_s)
        prefix = f"first decision, baseline is the current deployment ({_describe(base)}); "

    current = _key(published)
    candidate, head = _candidate(current, star, choose, evidence, config)
    if plan:
        head = f"planned over the recent load: {head}"
    held, probe_since, probe_after, probe_note = _probe_hold(state, current, measured=measured, config=config,
                                                             now_s=now_s)
    head += probe_note
    probing = False
    decisive = False
    if held:
        # A published probe the engine has not run yet: the curve is still the remembered one (rule 5).
        candidate = current
    elif probe is not None and candidate == current and not current[0]:
        if probe_after is not None and now_s < probe_after:
            head += f"; no probe for another {probe_after - now_s:.0f}s (back-off after an unapplied probe)"
        else:
            # The probe's own test already priced its restarts (advise.probe_for): it is not weighed again here.
            candidate = (True, max(1, min(probe.gamma, config.gamma_max)))
            head += f"; probing: {probe.why}"
            probing = True
    elif candidate != current:
        gain = _relative_gain(choose, current, candidate, current_at_best=current[0] and not candidate[0])
        pays, cost_note = change_pays(
            gain=gain,
            change_cost_s=config.change_cost_s,
            inflight_s=inflight_s,
            payback_horizon_s=config.payback_horizon_s,
            cost_scale=cost_scale if plan else 1.0,
        )
        if not pays:
            head += f"; {_describe(candidate)} held back by its cost: {cost_note}, keeps {_describe(current)}"
            candidate = current
        elif cost_note:
            head += f"; pays for its cost: {cost_note}"
            # Past the model's error relative to what the running option is worth, and material: under an SLO the
            # planned value is only the share meeting it, so 2% -> 3% reads +50%; per delivered token (x the
            # plan's share) that is 1% of the service, a tail the model prices worst.
            decisive = (
                plan is not None and gain is not None and gain >= config.decisive_gain
                and gain * plan_share >= MIN_DECISIVE_SERVICE
            )
    pending = _pending(state)
    candidate, continues, note = _against_pending(candidate, pending, current, choose, config)
    head += note
    dwell_s = config.dwell_s
    last_change_s = published.changed_at_s
    since_change_s = now_s - last_change_s if last_change_s is not None else None
    spaced = since_change_s is not None and since_change_s >= config.dwell_s
    if probing and spaced:
        # A probe rests on the memory's age, which only grows, not on this tick's noisy measurements: waiting
        # out a dwell would only delay it. At most one change per dwell still holds (the last was a dwell ago).
        dwell_s = 0.0
        head += f", at once (last change {since_change_s:.0f}s ago)"
    elif plan is not None and spaced and decisive:
        # The plan is already a decayed mean over the payback horizon, and a gain this large is not the model's
        # error, so a dwell on top of it only delays a change that pays (slo-load-rise: 115 s more under a load
        # where gamma 3 met the SLO for ~3% of tokens and gamma 1 for ~60%). At most one change per dwell holds.
        dwell_s = min(config.dwell_s, config.planned_confirm_s)
    outcome = apply_dwell(
        published=current,
        candidate=candidate,
        # The same change with its gamma moved within the noise floor keeps the clock it started.
        pending=candidate if continues else pending,
        pending_since_s=state.pending_since_s,
        now_s=now_s,
        dwell_s=dwell_s,
    )
    if outcome.changed:
        tail = f"; {dwell_s:.0f}s dwell served, {_transition(current, outcome.publish)}"
        # A probe published now is held until it is measured; any other change ends a hold.
        probe_since = now_s if probing and outcome.publish[0] else None
    elif outcome.pending is not None:
        tail = (
            f"; waiting {outcome.waited_s:.0f}s of {dwell_s:.0f}s dwell before "
            f"{_transition(current, outcome.pending)}"
        )
    elif pending is not None:
        tail = f"; candidate {_describe(pending)} withdrawn, dwell cleared"
    else:
        tail = ""

    changed_at_s = now_s if outcome.changed else published.changed_at_s
    decision = _decision(
        evidence, curve, outcome.publish, reason=prefix + head + tail, now_s=now_s, changed_at_s=changed_at_s
    )
    pend = outcome.pending
    next_state = DecideState(
        published=decision,
        pending_enabled=None if pend is None else pend[0],
        pending_gamma=None if pend is None else pend[1],
        pending_since_s=outcome.pending_since_s,
        probe_since_s=probe_since,
        probe_after_s=probe_after,
    )
    return decision, next_state


def _probe_hold(
    state: DecideState, current: _Key, *, measured: bool, config: DecideConfig, now_s: float
) -> tuple[bool, float | None, float | None, str]:
    """(hold the published probe this tick, probe_since_s, probe_after_s, a note for the reason): rule 5."""
    since, after = state.probe_since_s, state.probe_after_s
    if since is None or not current[0]:
        return False, None, after, ""
    if measured:
        return False, None, after, f"; probe at gamma {current[1]} measured, deciding on live data"
    waited = max(0.0, now_s - since)
    if waited >= config.probe_timeout_s:
        after = now_s + config.probe_backoff_s
        note = (
            f"; probe at gamma {current[1]} not applied after {waited:.0f}s, given up "
            f"(no probe for {config.probe_backoff_s:.0f}s)"
        )
        return False, None, after, note
    note = (
        f"; probing at gamma {current[1]}: held until the engine speculates and a window is measured "
        f"({waited:.0f}s of at most {config.probe_timeout_s:.0f}s)"
    )
    return True, since, after, note


# ----------------------------------------------------------------------------------------------------------
# The rule: which (enabled, gamma) this tick argues for, and the words for why
# ----------------------------------------------------------------------------------------------------------


def _candidate(
    current: _Key, star: CurvePoint, curve: Sequence[CurvePoint], evidence: Evidence, config: DecideConfig
) -> tuple[_Key, str]:
    on_next = hysteresis_on(
        currently_on=current[0], low=star.speedup_low, high=star.speedup_high, margin=config.margin
    )
    mean_len = star.expected_accepted_length
    # The batch the curve was priced at: sequences per engine step (costmodel.step_batch), not the running gauge.
    seen = f"{_fmt_point(star)} at batch {max(step_batch(evidence), 1.0):.1f}, E[L]({star.gamma})={mean_len:.2f}"
    bar = f"1+margin={1.0 + config.margin:.2f}"
    if not current[0]:
        if on_next:
            return (True, star.gamma), f"on: {seen}, low end {star.speedup_low:.2f} clears {bar}"
        return (False, 0), f"off: {seen}, low end {star.speedup_low:.2f} < {bar}"
    if not on_next:
        return (False, 0), f"off: {seen}, high end {star.speedup_high:.2f} < 1"

    head = f"on: {seen}, high end {star.speedup_high:.2f} >= 1"
    if star.speedup_low < 1.0 + config.margin:
        # Worth saying: the band straddles the bar, so it is the hysteresis, not confidence, that keeps it on.
        head += f" (inside hysteresis band, low end {star.speedup_low:.2f} < {bar})"
    limit = reachable_gamma_limit(
        current_gamma=current[1], measured_k=_measured_k(evidence), gamma_max=config.gamma_max
    )
    # Only a guess is capped: a measured gamma* (<= the deployed k in practice) is data, whatever its distance.
    choice = best_point(curve, limit) if star.extrapolated and star.gamma > limit else star
    if choice is None:  # the curve has no point at or below the limit: nothing reachable to move to
        return current, head + f"; no point in 1..{limit} keeps gamma {current[1]}"
    if choice is not star:
        head += f"; one step past measured k={_measured_k(evidence)}: best up to gamma {limit} is {_fmt_point(choice)}"
    if choice.gamma == current[1]:
        return current, head
    here = point_at(curve, current[1])
    if here is None:
        # The running gamma is off the curve (e.g. deployed k > gamma_max): nothing to weigh the move against.
        return (True, choice.gamma), head + f"; S({current[1]}) not on the curve"
    gain = choice.speedup - here.speedup
    gain_text = f"gain {gain:.2f} over {_fmt_point(here)}"
    min_gain = config.min_speedup_gain_to_change_gamma
    if choice.extrapolated:
        # A guess must beat the running gamma even at its pessimistic end (module docstring, rule 3).
        low_text = f"extrapolated low end {choice.speedup_low:.2f} vs S({current[1]})+{min_gain:.2f}="
        low_text += f"{here.speedup + min_gain:.2f}"
        if clears_min_change(current=here.speedup, proposed=choice.speedup_low, min_gain=min_gain):
            return (True, choice.gamma), head + f"; {gain_text}, {low_text} clears it"
        return current, head + f"; {gain_text}, {low_text} does not: keeps gamma {current[1]}"
    if clears_min_change(current=here.speedup, proposed=choice.speedup, min_gain=min_gain):
        return (True, choice.gamma), head + f"; {gain_text} >= {min_gain:.2f}"
    return current, head + f"; {gain_text} < {min_gain:.2f} keeps gamma {current[1]}"


def change_pays(
    *, gain: float | None, change_cost_s: float, inflight_s: float, payback_horizon_s: float,
    cost_scale: float = 1.0,
) -> tuple[bool, str]:
    """Whether a change's predicted gain pays back what a restart destroys over the horizon, and the numbers.

    `gain` is S(new) / S(current) - 1 (dimensionless; None when either side has no prediction: then nothing can
    be weighed and the change is allowed); `change_cost_s` (s, >= 0) the outage one change causes, `inflight_s`
    (s, >= 0; NaN or negative read as 0) the in-flight work a restart drops (`inflight_work_s`), both in
    seconds of full service; `payback_horizon_s` (s, > 0) how long the change must pay back over. Pays when
    gain x horizon > change_cost_s + inflight_s (module docstring, rule 4); change_cost_s = 0 (no restart)
    always pays with an empty text. `cost_scale` (> 0; anything else reads as 1) converts the cost into the
    gain's units when the gain is planned over the recent load (policies/plan.py): the cost is then compared
    x cost_scale, and the text shows both.

    Example: gain 0.057, cost 20 s, in-flight 2.56 s, horizon 600 s: 0.057 x 600 = 34.2 s > 22.56 s -> (True,
    "gain 5.7% x 600s horizon = 34.2s vs change cost 20.0s outage + 2.6s in-flight work = 22.6s"); gain 0.036
    (21.6 s) -> False.
    """
    if change_cost_s <= 0 or gain is None:
        return True, ""
    lost = inflight_s if math.isfinite(inflight_s) and inflight_s > 0 else 0.0
    cost = change_cost_of(change_cost_s=change_cost_s, inflight_s=lost)
    won = gain * payback_horizon_s
    text = (
        f"gain {gain:.1%} x {payback_horizon_s:.0f}s horizon = {won:.1f}s vs change cost {change_cost_s:.1f}s "
        f"outage + {lost:.1f}s in-flight work = {cost:.1f}s"
    )
    scale = _valid_scale(cost_scale)
    if scale != 1.0:
        cost *= scale
        text += f" x {scale:.2f} (today's delivered rate over the planned value) = {cost:.1f}s"
    return won > cost, text


# The least share of the delivered tokens a decisive planned change must move across the SLO (rule 6).
MIN_DECISIVE_SERVICE = 0.05


def _valid_scale(cost_scale: float) -> float:
    return cost_scale if math.isfinite(cost_scale) and cost_scale > 0 else 1.0


def change_cost_of(*, change_cost_s: float, inflight_s: float) -> float:
    """Seconds of full service one change costs: the outage plus the in-flight work (module docstring, rule 4).

    `change_cost_s` (s, >= 0; 0 = no restart, then nothing in flight is lost either), `inflight_s` (s; NaN or
    negative -> 0). Example: outage 20 s, in-flight 2.56 s -> 22.56 s; outage 0 -> 0.
    """
    if not (math.isfinite(change_cost_s) and change_cost_s > 0):
        return 0.0
    lost = inflight_s if math.isfinite(inflight_s) and inflight_s > 0 else 0.0
    return change_cost_s + lost


def inflight_work_s(evidence: Evidence) -> float:
    """Seconds of full service a restart throws away with the running requests: half a request's decode time.

    Each of the B running requests is caught, on average, halfway through its O output tokens, so B x O/2
    tokens are redone at the server's G generated tokens/s: O/2 x B / G seconds (B / G is one sequence's
    seconds per token). O is read from the evidence: the running context c = prompt + O/2 on average and the
    prompt/generation rate ratio rho = P / O give O = c / (rho + 1/2). The prompt's prefill is redone too but at
    prefill speed (hundreds of tokens per step), so it is left out. Returns 0.0 (s) when B, G or c is missing
    or not positive: only the outage is then counted. Units: B requests, G and the prompt rate tokens/s, c
    tokens.

    Example: B 32, G 1600 tokens/s, prompt rate 3200 tokens/s (rho 2), c 640: O = 640 / 2.5 = 256, so 128 tokens
    x 32 / 1600 = 2.56 s.
    """
    b = evidence.batch
    if not (math.isfinite(b) and b > 0):
        return 0.0
    return b * _request_output_s(evidence) / 2.0


def queued_work_s(evidence: Evidence) -> float:
    """Seconds of full service the queued requests represent: W requests x O output tokens / G tokens/s (O as in
    `inflight_work_s`). A restart errors them; how much of that is lost service is the caller's weighing
    (policies/plan.py `queue_weight`). Returns 0.0 when W, G or c is missing or not positive.

    Example: W 64, G 1600 tokens/s, prompt rate 3200 (rho 2), c 640: O = 256, 64 x 256 / 1600 = 10.24 s.
    """
    w = evidence.waiting
    if not (math.isfinite(w) and w > 0):
        return 0.0
    return w * _request_output_s(evidence)


def _request_output_s(evidence: Evidence) -> float:
    """One request's output in seconds of full service, O / G (O = c / (rho + 1/2), `inflight_work_s`); 0.0 when
    G or c is missing or not positive."""
    g, c = evidence.generation_tokens_per_s, evidence.context_tokens_per_seq
    if g is None or c is None or not (math.isfinite(g) and g > 0 and math.isfinite(c) and c > 0):
        return 0.0
    p = evidence.prompt_tokens_per_s
    rho = p / g if p is not None and math.isfinite(p) and p > 0 else 0.0
    return c / (rho + 0.5) / g


def _relative_gain(
    curve: Sequence[CurvePoint], current: _Key, candidate: _Key, *, current_at_best: bool = False
) -> float | None:
    """Rule 4's gain of `candidate` over `current`, per unit of what `current` delivers now: (S(new) - S(now)) /
    S(now) with S the curve's speedups (dimensionless). `current_at_best`: the current option is taken at its
    band's high end in the difference (a turn-off is priced at speculation's best) while the divisor stays its
    point, the rate it delivers now. Under an SLO the result is multiplied by the running option's share (rule 4:
    tokens moved across the SLO per delivered token).

    A move on (to another gamma, or from off) is priced at the low end of its gain's 90% band: S(new) is taken
    as S(new) exp(-1.645 gain_sd), gain_sd the sd of log(S(new) / S(running)) under the cost model's own
    uncertainty (CurvePoint.gain_sd, policies/uncertainty.py).

    Example: running gamma 3 at S 1.20 (band high 1.30), off 1.0, SLO share 0.5: a turn-off gains (1.0 - 1.30) /
    1.20 x 0.5 = -0.125, where the point alone gave (1.0 - 1.20) / 1.20 x 0.5 = -0.083. Running gamma 3 at 1.20,
    gamma 1 at 1.35 with gain_sd 0.05: (1.35 exp(-0.082) - 1.20) / 1.20 = +3.6% (the point alone: +12.5%).
    """

    def at(key: _Key, best: bool = False) -> tuple[float, float | None] | None:
        point = point_at(curve, key[1] if key[0] else 0)
        if not key[0]:
            return 1.0, point.slo_share if point is not None else None  # plain decoding is the curve's unit
        if point is None:
            return None
        return (point.speedup_high if best else point.speedup), point.slo_share

    now, high, new = at(current), at(current, current_at_best), at(candidate)
    if now is None or high is None or new is None or now[0] <= 0:
        return None
    target = new[0]
    moved = point_at(curve, candidate[1]) if candidate[0] else None
    if moved is not None and not current_at_best and moved.gain_sd > 0:
        # A move to another gamma, or on, is taken at the low end of its own gain's 90% band: the cost model's
        # uncertainty of S(new) / S(running) (CurvePoint.gain_sd), e.g. a per-draft-token cost never measured.
        target *= math.exp(-Z_90 * moved.gain_sd)
    gain = (target - high[0]) / now[0]
    # SLO goodput: per delivered token, not per token now meeting the SLO (rule 4).
    return gain * now[1] if now[1] is not None else gain


def reachable_gamma_limit(*, current_gamma: int, measured_k: int, gamma_max: int) -> int:
    """The largest gamma one move may reach while on: one step past the measured k, never below where it is.

    `current_gamma` (>= 1) is the published gamma, `measured_k` (>= 0) the deployed k whose positions were
    measured (0 when the engine is not speculating), `gamma_max` (>= 1) the configured ceiling; returns an int in
    1..gamma_max. It is max(measured_k + 1, current_gamma), so a published gamma above what runs (the operator has
    not applied it yet) is never pulled down by the cap, then clipped to gamma_max.

    Example: measured k=3, current 3, gamma_max 8 -> 4 (a move to 8 becomes a move to at most 4); measured k=3,
    current 5 -> 5; measured k=10, current 10, gamma_max 8 -> 8.
    """
    return max(1, min(gamma_max, max(measured_k + 1, current_gamma)))


def _against_pending(
    candidate: _Key, pending: _Key | None, published: _Key, curve: Sequence[CurvePoint], config: DecideConfig
) -> tuple[_Key, bool, str]:
    """The change to dwell on this tick, whether it continues the pending one's clock, and a note for the reason.

    The minimum-change rule applied against the pending change (see the module docstring).
    """
    if pending is None or candidate in (pending, published) or candidate[0] != pending[0]:
        return candidate, False, ""
    # Both on, at different gammas: is the new gamma a different change, or the pending one seen through noise?
    was, now = point_at(curve, pending[1]), point_at(curve, candidate[1])
    if was is None or now is None:
        return candidate, False, f"; pending gamma {pending[1]} not comparable on this curve, dwell restarts"
    min_gain = config.min_speedup_gain_to_change_gamma
    gain = now.speedup - was.speedup
    if clears_min_change(current=was.speedup, proposed=now.speedup, min_gain=min_gain):
        return candidate, False, f"; beats pending S({pending[1]})={was.speedup:.2f} by {gain:.2f}, dwell restarts"
    within = f"; within {min_gain:.2f} of pending S({pending[1]})={was.speedup:.2f}"
    running = point_at(curve, published[1]) if published[0] else None
    if running is not None and not clears_min_change(
        current=running.speedup, proposed=was.speedup, min_gain=min_gain
    ):
        # The pending gamma alone would now be churn over the running one; the candidate's gamma is not, and
        # the two are equal within the noise floor, so it is the same change.
        return candidate, True, within + f", which no longer clears {min_gain:.2f} over the running gamma"
    return pending, True, within + f", keeping gamma {pending[1]}"


# ----------------------------------------------------------------------------------------------------------
# Holding on without good evidence
# ----------------------------------------------------------------------------------------------------------


def _hold(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    state: DecideState,
    now_s: float,
    *,
    kind: TargetState,
    why: str,
) -> tuple[Decision, DecideState]:
    dropped = "" if _pending(state) is None else "; pending change dropped, dwell restarts"
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
        return decision, DecideState()
    age_s = now_s - published.evaluated_at_s
    kept = _describe(_key(published))
    reason = f"{kind.value}: keeping {kept} from the last good decision {age_s:.0f}s ago; {why}"
    # The last good decision's speedups and curve stay together: the band shown is the one it was decided on.
    decision = replace(published, state=kind, reason=reason + dropped, evaluated_at_s=now_s)
    # A held probe and its back-off outlive a spell of bad data (the engine restarting to apply the probe is one).
    kept_state = DecideState(
        published=published, probe_since_s=state.probe_since_s, probe_after_s=state.probe_after_s
    )
    return decision, kept_state


def _why_not_ok(evidence: Evidence) -> str:
    told = _one_line(evidence.reason)
    if told:
        return told
    if evidence.state is TargetState.INSUFFICIENT_DATA:
        drafts = 0.0 if evidence.acceptance is None else evidence.acceptance.drafts
        return f"{drafts:.0f} drafts seen in the window"
    return f"evidence state {evidence.state.value}"


# ----------------------------------------------------------------------------------------------------------
# Small conversions and formatting
# ----------------------------------------------------------------------------------------------------------


def _measured_k(evidence: Evidence) -> int:
    # Positions 0..k-1 are measured only while the engine speculates at k.
    return evidence.deployed_k if evidence.speculation_on else 0


def _deployment(evidence: Evidence) -> _Key:
    # "On with 0 drafts" is not a state the engine can be in for our purposes: normalise to off.
    if evidence.speculation_on and evidence.deployed_k >= 1:
        return True, evidence.deployed_k
    return False, 0


def _key(decision: Decision) -> _Key:
    return decision.enabled, decision.num_speculative_tokens if decision.enabled else 0


def _pending(state: DecideState) -> _Key | None:
    if state.pending_enabled is None or state.pending_gamma is None or state.pending_since_s is None:
        return None
    return state.pending_enabled, state.pending_gamma if state.pending_enabled else 0


def _decision(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    key: _Key,
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
        state=TargetState.OK,
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


def _fmt_point(point: CurvePoint) -> str:
    extrapolated = " extrapolated" if point.extrapolated else ""
    band = f"[{point.speedup_low:.2f}..{point.speedup_high:.2f}]"
    return f"S({point.gamma})={point.speedup:.2f} {band}{extrapolated}"


def _describe(key: _Key) -> str:
    return f"on, gamma {key[1]}" if key[0] else "off"


def _transition(before: _Key, after: _Key) -> str:
    if before[0] and after[0]:
        return f"switching gamma {before[1]}->{after[1]}"
    if after[0]:
        return f"switching on at gamma {after[1]}"
    return f"switching off (from gamma {before[1]})"


def _one_line(text: str) -> str:
    return " ".join(text.split())
