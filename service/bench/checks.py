"""Per-tick decision-quality checks of a run against the oracle's run (docs/bench.md, "Quality checks").

Inputs are the k each policy had configured after each decision tick (tick i at (i + 1) x interval) and the
steady-state planner's true utility u(interval, gamma) (each gamma's steady-state score over the best gamma's,
0..1; see `service.bench.steady_state`), so every check is a pure function of k sequences, u, and when the load
was steady.

- crossings: ticks where the oracle's choice changes (a load shift or drift across a crossover, as the true physics
  sees it). The lag of a crossing is the time from it until the advisor's choice agrees with the oracle's: its
  true utility is within `AGREE_MARGIN` of the oracle's choice (a gamma as good as the oracle's counts; a
  near-tie is not a disagreement). A crossing the advisor never matches before the next one (or the end) is missed.
- wrong spells: runs of consecutive ticks in which the advisor's choice is worse than the oracle's (it does not
  agree, as above), whatever the oracle did. A crossing's lag starts when the oracle changes; an oracle that knows
  the future moves before the load does (slo-load-rise: at 295 s, while gamma 3 was still as good), and the
  advisor's later 90 s at the wrong gamma under the risen load had no crossing to be late for. The spell that
  starts at the first tick is left out: it is the correction of the deployed k, which /best grades.
- flaps: consecutive changes closer together than the advisor's dwell period (more than one change per dwell).
- steady changes: changes while load and acceptance were steady that made nothing truly better: not onto the
  oracle's own choice at that tick, not raising the policy's true utility by at least `AGREE_MARGIN` (averaged
  over the advisor's payback horizon when a change costs a restart: a move made in a light spell for the heavy
  phases it has seen, when a restart drops almost nothing, is judged on the phases that follow), and not
  cutting its true inter-token latency by `AGREE_MARGIN` (relative) without lowering its utility. Corrections
  towards the oracle do not count (a move onto the oracle's gamma is one even when the utility says the two
  were nearly tied), nor does a real latency gain the goodput headline does not count (without an SLO the
  utility values latency only as a tie-breaker; the table's `/oracle` still charges such a change its
  restart). Changes driven by noise in the measurements, which make nothing truly better, do count.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Two choices whose true utilities are within this of each other are equally right (2%: the advisor's default
# decide.margin, and about the step-time jitter of a decision window).
AGREE_MARGIN = 0.02

# utility(interval index, gamma) -> 0..1, the oracle's normalised true score.
Utility = Callable[[int, int], float]


@dataclass(frozen=True, slots=True)
class Crossing:
    """One oracle on/off change: when (seconds into the run) and how long until the advisor agreed (None: never
    before the next crossing or the end of the run)."""

    t_s: float
    lag_s: float | None


@dataclass(frozen=True, slots=True)
class QualityChecks:
    """The advisor's per-tick checks for one scenario (see the module docstring)."""

    crossings: tuple[Crossing, ...]
    window_s: float  # one decision window: the unit lags are reported in
    flaps: int
    steady_changes: int
    worst_wrong_spell_s: float = 0.0  # the longest wrong spell after the first tick's (module docstring)

    @property
    def worst_lag_windows(self) -> float | None:
        """The longest lag or wrong spell in decision windows; inf when a crossing was missed, None without either."""
        lags = [float("inf") if c.lag_s is None else c.lag_s / self.window_s for c in self.crossings]
        if self.worst_wrong_spell_s > 0:
            lags.append(self.worst_wrong_spell_s / self.window_s)
        return max(lags) if lags else None


def change_ticks(initial_k: int, ks: Sequence[int]) -> list[int]:
    """Indices of the ticks at which k differs from the tick before (tick 0 compares with `initial_k`)."""
    previous = initial_k
    out = []
    for i, k in enumerate(ks):
        if k != previous:
            out.append(i)
        previous = k
    return out


def agrees(utility: Utility, tick: int, k: int, oracle_k: int) -> bool:
    """Whether k is as good as the oracle's choice at `tick` (decided at its end, so judged on the next interval)."""
    return utility(tick + 1, k) >= utility(tick + 1, oracle_k) - AGREE_MARGIN


def worst_wrong_spell_s(policy_k: Sequence[int], oracle_k: Sequence[int], *, interval_s: float,
                        utility: Utility) -> float:
    """The longest run of ticks (s) in which the policy does not agree with the oracle, leaving out a run that
    starts at the first tick (module docstring). 0.0 when it always agrees."""
    n = min(len(policy_k), len(oracle_k))
    worst = run = 0
    opening = True  # still in the spell that began at the first tick
    for i in range(n):
        if agrees(utility, i, policy_k[i], oracle_k[i]):
            run, opening = 0, False
            continue
        run += 1
        if not opening:
            worst = max(worst, run)
    return worst * interval_s


def crossing_lags(policy_k: Sequence[int], oracle_k: Sequence[int], *, oracle_initial_k: int, interval_s: float,
                  utility: Utility) -> tuple[Crossing, ...]:
    """Each change of the oracle's choice and the policy's lag to agree with it (module docstring)."""
    n = min(len(policy_k), len(oracle_k))
    flips = change_ticks(oracle_initial_k, oracle_k[:n])
    out = []
    for j, start in enumerate(flips):
        end = flips[j + 1] if j + 1 < len(flips) else n
        lag = next(((i - start) * interval_s for i in range(start, end)
                    if agrees(utility, i, policy_k[i], oracle_k[i])), None)
        out.append(Crossing(t_s=(start + 1) * interval_s, lag_s=lag))
    return tuple(out)


def flaps(change_times_s: Sequence[float], *, dwell_s: float) -> int:
    """Changes that came less than `dwell_s` after the previous change."""
    return sum(1 for a, b in itertools.pairwise(change_times_s) if b - a < dwell_s)


@dataclass(frozen=True, slots=True)
class Truth:
    """What a change is judged on: the true utility `utility(interval, gamma)` (0..1), the true inter-token latency
    `itl_s(interval, gamma)` (s; None: not judged on latency), and the payback horizon in ticks (>= 1) the utility
    is averaged over."""

    utility: Utility
    itl_s: Utility | None = None
    horizon_ticks: int = 1


def steady_changes(policy_k: Sequence[int], steady: Sequence[bool], *, initial_k: int, truth: Truth,
                   oracle_k: Sequence[int] | None = None) -> int:
    """Changes at steady ticks that made nothing truly better (module docstring): not onto `oracle_k` at that
    tick (when given) and not `truly_better` by `truth`."""
    count = 0
    for i in change_ticks(initial_k, policy_k):
        if i >= len(steady) or not steady[i]:
            continue
        if oracle_k is not None and i < len(oracle_k) and policy_k[i] == oracle_k[i]:
            continue
        before = policy_k[i - 1] if i else initial_k
        if not truly_better(truth, i, before, policy_k[i], ticks=len(policy_k)):
            count += 1
    return count


def truly_better(truth: Truth, tick: int, before: int, after: int, *, ticks: int) -> bool:
    """Whether changing gamma `before` -> `after` at `tick` (of a run of `ticks`) raised the true utility, averaged
    over the next `truth.horizon_ticks` intervals (the run's end cuts it), by AGREE_MARGIN, or cut the true ITL of
    the next interval by AGREE_MARGIN (relative) at no loss of that utility."""
    span = range(tick + 1, max(tick + 2, min(tick + 1 + max(1, truth.horizon_ticks), ticks + 1)))
    u_before = sum(truth.utility(j, before) for j in span) / len(span)
    u_after = sum(truth.utility(j, after) for j in span) / len(span)
    if u_after >= u_before + AGREE_MARGIN:
        return True
    itl_s = truth.itl_s
    return itl_s is not None and u_after >= u_before and itl_s(tick + 1, after) <= itl_s(tick + 1, before) * (
        1.0 - AGREE_MARGIN
    )


def steady_ticks(rates: Sequence[float], acceptances: Sequence[float], *, interval_s: float, span_s: float,
                 rate_tolerance: float = 0.1, acceptance_tolerance: float = 0.02) -> list[bool]:
    """Whether, at each tick, the true arrival rate stayed within +-`rate_tolerance` (relative) of its current
    value and the true first-position acceptance within +-`acceptance_tolerance` over the last `span_s`."""
    back = max(1, round(span_s / interval_s))
    out = []
    for i, (rate, acc) in enumerate(zip(rates, acceptances, strict=True)):
        lo = max(0, i - back)
        out.append(
            all(abs(r - rate) <= rate_tolerance * max(rate, 1e-9) for r in rates[lo:i + 1])
            and all(abs(a - acc) <= acceptance_tolerance for a in acceptances[lo:i + 1])
        )
    return out
