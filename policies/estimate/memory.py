"""Acceptance memory: the last trusted per-position acceptance per model, kept for when nothing new is measured.

While speculation is off vLLM exposes no spec-decode counters, so the estimator reports `acceptance=None` and
nothing new is learnt about how well the drafter would do. Without a memory the advisor could price a return to
speculation only from a generic per-method prior. The memory keeps, per served model name, the last profile the
estimator trusted (state ok, speculation on, at least `min_drafts` drafts in a real window) with the number of
drafts behind it, the k it was measured at and when; the decision uses it, aged, while speculation is off.

Ageing (why and how). The workload may drift while nobody measures (code -> chat), so a remembered profile is
worth less the older it is. We express that as an effective sample size that halves every `half_life_s`:

    n_eff(a) = min(n, N_cap) x 2^(-a / half_life_s)      a = now_s - measured_at_s (seconds, clipped at 0)

`n` is the drafts the profile was measured over, `N_cap` (`max_effective_drafts`) says that however many drafts
stood behind it, a remembered profile is never worth more than that many fresh ones (the doubt is about drift,
not counting noise; without the cap a 100 000-draft window would stay sharp for hours). Each position's interval
is then the Wilson interval of (r_i x n_eff) successes in n_eff trials (policies/estimate/intervals.py), widened to
contain the interval it was measured with, so it only ever grows with age. The point estimates r_i are kept: switching
on takes the speedup at its band's low end (policies/decide/value.py), and the widening alone makes that low end
fall.

A profile is unusable (the advisor falls back to the method prior) once a > `max_age_s` or n_eff <
`min_effective_drafts`. With the defaults (half-life 30 min, cap 2000, floor 30, max 6 h) n_eff reaches 30 after
30 min x log2(2000 / 30) = 30 x 6.06 = 182 min, so a well-measured profile is usable for about three hours.

Worked example (defaults, z = 1.96): r_1 = 0.8 measured over 9000 drafts, one hour ago. n_eff = min(9000, 2000) x
2^(-3600 / 1800) = 2000 / 4 = 500; Wilson(400 of 500): centre = (0.8 + 0.0038416) / 1.0076832 = 0.79770, half =
1.94506 x sqrt(0.8 x 0.2 / 500 + 3.8416 / 1e6) = 1.94506 x 0.017996 = 0.035003, so r_1 in (0.7627, 0.8327);
fresh (n_eff 2000) it was about (0.782, 0.817). Two hours later (n_eff 31.25) it is about (0.63, 0.91).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.estimate.intervals import wilson_interval
from policies.types import AcceptanceEvidence, DataState, Evidence


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How long a remembered acceptance profile is trusted, and what is worth remembering.

    `half_life_s` (s, > 0): the effective sample size halves every this long. `max_effective_drafts` (> 0): the
    most drafts a remembered profile counts for, however many it was measured over. `min_effective_drafts` (>= 1):
    below this n_eff the profile is unusable. `max_age_s` (s, > 0): older profiles are unusable whatever their
    n_eff. `min_drafts` (>= 1): drafts a window needs before it is remembered (the estimator's own default).
    `z` (> 0): normal quantile of the aged intervals (1.96 ~ 95 %, as the estimator).
    """

    half_life_s: float = 1800.0
    max_effective_drafts: float = 2000.0
    min_effective_drafts: float = 30.0
    max_age_s: float = 6 * 3600.0
    min_drafts: float = 200.0
    z: float = 1.96

    def __post_init__(self) -> None:
        positive = {
            "half_life_s": self.half_life_s,
            "max_effective_drafts": self.max_effective_drafts,
            "max_age_s": self.max_age_s,
            "z": self.z,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if not (math.isfinite(self.min_effective_drafts) and self.min_effective_drafts >= 1):
            raise ValueError(f"min_effective_drafts must be >= 1, got {self.min_effective_drafts}")
        if not (math.isfinite(self.min_drafts) and self.min_drafts >= 1):
            raise ValueError(f"min_drafts must be >= 1, got {self.min_drafts}")


@dataclass(frozen=True, slots=True)
class RememberedAcceptance:
    """One model's last trusted acceptance: r_i = P(at least i drafts accepted), i = 1..k, as measured.

    `drafts` verifications stood behind it; `k` = len(per_position) is the deployed k it was measured at;
    `measured_at_s` (Unix seconds) is the evidence's time; `cold_start` marks lifetime counters (kept only when
    nothing better was remembered).
    """

    model: str
    per_position: tuple[float, ...]
    per_position_low: tuple[float, ...]
    per_position_high: tuple[float, ...]
    drafts: float
    mean_proposed_length: float
    measured_at_s: float
    cold_start: bool = False
    draft_coverage: float = 1.0  # share of sequence-steps that drafted (AcceptanceEvidence.draft_coverage)
    positions_measured: bool = True  # False: an i.i.d. fit to the mean (AcceptanceEvidence.positions_measured)

    @property
    def k(self) -> int:
        """The deployed k it was measured at: per_position (0.8, 0.6, 0.45) -> 3."""
        return len(self.per_position)


@dataclass(frozen=True, slots=True)
class AcceptanceMemory:
    """Remembered profiles, at most one per model name, sorted by model (so equal memories compare equal)."""

    entries: tuple[RememberedAcceptance, ...] = ()

    def get(self, model: str) -> RememberedAcceptance | None:
        """The profile remembered for `model`, or None. Example: get("llama") after remembering it -> the entry."""
        return next((entry for entry in self.entries if entry.model == model), None)

    def with_entry(self, entry: RememberedAcceptance) -> AcceptanceMemory:
        """A memory with `entry` replacing any profile of the same model (others kept, sorted by model).

        Example: a memory of {"a" k=3, "b" k=2} with a new "a" k=1 -> {"a" k=1, "b" k=2}.
        """
        kept = [e for e in self.entries if e.model != entry.model]
        return AcceptanceMemory(entries=tuple(sorted([*kept, entry], key=lambda e: e.model)))

    def by_model(self) -> Mapping[str, RememberedAcceptance]:
        """The profiles keyed by model name. Example: entries ("a", "b") -> {"a": ..., "b": ...}."""
        return {entry.model: entry for entry in self.entries}


@dataclass(frozen=True, slots=True)
class Recall:
    """A remembered profile judged at one instant: its age (s), n_eff, whether it may be used, why not.

    `acceptance` is the aged profile in the estimator's shape (intervals widened), present only when usable.
    """

    entry: RememberedAcceptance
    age_s: float
    effective_drafts: float
    usable: bool
    why_not: str = ""
    acceptance: AcceptanceEvidence | None = None

    def describe(self) -> str:
        """A short phrase for a decision's reason.

        Example: "remembered acceptance from 12 min ago (k=3, 9000 drafts, aged to 1260 effective)".
        """
        head = f"remembered acceptance from {format_age(self.age_s)} ago (k={self.entry.k}, "
        head += f"{self.entry.drafts:.0f} drafts, aged to {self.effective_drafts:.0f} effective)"
        return head if self.usable else f"{head} not used: {self.why_not}"


def format_age(age_s: float) -> str:
    """Seconds as a short human age. Example: 42 -> "42 s", 720 -> "12 min", 25200 -> "7.0 h"."""
    if age_s < 120:
        return f"{age_s:.0f} s"
    if age_s < 7200:
        return f"{age_s / 60:.0f} min"
    return f"{age_s / 3600:.1f} h"


def remember(
    memory: AcceptanceMemory, evidence: Evidence, *, config: MemoryConfig, now_s: float
) -> AcceptanceMemory:
    """The memory after seeing `evidence` at `now_s` (Unix seconds); the same object when nothing is learnt.

    Remembered only: evidence state ok, speculation on, acceptance with k >= 1 positions and at least
    `config.min_drafts` drafts. A cold start (lifetime counters, possibly days old) replaces an existing profile
    only when that one is a cold start too or is no longer usable at `now_s`: a real window is better evidence.

    Example: memory empty, ok evidence at k=3 with 900 drafts, r = (0.8, 0.6, 0.45) -> one entry for the model
    with those r, drafts 900, measured_at_s = evidence.at_s. The same evidence with 150 drafts -> unchanged (150
    < 200).
    """
    acceptance = evidence.acceptance
    if (
        evidence.state is not DataState.OK
        or not evidence.speculation_on
        or not evidence.model
        or acceptance is None
        or not acceptance.per_position
        or acceptance.drafts < config.min_drafts
    ):
        return memory
    if acceptance.cold_start:
        known = memory.get(evidence.model)
        if known is not None and not known.cold_start and recall(known, config=config, now_s=now_s).usable:
            return memory
    k = len(acceptance.per_position)
    low = acceptance.per_position_low if len(acceptance.per_position_low) == k else acceptance.per_position
    high = acceptance.per_position_high if len(acceptance.per_position_high) == k else acceptance.per_position
    entry = RememberedAcceptance(
        model=evidence.model,
        per_position=tuple(acceptance.per_position),
        per_position_low=tuple(low),
        per_position_high=tuple(high),
        drafts=acceptance.drafts,
        mean_proposed_length=acceptance.mean_proposed_length,
        measured_at_s=evidence.at_s,
        cold_start=acceptance.cold_start,
        draft_coverage=acceptance.draft_coverage,
        positions_measured=acceptance.positions_measured,
    )
    return memory.with_entry(entry)


def effective_drafts(entry: RememberedAcceptance, *, config: MemoryConfig, now_s: float) -> float:
    """n_eff = min(drafts, max_effective_drafts) x 2^(-age / half_life_s), age = now_s - measured_at_s >= 0.

    Units: drafts (verifications); seconds. Example (defaults): 9000 drafts, 3600 s old -> 2000 / 4 = 500.
    """
    age_s = max(0.0, now_s - entry.measured_at_s)
    decay: float = 0.5 ** (age_s / config.half_life_s)
    return min(entry.drafts, config.max_effective_drafts) * decay


def recall(entry: RememberedAcceptance, *, config: MemoryConfig, now_s: float) -> Recall:
    """Judge `entry` at `now_s` (Unix seconds): usable or not, and its aged acceptance (module docstring).

    Each position's interval is Wilson(r_i x n_eff, n_eff) at `config.z`, widened to contain the measured one;
    E[L] = 1 + sum r_i and the acceptance rate sum r_i / mean proposed are recomputed from the kept r_i.

    Example (defaults): r_1 = 0.8 over 9000 drafts, 3600 s old -> usable, n_eff 500, r_1 in about
    (0.7627, 0.8327); the same 7 h old -> unusable, "7.0 h old, past the 6.0 h limit".
    """
    age_s = max(0.0, now_s - entry.measured_at_s)
    n_eff = effective_drafts(entry, config=config, now_s=now_s)
    if age_s > config.max_age_s:
        why = f"{format_age(age_s)} old, past the {format_age(config.max_age_s)} limit"
        return Recall(entry=entry, age_s=age_s, effective_drafts=n_eff, usable=False, why_not=why)
    if n_eff < config.min_effective_drafts or not entry.per_position:
        why = f"aged to {n_eff:.0f} effective drafts, below {config.min_effective_drafts:.0f}"
        return Recall(entry=entry, age_s=age_s, effective_drafts=n_eff, usable=False, why_not=why)
    lows: list[float] = []
    highs: list[float] = []
    for r, measured_low, measured_high in zip(
        entry.per_position, entry.per_position_low, entry.per_position_high, strict=True
    ):
        p = min(max(r, 0.0), 1.0)
        low, high = wilson_interval(p * n_eff, n_eff, z=config.z)
        lows.append(min(low, measured_low, p))
        highs.append(max(high, measured_high, p))
    total = sum(entry.per_position)
    proposed = entry.mean_proposed_length if entry.mean_proposed_length > 0 else float(entry.k)
    aged = AcceptanceEvidence(
        per_position=entry.per_position,
        per_position_low=tuple(lows),
        per_position_high=tuple(highs),
        drafts=n_eff,
        draft_tokens=n_eff * proposed,
        accepted_tokens=n_eff * total,
        mean_acceptance_length=1.0 + total,
        acceptance_rate=min(1.0, total / proposed),
        mean_proposed_length=proposed,
        window_s=age_s,
        cold_start=entry.cold_start,
        draft_coverage=entry.draft_coverage,
        positions_measured=entry.positions_measured,
    )
    return Recall(entry=entry, age_s=age_s, effective_drafts=n_eff, usable=True, acceptance=aged)


@dataclass(frozen=True, slots=True)
class AcceptanceInUse:
    """The acceptance a tick's curve is priced from, beside the evidence (which always says what was measured).

    `acceptance`: the window's own when the estimator trusts it, a usable remembered profile while off or for a
    thin window while on, else the window's own (None while off: the method prior prices the curve).
    `stands_in`: a remembered profile stands in for a thin window (insufficient_data while speculating), so the
    tick is decided on as on ok evidence. `recalled`: the remembered profile judged now, usable or not (None when
    none was consulted). `note`: what the reason says about it ("" when the window's own is used).
    """

    acceptance: AcceptanceEvidence | None
    stands_in: bool = False
    recalled: Recall | None = None
    note: str = ""


def acceptance_in_use(
    evidence: Evidence, memory: AcceptanceMemory, *, config: MemoryConfig, now_s: float
) -> AcceptanceInUse:
    """Which acceptance prices the curve (`AcceptanceInUse`). Live acceptance wins whenever the estimator trusts it;
    otherwise (ok while off, or insufficient_data while on) a usable remembered profile of the model stands in; an
    unusable one is only named, and the prior prices the curve.

    Example: off, a profile remembered 12 min ago over 9000 drafts -> its aged acceptance, note "acceptance:
    remembered acceptance from 12 min ago (k=3, 9000 drafts, aged to 1516 effective)"; on with 40 drafts in the
    window (insufficient_data) -> the same profile with `stands_in` True; ok while on -> the window's own.
    """
    live = AcceptanceInUse(acceptance=evidence.acceptance)
    off = evidence.state is DataState.OK and not evidence.speculation_on
    thin = evidence.state is DataState.INSUFFICIENT_DATA and evidence.speculation_on
    entry = memory.get(evidence.model) if (off or thin) and evidence.model else None
    if entry is None:
        return live
    recalled = recall(entry, config=config, now_s=now_s)
    if not recalled.usable or recalled.acceptance is None:
        note = f"acceptance: {recalled.describe()}; priced from the drafter's prior"
        return AcceptanceInUse(acceptance=evidence.acceptance, recalled=recalled, note=note)
    note = f"acceptance: {recalled.describe()}"
    if thin:
        # The window's own drafts are too few to trust; the remembered profile is the better evidence until the
        # window fills (then live evidence replaces the memory).
        note += f" in place of a thin live window ({' '.join(evidence.reason.split())})"
    return AcceptanceInUse(acceptance=recalled.acceptance, stands_in=thin, recalled=recalled, note=note)
