"""What decide's rule (policies/decide/rule.py) takes and carries: its config, the state kept between ticks, what a
tick knows beyond the evidence and the curve, and the bundles its stages pass each other. Also the small conversions
between a Decision or the evidence and an option key (enabled, gamma)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.decide.value import Key, point_at
from policies.types import CurvePoint, Decision, Evidence, Why


@dataclass(frozen=True, slots=True)
class DecideConfig:
    """The narrow policy config. Gains are dimensionless shares of the service; times are seconds."""

    margin: float = 0.02  # the least pessimistic gain g a change must promise (policies/decide/rule.py)
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
    tried_s: float | None = None  # when a move to more drafts was last published as a trial (`try_more`)
    tried_gamma: int | None = None  # the gamma that trial went to, until the next published change
    trial_left_s: float | None = None  # when a move down from it was published within H: the trial was left


@dataclass(frozen=True, slots=True)
class Probe:
    """A request to switch speculation on at `gamma` (>= 1) to re-measure acceptance, with `why` for the reason
    (made by `probe.probe_for` while off on a remembered profile)."""

    gamma: int
    why: str


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
class Tick:
    """One tick's fixed inputs, passed together to the stages of `decide`."""

    evidence: Evidence
    curve: Sequence[CurvePoint]
    config: DecideConfig
    now_s: float


@dataclass(frozen=True, slots=True)
class Prices:
    """What options are valued on this tick: C today (s of this window's service), C in the valued curve's units,
    that curve, the options, and whether it is a plan."""

    today_s: float
    cost_s: float
    curve: Sequence[CurvePoint]
    options: Sequence[Key]
    planned: bool


@dataclass(frozen=True, slots=True)
class Candidate:
    """The option this tick would publish, its wait (s), its side (`side_of`), whether it is a probe, and the reason
    text that explains it."""

    key: Key
    wait_s: float
    side: int = 0
    probing: bool = False
    text: str = ""
    why: tuple[Why, ...] = ()
    trying: bool = False  # a move to more drafts while on, valued as a trial (`try_more`)


@dataclass(frozen=True, slots=True)
class ProbeHold:
    """A published probe's hold this tick: held (the engine has not run it yet), probe_since_s, probe_after_s, and
    a note for the reason."""

    held: bool = False
    since_s: float | None = None
    after_s: float | None = None
    note: str = ""


def side_of(option: Key, current: Key) -> int:
    """Which way a change goes: +1 to more speculation (more drafts than run, on from off included), -1 to less
    (fewer drafts, or off): a candidate that moves between off and fewer drafts keeps its direction."""
    if not option[0]:
        return -1
    return 1 if not current[0] or option[1] > current[1] else -1


def measured_k_of(evidence: Evidence) -> int:
    # Positions 0..k-1 are measured only while the engine speculates at k.
    return evidence.deployed_k if evidence.speculation_on else 0


def deployment_of(evidence: Evidence) -> Key:
    # "On with 0 drafts" is not a state the engine can be in for our purposes: normalise to off.
    if evidence.speculation_on and evidence.deployed_k >= 1:
        return True, evidence.deployed_k
    return False, 0


def key_of(decision: Decision) -> Key:
    return decision.enabled, decision.num_speculative_tokens if decision.enabled else 0


def pending_of(state: DecideState) -> Key | None:
    if state.pending_enabled is None or state.pending_gamma is None or state.pending_since_s is None:
        return None
    return state.pending_enabled, state.pending_gamma if state.pending_enabled else 0


def is_extrapolated(curve: Sequence[CurvePoint], key: Key) -> bool:
    point = point_at(curve, key[1])
    return point is None or point.extrapolated


def least_trial_s(config: DecideConfig) -> float:
    # A published change runs at least a dwell (and a window, to be measured) before it can be undone.
    return max(config.dwell_s, config.probe_min_s)
