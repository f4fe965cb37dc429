"""The hindsight oracle: the best gamma over time found by running the simulated world itself, an upper bound on
every static policy the benchmark runs by construction.

It is a rollout (Bertsekas' rollout algorithm) over the real world with common random numbers. The world is
deterministic given the decisions made in it: arrivals come from their own random stream, and a copy of the world
(`copy.deepcopy`, random states included) continues exactly as the original would under the same decisions
(`tests/unit/test_hindsight.py` checks both). So "what would gamma g have delivered from here to the end" has an
exact answer: copy the world, switch it to g, run it to the end, and count what the headline counts.

The oracle starts configured as the best static run (the highest headline of the fixed-gamma and threshold runs,
started configured like them). At every segment boundary t (every `segment_s`, a multiple of the decision tick)
it compares

    hold:      the configuration running now, kept to the end of the run;
    switch g:  every other gamma in 0..gamma_max, switched to at t (paying the restart or rolling update the
               scenario says: dropped requests, lost arrivals, the outage) and kept to the end,

each valued as V = the scenario's headline (`accounting.Objective`: goodput, SLO goodput, or latency at a
throughput floor) of the whole run it would make: the requests finished before t, those the candidate finishes
by the end, and those still in flight at the end, as far as they got (`accounting.summarize`, the table's own
figures). It switches to the best candidate when that beats hold by more than `SWITCH_MARGIN` of hold's value,
and otherwise holds.

Why it bounds the static runs: at each boundary the run it commits to is worth at least V(hold) (hold is a
candidate and the world is deterministic, so the run that follows is exactly the one valued), and V(hold) at a
boundary is the value of the run committed to at the previous one. So the final headline is at least V(hold) at
the first boundary, the best static run's own headline. Worked example (goodput, always-off best at 3000
tokens/s over 600 s): at t = 300 s holding is worth 3000 tokens/s; if switching to gamma 1 then is worth 3060
(its second half 2% faster than off's, the restart paid), the run commits to it and ends at 3060 >= 3000.

What it does not bound: a policy that acts between its segment boundaries (an advisor can move up to
`segment_s` earlier), or one that switches back and forth within a horizon where "switch and keep" looks worse
than holding. The bench reports a policy above the oracle as a yardstick defect (`report.py`), never as the
advisor's win.

Cost: at each of D / segment_s boundaries, gamma_max simulated runs of the rest of the run, i.e.
gamma_max x D^2 / (2 x segment_s) simulated seconds: a 1200 s scenario with gamma 0..5 and 30 s segments
simulates ~120 k seconds (~ 60-150 s of CPU on one core).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from service.bench.accounting import Objective, summarize
from service.sim.world import Completion, World

# A switch must beat holding by this share of holding's value (0.1%): what a restart buys less than that is left
# alone, so a tie between gammas does not show up as a "crossing" the advisor is graded against.
SWITCH_MARGIN = 0.001


@dataclass(frozen=True, slots=True)
class Candidate:
    """One option at a boundary: the gamma it runs and what it delivers to the end of the run."""

    k: int
    value: float
    future: tuple[Completion, ...]


def future_of(world: World, k: int, *, now_s: float, end_s: float) -> tuple[Completion, ...]:
    """What the world delivers from `now_s` to `end_s` when switched to k at `now_s`: the completions after the
    copy, then the in-flight requests at the end. The world itself is not touched."""
    fork = copy.deepcopy(world)
    fork.drain_completions()  # finished before now: already counted by the run
    fork.set_speculation(k, now_s=now_s)
    fork.advance_to(end_s)
    return fork.drain_completions() + fork.in_flight()


class HindsightOracle:
    """Controller: at each segment boundary, the best of holding and switching to each gamma, run to the end."""

    def __init__(self, *, start_s: float, end_s: float, segment_s: float, gammas: Sequence[int],
                 objective: Objective) -> None:
        if segment_s <= 0:
            raise ValueError(f"segment_s must be > 0, got {segment_s}")
        self._start_s = start_s
        self._end_s = end_s
        self._segment_s = segment_s
        self._gammas = tuple(sorted(set(gammas)))
        self._objective = objective
        self._past: list[Completion] = []  # finished before the current tick, as the runner drains them
        self._hold: tuple[Completion, ...] | None = None  # the running choice's future from the last boundary
        self._completed_at_boundary = 0
        self.switches: list[tuple[float, int, float]] = []  # (time into the run, new k, gain over holding)

    def _value(self, future: Sequence[Completion]) -> float:
        """The headline of the whole run: what finished before now, then `future`."""
        metrics = summarize([*self._past, *future], duration_s=self._end_s - self._start_s,
                            itl_slo_s=self._objective.itl_slo_s)
        return self._objective.score(metrics)

    def _at_boundary(self, now_s: float) -> bool:
        segments = (now_s - self._start_s) / self._segment_s
        return abs(segments - round(segments)) < 1e-6 and now_s < self._end_s - 1e-9

    async def choose(self, world: World, now_s: float) -> int:
        current = world.num_speculative_tokens
        at_boundary = self._at_boundary(now_s)
        hold = self._hold_future(world, current, now_s) if at_boundary else ()
        self._past.extend(world.undrained_completions())  # the runner drains them after this call
        if not at_boundary:
            return current
        hold_value = self._value(hold)
        best = Candidate(current, hold_value, hold)
        for k in self._gammas:
            if k == current:
                continue
            future = future_of(world, k, now_s=now_s, end_s=self._end_s)
            value = self._value(future)
            if value > best.value and value > hold_value * (1.0 + SWITCH_MARGIN):
                best = Candidate(k, value, future)
        if best.k != current:
            self.switches.append((now_s - self._start_s, best.k, best.value / max(hold_value, 1e-12) - 1.0))
        self._hold = best.future
        self._completed_at_boundary = world.lifetime.completed_requests
        return best.k

    def _hold_future(self, world: World, current: int, now_s: float) -> tuple[Completion, ...]:
        """Holding's future: the rest of the future computed at the last boundary (the world has since run exactly
        its first part: determinism), or a fresh run on the first boundary."""
        if self._hold is None:
            return future_of(world, current, now_s=now_s, end_s=self._end_s)
        done_since = world.lifetime.completed_requests - self._completed_at_boundary
        return self._hold[done_since:]
