"""The actuation safety gate: whether to change a deployment now, and why not when it does not.

Pure: every input, the time included (`now_s`, Unix seconds), comes in as an argument; the next state comes out.
`gate_action` runs these checks in order and reports the first one that holds the action back:

1. paused                        -> PAUSED (the operator's kill switch: nothing is written, overrides included)
2. the observation failed        -> OBSERVATION_ERROR (nothing to compare with, no resourceVersion to guard)
3. a rollout is in progress      -> ROLLOUT_IN_PROGRESS (never stack a change on an unfinished one)
4. an unexpired manual override  -> the override's setting is wanted, and steps 5, 7 and 9 do not apply: a human
   asked for it, so its first attempt is immediate; a retry after an attempt under the same override (one that
   failed: a success shows as ALREADY_APPLIED or ROLLOUT_IN_PROGRESS) waits out the cooldown -> COOLDOWN.
   It expires by itself at `expires_at_s`; from then on the recommendation rules again.
5a. the Deployment runs another engine than the advice was priced for (parallelism, a step limit both sides give,
   or a flag that cannot be read: policies/act/engine.py) -> ENGINE_MISMATCH (the advice is not about this engine)
5b. no decision / decision not ok -> NO_DECISION, STALE, ERROR, INSUFFICIENT_DATA; no desired setting -> NO_DESIRED
6. already running it            -> ALREADY_APPLIED; schedule differs only immaterially -> BELOW_CHANGE_THRESHOLD
7. dwell: the wanted setting must have been the same, on every tick with an `ok` decision, for `dwell_s`
   (a tick that is not ok restarts the dwell: a spell without good data must not count toward it)   -> DWELL
8. cooldown since the last action -> COOLDOWN
9. sliding-window caps            -> HOURLY_CAP, DAILY_CAP
Otherwise the plan is to act, and the returned state already counts the action (cooldown and caps start now, in
dry run too, so a dry run shows exactly the actions a live run would take). A failed apply counts as well: a broken
RBAC or an unreachable API server is retried once per cooldown, not on every tick.

"Changed materially" (schedule mode, `schedule_change_share`). Two per-batch schedules differ materially when the
batch sizes at which their k differs by at least `min_schedule_k_delta` carry at least `min_schedule_change_share`
of the batch range, weighing batch size b by ln((b + 1) / b), so each doubling of the batch counts the same (the
range 1..N weighs ln(N + 1); a band lo..hi weighs ln((hi + 1) / lo)). A restart for a change that only touches the
rarely reached top of the range is not worth it; one that changes what runs at batch 1-3 is. Example, N = 256:
k differs at batch 1..3 -> ln(4) / ln(257) = 1.386 / 5.549 = 0.25 (material at the default 0.10); k differs at
batch 200..256 -> ln(257 / 200) / ln(257) = 0.251 / 5.549 = 0.045 (not material). Turning speculation on or off
(one side drafts nowhere) is always material.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from policies.act.deployment import DeploymentObservation, SpeculationSetting
from policies.offline.schedule import BatchSchedule
from policies.types import DataState, Decision

HOUR_S = 3600.0
DAY_S = 86400.0


class SkipReason(StrEnum):
    """Why no action was taken this tick: a closed set, used as a metric label and in the audit log."""

    PAUSED = "paused"
    NOT_LEADER = "not_leader"  # leader election on: another replica holds the lease (the runner's, before rule 1)
    OBSERVATION_ERROR = "observation_error"
    ROLLOUT_IN_PROGRESS = "rollout_in_progress"
    NO_DECISION = "no_decision"
    STALE = "stale"
    ERROR = "error"
    INSUFFICIENT_DATA = "insufficient_data"
    NO_DESIRED = "no_desired"  # the wanted setting could not be computed (e.g. no cost model for a schedule)
    ENGINE_MISMATCH = "engine_mismatch"  # the Deployment's vLLM flags differ from the engine the advice priced
    DWELL = "dwell"
    ALREADY_APPLIED = "already_applied"
    BELOW_CHANGE_THRESHOLD = "below_change_threshold"
    COOLDOWN = "cooldown"
    HOURLY_CAP = "hourly_cap"
    DAILY_CAP = "daily_cap"


_STATE_SKIPS = {
    DataState.STALE: SkipReason.STALE,
    DataState.ERROR: SkipReason.ERROR,
    DataState.INSUFFICIENT_DATA: SkipReason.INSUFFICIENT_DATA,
}


@dataclass(frozen=True, slots=True)
class ActuationConfig:
    """The gate's numbers. Seconds for times; counts per sliding window; share in (0, 1].

    dwell_s 300: five minutes of the same wanted setting on good data (on top of the decision's own dwell), since a
    rollout restarts pods. cooldown_s 900: a rollout of a large model takes minutes; 15 min lets it finish and the
    new setting show up in the evidence before the next change. 2 per hour / 8 per day bound the damage a wrong
    model can do. `dry_run` is read by the runner (the gate behaves the same either way).
    """

    dwell_s: float = 300.0
    cooldown_s: float = 900.0
    max_actions_per_hour: int = 2
    max_actions_per_day: int = 8
    min_schedule_change_share: float = 0.10
    min_schedule_k_delta: int = 1
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class Override:
    """A manual setting that wins over the recommendation until `expires_at_s` (Unix seconds)."""

    setting: SpeculationSetting
    expires_at_s: float
    reason: str
    set_at_s: float


@dataclass(frozen=True, slots=True)
class ActuationState:
    """What the gate remembers between ticks for one target.

    `wanted`/`wanted_since_s`: the decision's wanted setting and since when it has held (dwell). `recent_actions_s`:
    action times within the last day, oldest first (the caps' sliding windows).
    """

    wanted: SpeculationSetting | None = None
    wanted_since_s: float | None = None
    last_action_s: float | None = None
    recent_actions_s: tuple[float, ...] = ()
    paused: bool = False
    override: Override | None = None


@dataclass(frozen=True, slots=True)
class ActionPlan:
    """The gate's verdict: act (towards `desired`) or skip for `skip`; `detail` says it for people."""

    act: bool
    desired: SpeculationSetting | None
    skip: SkipReason | None = None
    detail: str = ""
    via_override: bool = False


def desired_setting(
    decision: Decision, *, mode: str, schedule: BatchSchedule | None = None, on_pool_k: int | None = None
) -> SpeculationSetting | None:
    """The setting a deployment should run for `decision`, by actuation mode; None when it cannot be computed.

    - "kubernetes": k = decision.num_speculative_tokens when enabled, else 0 (off).
    - "schedule": the per-batch bands of `schedule` (policies/offline/schedule.py, from the same model and evidence),
      with k = its largest band k; off (0) when no band drafts. The decision's own on/off at today's batch is not used:
      the schedule already says what to run at every batch. None without a schedule.
    - "routing": the on-pool's fixed k (`on_pool_k`, >= 1) when enabled, else 0 (traffic to the off pool).
    Example: decision enabled with k 3 -> kubernetes SpeculationSetting(3); schedule with bands (1-30: 5),
    (31-256: 2) -> SpeculationSetting(5, ((30, 5), (256, 2))); routing with on_pool_k 4 -> SpeculationSetting(4).
    """
    if mode == "schedule":
        if schedule is None:
            return None
        if not schedule.speculation_useful:
            return SpeculationSetting(0)
        bands = tuple((band.hi, band.gamma) for band in schedule.bands)
        return SpeculationSetting(schedule.max_gamma, schedule=bands)
    if mode == "routing":
        if on_pool_k is None or on_pool_k < 1:
            return None
        return SpeculationSetting(on_pool_k if decision.enabled else 0)
    return SpeculationSetting(decision.num_speculative_tokens if decision.enabled else 0)


def schedule_change_share(a: SpeculationSetting, b: SpeculationSetting, *, min_k_delta: int = 1) -> float:
    """Share (0..1) of the batch range, log-weighted (module docstring), where k differs by >= `min_k_delta` (>= 1).

    A fixed-k setting counts as one band covering the whole range. Batch sizes past a schedule's last band run k 0
    (as they would with speculation turned off there). Example: ((3, 4), (256, 2)) vs ((256, 2),), N = 256:
    k differs (4 vs 2) at batch 1..3 -> ln(4) / ln(257) = 0.25.
    """
    top = max(_top(a), _top(b), 1)
    total = math.log(top + 1)
    changed = 0.0
    for lo, hi, k_a, k_b in _segments(_bands(a, top), _bands(b, top)):
        if abs(k_a - k_b) >= min_k_delta:
            changed += math.log((hi + 1) / lo)
    return changed / total


def judged_decision(decision: Decision | None, evidence_state: DataState | None) -> Decision | None:
    """The decision the gate judges: an ok decision over evidence that is not ok is handed over in the evidence's
    state (insufficient_data without evidence): a decision kept ok on remembered acceptance over a thin live window
    is good enough to advise, not to restart pods on. Example: ok decision, evidence insufficient_data -> the same
    decision in state insufficient_data (the gate skips `insufficient_data` and restarts its dwell)."""
    if decision is None or decision.state != DataState.OK:
        return decision
    state = evidence_state if evidence_state is not None else DataState.INSUFFICIENT_DATA
    return decision if state == DataState.OK else replace(decision, state=state)


def gate_action(
    decision: Decision | None,
    observation: DeploymentObservation,
    desired: SpeculationSetting | None,
    *,
    config: ActuationConfig,
    state: ActuationState,
    now_s: float,
) -> tuple[ActionPlan, ActuationState]:
    """Whether to change the deployment now (module docstring for the rules, in order), and the next state.

    `desired` is `desired_setting(decision, ...)` for this tick (None when unknown); `observation` the actuator's
    read of the deployment this tick, with how its engine differs from the one the decision was priced for
    (`observation.engine_mismatch`, rule 5a). Times in Unix seconds.
    Example: dwell 300, cooldown 900, last action at t=0; a decision ok wanting k 3 since t=600, deployment at k 0,
    now t=950: held 350 >= 300, cooldown 950 >= 900 since the last action, 1 action in the past hour < 2 -> act,
    and the new state counts the action at 950 (the next one waits until 950 + 900 = 1850).
    """
    state = _expire_override(state, now_s)
    state = _track_wanted(state, decision, desired, config, now_s)
    state = replace(state, recent_actions_s=tuple(t for t in state.recent_actions_s if now_s - t < DAY_S))
    skip = _deployment_skip(observation, desired, state)
    running = observation.setting
    if skip is not None or running is None:
        return skip or _skip(SkipReason.OBSERVATION_ERROR, desired, "no setting read"), state
    if state.override is not None:
        return _override_plan(state.override, running, config=config, state=state, now_s=now_s)
    skip = _engine_skip(observation, desired) or _decision_skip(decision, running, desired, config)
    if skip is None and desired is not None:
        skip = _pace_skip(desired, config=config, state=state, now_s=now_s)
    if skip is not None or desired is None:
        return skip or _skip(SkipReason.NO_DESIRED, desired, "the wanted setting could not be computed"), state
    held_s = now_s - (state.wanted_since_s if state.wanted_since_s is not None else now_s)
    return ActionPlan(act=True, desired=desired, detail=f"held {held_s:.0f} s"), _count_action(state, now_s)


def _deployment_skip(
    observation: DeploymentObservation, desired: SpeculationSetting | None, state: ActuationState
) -> ActionPlan | None:
    """Rules 1-3: paused, the deployment could not be read, a rollout in progress (None: none applies)."""
    if state.paused:
        return _skip(SkipReason.PAUSED, desired, "actuation is paused")
    if observation.error is not None or observation.setting is None:
        why = observation.error.value if observation.error is not None else "no setting read"
        return _skip(SkipReason.OBSERVATION_ERROR, desired, f"{why}: {observation.detail}".rstrip(": "))
    if observation.rollout_in_progress:
        return _skip(SkipReason.ROLLOUT_IN_PROGRESS, desired, "a rollout is still in progress")
    return None


def _engine_skip(observation: DeploymentObservation, desired: SpeculationSetting | None) -> ActionPlan | None:
    """Rule 5a: the Deployment's flags against the engine the advice priced (None: they agree, or no one compared
    them)."""
    why = observation.engine_mismatch
    return None if why is None else _skip(SkipReason.ENGINE_MISMATCH, desired, why)


def _override_plan(
    override: Override, running: SpeculationSetting, *, config: ActuationConfig, state: ActuationState, now_s: float
) -> tuple[ActionPlan, ActuationState]:
    """A manual override in force: its setting, at once (a human asked); a retry after a failed attempt waits out
    the cooldown like any action, so a broken RBAC is not hammered every tick."""
    wanted = override.setting
    if same_setting(running, wanted):
        return _skip(SkipReason.ALREADY_APPLIED, wanted, "the override's setting is running", True), state
    tried_s = state.last_action_s
    if tried_s is not None and tried_s >= override.set_at_s and now_s - tried_s < config.cooldown_s:
        left_s = config.cooldown_s - (now_s - tried_s)
        return _skip(SkipReason.COOLDOWN, wanted, f"override retry: {left_s:.0f} s of cooldown left", True), state
    plan = ActionPlan(act=True, desired=wanted, detail=f"manual override: {override.reason}", via_override=True)
    return plan, _count_action(state, now_s)


def _decision_skip(
    decision: Decision | None, running: SpeculationSetting, desired: SpeculationSetting | None,
    config: ActuationConfig,
) -> ActionPlan | None:
    """Rules on the recommendation: none yet, not ok, no wanted setting, already running, not a material change
    (None: none applies)."""
    if decision is None:
        return _skip(SkipReason.NO_DECISION, desired, "no recommendation published yet")
    if decision.state != DataState.OK:
        return _skip(_STATE_SKIPS[decision.state], desired, f"recommendation is {decision.state.value}")
    if desired is None:
        return _skip(SkipReason.NO_DESIRED, desired, "the wanted setting could not be computed")
    if same_setting(running, desired):
        return _skip(SkipReason.ALREADY_APPLIED, desired, "the deployment already runs it")
    if not materially_different(running, desired, config):
        share = schedule_change_share(running, desired, min_k_delta=config.min_schedule_k_delta)
        return _skip(SkipReason.BELOW_CHANGE_THRESHOLD, desired,
                     f"schedule changed over {share:.0%} of the batch range, below "
                     f"{config.min_schedule_change_share:.0%}")
    return None


def _pace_skip(
    desired: SpeculationSetting, *, config: ActuationConfig, state: ActuationState, now_s: float
) -> ActionPlan | None:
    """Rules on pace: the wanted setting held for the dwell, the cooldown since the last action, the hourly and
    daily caps (None: none applies)."""
    held_s = now_s - (state.wanted_since_s if state.wanted_since_s is not None else now_s)
    if held_s < config.dwell_s:
        return _skip(SkipReason.DWELL, desired, f"held {held_s:.0f} s of {config.dwell_s:.0f} s")
    if state.last_action_s is not None and now_s - state.last_action_s < config.cooldown_s:
        left_s = config.cooldown_s - (now_s - state.last_action_s)
        return _skip(SkipReason.COOLDOWN, desired, f"{left_s:.0f} s of cooldown left")
    last_hour = actions_within(state, HOUR_S, now_s)
    if last_hour >= config.max_actions_per_hour:
        return _skip(SkipReason.HOURLY_CAP, desired,
                     f"{last_hour} actions in the last hour (max {config.max_actions_per_hour})")
    last_day = actions_within(state, DAY_S, now_s)
    if last_day >= config.max_actions_per_day:
        return _skip(SkipReason.DAILY_CAP, desired,
                     f"{last_day} actions in the last day (max {config.max_actions_per_day})")
    return None


def same_setting(a: SpeculationSetting, b: SpeculationSetting) -> bool:
    """Whether two settings run the same: both off, or the same k and the same schedule.
    Example: SpeculationSetting(0) and SpeculationSetting(0, ((256, 0),)) are the same (both draft nowhere)."""
    if not a.enabled and not b.enabled:
        return True
    return a.num_speculative_tokens == b.num_speculative_tokens and a.schedule == b.schedule


def materially_different(a: SpeculationSetting, b: SpeculationSetting, config: ActuationConfig) -> bool:
    """Whether changing from `a` to `b` is worth a rollout. Fixed k: any change of k or on/off. Schedules (either
    side has bands): on/off always; else `schedule_change_share` >= min_schedule_change_share (module docstring).
    Example: k 3 -> k 4 is material; ((3, 4), (256, 2)) -> ((4, 4), (256, 2)) moves batch 4 only:
    ln(5 / 4) / ln(257) = 0.04 < 0.10, not material."""
    if same_setting(a, b):
        return False
    if a.enabled != b.enabled or not (a.schedule or b.schedule):
        return True
    share = schedule_change_share(a, b, min_k_delta=config.min_schedule_k_delta)
    return share >= config.min_schedule_change_share


def actions_within(state: ActuationState, window_s: float, now_s: float) -> int:
    """Actions in the sliding window (now - window_s, now]. Example: actions at 0 and 3000, now 3650, window
    3600 -> 3650 - 0 = 3650 is not < 3600 (out), 3650 - 3000 = 650 is (in): 1."""
    return sum(1 for t in state.recent_actions_s if now_s - t < window_s)


def cooldown_remaining_s(state: ActuationState, config: ActuationConfig, now_s: float) -> float:
    """Seconds until the cooldown allows another action (0 when it does). Example: last action 100, cooldown 900,
    now 400 -> 600."""
    if state.last_action_s is None:
        return 0.0
    return max(0.0, config.cooldown_s - (now_s - state.last_action_s))


def active_override(state: ActuationState, now_s: float) -> Override | None:
    """The override in force at `now_s` (None once expired: expiry is `now_s >= expires_at_s`)."""
    override = state.override
    return override if override is not None and now_s < override.expires_at_s else None


def _expire_override(state: ActuationState, now_s: float) -> ActuationState:
    if state.override is not None and active_override(state, now_s) is None:
        return replace(state, override=None)
    return state


def _track_wanted(
    state: ActuationState,
    decision: Decision | None,
    desired: SpeculationSetting | None,
    config: ActuationConfig,
    now_s: float,
) -> ActuationState:
    if decision is None or decision.state != DataState.OK or desired is None:
        return replace(state, wanted=None, wanted_since_s=None)
    if state.wanted is None or materially_different(state.wanted, desired, config):
        return replace(state, wanted=desired, wanted_since_s=now_s)
    # The same wanted setting, or a schedule jittering within the change threshold: the dwell keeps its clock and
    # the latest schedule is what would be written.
    return replace(state, wanted=desired)


def _count_action(state: ActuationState, now_s: float) -> ActuationState:
    return replace(state, last_action_s=now_s, recent_actions_s=(*state.recent_actions_s, now_s))


def _skip(
    reason: SkipReason, desired: SpeculationSetting | None, detail: str, via_override: bool = False
) -> ActionPlan:
    return ActionPlan(act=False, desired=desired, skip=reason, detail=detail, via_override=via_override)


def _top(setting: SpeculationSetting) -> int:
    return setting.schedule[-1][0] if setting.schedule else 0


def _bands(setting: SpeculationSetting, top: int) -> list[tuple[int, int, int]]:
    # (lo, hi, k) covering 1..top; a fixed k covers it all, a schedule's tail past its last band runs 0.
    if not setting.schedule:
        return [(1, top, setting.num_speculative_tokens)]
    bands: list[tuple[int, int, int]] = []
    lo = 1
    for hi, k in setting.schedule:
        if hi >= lo:
            bands.append((lo, min(hi, top), k))
            lo = hi + 1
    if lo <= top:
        bands.append((lo, top, 0))
    return bands


def _segments(
    a: list[tuple[int, int, int]], b: list[tuple[int, int, int]]
) -> list[tuple[int, int, int, int]]:
    # Intersections of two band lists over the same range: (lo, hi, k in a, k in b).
    out: list[tuple[int, int, int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi, a[i][2], b[j][2]))
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return out
