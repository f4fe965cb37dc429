"""The hindsight oracle: the best gamma over time found by running the simulated world itself, an upper bound on
every static policy the benchmark runs (and, started from the deployed k, on the advisor) by construction.

It is a rollout (Bertsekas' rollout algorithm) over the real world with common random numbers. The world is
deterministic given the decisions made in it: arrivals come from their own random stream, and a copy of the world
(`copy.deepcopy`, random states included) continues exactly as the original would under the same decisions
(`tests/unit/test_hindsight.py` checks both). So "what would gamma g have delivered from here to the end" has an
exact answer: copy the world, switch it to g, run it to the end, and count what the headline counts.

The oracle starts configured as the best static run (the highest headline of the fixed-gamma, always-on and
threshold runs, started configured like them), or at the gamma from which following the steady-state planner's
plan does better (`planned_start`). Started from the deployed k (below), it may also start as the replay of a
policy's own run (`replayed_start`: the advisor's, its change times added as boundaries). A threshold start keeps
its `disable_by_batch_size` for the whole run: every gamma it then runs is "g with that threshold". At every
segment boundary t (every `segment_s`, a multiple of the decision tick) it compares

    continue:  the run it committed to at the last boundary, from here;
    g, then b: every gamma in 0..max(gamma_max, deployed k) run from t (a change pays the restart or rolling
               update the scenario says: dropped requests, lost arrivals, the outage), then at each later
               boundary the base policy b: `hold` (keep it to the end) or the steady-state planner's plan
               (`steady_state.py`, which lets a candidate move now and move again when the load does),

each valued as V = the scenario's headline (`accounting.Objective`: goodput, SLO goodput, or latency at a
throughput floor) of the whole run it would make: the requests finished before t, those the candidate finishes
by the end, and those still in flight at the end, as far as they got (`accounting.summarize`, the table's own
figures). It commits to the best candidate when that beats continuing by more than `SWITCH_MARGIN` of
continuing's value, and otherwise continues.

Why it bounds the static runs: at each boundary the run it commits to is worth at least V(continue) (continuing
is a candidate and the world is deterministic, so the run that follows is exactly the one valued), and
V(continue) is the value of the run committed to at the previous boundary. So the final headline is at least
V(continue) at the first boundary: the headline of the run it started with, the best static run's or, with a
planned start, more. Worked example
(goodput, always-off best at 3000 tokens/s over 600 s): at t = 300 s continuing is worth 3000 tokens/s; if
switching to gamma 1 then is worth 3060 (its second half 2% faster than off's, the restart paid), the run commits
to it and ends at 3060 >= 3000.

Started from the deployed k instead (`suite.ORACLE_DEPLOYED`, with one more boundary at the first decision
tick, `decide_first_at`), the same rollout is what a policy that starts where the advisor starts could reach: it
starts as holding the deployed k or, where worth at least as much, as the advisor's run replayed
(`replayed_start`), so it ends at or above both (always-on, or always-off where the deployment is off; the
advisor, with and without the actuator). What it gives up against the oracle is the change out of a
wrong deployed setting (the restart the best static run never pays), and the starts the oracle may take that no
change reaches (a batch threshold, a planned start). It may beat the oracle (its first boundary comes 5 s in, the
oracle's one segment in): the best known policy is then this run.

What it bounds: every run it may start as: every static run, and from the deployed k every replayed policy (a
replay is the policy's own run: the same changes at the same times in a deterministic world). What it does not
bound: a policy it was not given to replay that acts between its segment boundaries or moves where neither
holding nor the planner's plan does. The bench reports a policy above both oracles as a yardstick defect
(`report.py`), never as the advisor's win.

Cost: at each of D / segment_s boundaries (and each replayed change), 2 x (gamma_max + 1) simulated runs of the
rest of the run, i.e.
(gamma_max + 1) x D^2 / segment_s simulated seconds: a 1200 s scenario with gamma 0..5 and 60 s segments
simulates ~140 k seconds (one to three minutes on one core). The run from the deployed k costs as much again, and
its replays one run each from the start and 2 x (gamma_max + 1) runs at each replayed change.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.bench.accounting import Objective, summarize
from service.sim.world import Completion, World

# A switch must beat holding by this share of holding's value (0.1%): what a restart buys less than that is left
# alone, so a tie between gammas does not show up as a "crossing" the advisor is graded against.
SWITCH_MARGIN = 0.001


# A base policy: the gamma to run from a boundary on (time in the world's seconds) given what runs; "hold" keeps it.
BasePolicy = Callable[[float, int], int]


def hold(_t_s: float, k: int) -> int:
    return k


@dataclass(frozen=True, slots=True)
class Schedule:
    """A run's k over time, to replay: `initial_k` from the start, then each (time in the world's seconds, k) change
    in order. Example: Schedule(3, ((t0 + 130, 0),)) runs k=3, then off from 130 s in."""

    initial_k: int
    changes: tuple[tuple[float, int], ...] = ()

    def k_at(self, t_s: float, _k: int = 0) -> int:
        """The k the run was configured with at `t_s` (a change at exactly `t_s` included): a BasePolicy."""
        k = self.initial_k
        for at, after in self.changes:
            if at <= t_s + 1e-6:
                k = after
        return k


@dataclass(frozen=True, slots=True)
class Future:
    """What a run delivers from a boundary on: the requests it finishes, then those in flight at the end, and the
    output tokens of every request the run dropped from its start to its end (`LifetimeStats.lost_tokens`)."""

    completions: tuple[Completion, ...]
    lost_tokens: int

    def after(self, done: int) -> Future:
        """The same future once its first `done` completions have happened."""
        return Future(self.completions[done:], self.lost_tokens)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One option at a boundary: the gamma to run now, the base policy after it, and what that run delivers."""

    k: int
    base: BasePolicy
    value: float
    future: Future


def beats(value: float, reference: float) -> bool:
    """Whether `value` beats `reference` by more than SWITCH_MARGIN of its size (headlines may be negative: errors
    count against them)."""
    return value > reference + abs(reference) * SWITCH_MARGIN


def future_of(world: World, k: int, *, now_s: float, end_s: float, base: BasePolicy = hold,
              boundaries: Sequence[float] = ()) -> Future:
    """What the world delivers from `now_s` to `end_s` when switched to k at `now_s` and run by `base` at each of
    the later `boundaries`. The world itself is not touched."""
    fork = copy.deepcopy(world)
    fork.drain_completions()  # finished before now: already counted by the run
    fork.set_speculation(k, now_s=now_s)
    done: list[Completion] = []
    for t in boundaries:
        if now_s < t < end_s:
            fork.advance_to(t)
            done.extend(fork.drain_completions())
            fork.set_speculation(base(t, fork.num_speculative_tokens), now_s=t)
    fork.advance_to(end_s)
    return Future((*done, *fork.drain_completions(), *fork.in_flight()), fork.lifetime.lost_tokens)


class HindsightOracle:
    """Controller: at each segment boundary, the best of continuing and of switching to each gamma under each base
    policy, each run to the end."""

    def __init__(self, *, start_s: float, end_s: float, segment_s: float, gammas: Sequence[int],
                 objective: Objective, plan: BasePolicy | None = None) -> None:
        if segment_s <= 0:
            raise ValueError(f"segment_s must be > 0, got {segment_s}")
        self._start_s = start_s
        self._end_s = end_s
        self._segment_s = segment_s
        self._gammas = tuple(sorted(set(gammas)))
        self._objective = objective
        self._bases: tuple[BasePolicy, ...] = (hold,) if plan is None else (hold, plan)
        count = round((end_s - start_s) / segment_s)
        self._first_s: float | None = None
        self._boundaries = tuple(start_s + i * segment_s for i in range(1, count + 1))
        self._extra: tuple[float, ...] = ()  # boundaries off the segment grid: the replayed runs' change times
        self._past: list[Completion] = []  # finished before the current tick, as the runner drains them
        self._chosen: Candidate | None = None  # what was committed to at the last boundary
        self._completed_at_boundary = 0
        # Per boundary: (time into the run, the value of continuing, the value committed to); each value
        # committed to is the next boundary's value of continuing (the world is deterministic).
        self.log: list[tuple[float, float, float]] = []

    def decide_first_at(self, t_s: float) -> None:
        """One more boundary at `t_s` (strictly between the start and the first segment boundary; before the run):
        the first decision tick, so a run started from a setting no static run chose can leave it as early as any
        policy could (`suite.ORACLE_DEPLOYED`)."""
        if not self._start_s < t_s < min(self._start_s + self._segment_s, self._end_s):
            raise ValueError(f"the first boundary must lie between the start and the first segment's end, got {t_s}")
        if self._first_s is not None or self.log:
            raise ValueError("the first boundary is set once, before the run")
        self._first_s = t_s
        self._boundaries = tuple(sorted({t_s, *self._boundaries}))

    def replayed_start(self, world_at: Callable[[int], World], schedules: Sequence[Schedule], *,
                       static_value: float) -> int | None:
        """Make the bound hold for the bench's own dynamic policies too: each `schedules` entry (a policy's run,
        k over time) is replayed from its start, its change times added as boundaries, and the oracle starts as the
        best of them when it is worth at least `static_value` (what it would start as otherwise: a start is not a
        crossing, so no margin, and the bound is exact). Call it after `decide_first_at` and before the run (the
        boundaries every future is computed on must not change after), not with `planned_start` (which would
        replace it). Returns the replay's initial k, or None when every replay is worth less (the boundaries are
        then left as they were).

        A replayed run is the policy's own run (the world is deterministic given the changes, made at the same
        times), so the oracle ends at or above every policy replayed. Example: an advisor that moved k=1 -> 4 at
        395 s, between the 360 s and 420 s boundaries, scored 1.006 x a rollout that could only move at 360 or
        420 s; the rollout that may start as that replay ends at or above it."""
        if self.log or self._chosen is not None:
            raise ValueError("replayed starts are set before any other start and before the run")
        extra = {round(at, 6) for schedule in schedules for at, _ in schedule.changes
                 if self._start_s < at < self._end_s}
        before = self._boundaries
        self._extra = tuple(sorted(extra - {round(b, 6) for b in before}))
        self._boundaries = tuple(sorted({*before, *self._extra}))
        best: Candidate | None = None
        for schedule in schedules:
            future = future_of(world_at(schedule.initial_k), schedule.initial_k, now_s=self._start_s,
                               end_s=self._end_s, base=schedule.k_at, boundaries=self._boundaries)
            value = self._value(future)  # a start is not a crossing: no margin, so the bound is exact
            if value >= static_value and (best is None or value > best.value):
                best = Candidate(schedule.initial_k, schedule.k_at, value, future)
        if best is None:
            self._boundaries, self._extra = before, ()
            return None
        self._chosen = best
        self._completed_at_boundary = 0
        self.log.append((0.0, static_value, best.value))
        return best.k

    def planned_start(self, world_at: Callable[[int], World], *, static_value: float) -> int | None:
        """The gamma to start at when starting there and following the planner's plan from the first boundary beats
        the best static run (`static_value`, its headline) by more than the margin; None otherwise. `world_at(k)`
        builds the world deployed at k at the start. The oracle then continues that run."""
        if len(self._bases) < 2:
            return None
        plan = self._bases[1]
        best: Candidate | None = None
        for k in self._gammas:
            world = world_at(k)
            future = future_of(world, k, now_s=self._start_s, end_s=self._end_s, base=plan,
                               boundaries=self._boundaries)
            value = self._value(future)
            if beats(value, static_value) and (best is None or value > best.value):
                best = Candidate(k, plan, value, future)
        if best is not None:
            self._chosen = best
            self._completed_at_boundary = 0
            self.log.append((0.0, static_value, best.value))
        return None if best is None else best.k

    @property
    def end_s(self) -> float:
        return self._end_s

    def value_of(self, future: Future) -> float:
        """The headline of a run from the start that delivers `future` (before the run: nothing has finished)."""
        return self._value(future)

    def _value(self, future: Future) -> float:
        """The headline of the whole run: what finished before now, then `future`, and the requests it dropped."""
        metrics = summarize([*self._past, *future.completions], duration_s=self._end_s - self._start_s,
                            itl_slo_s=self._objective.itl_slo_s, error_tokens=future.lost_tokens)
        return self._objective.score(metrics)

    def _at_boundary(self, now_s: float) -> bool:
        if self._first_s is not None and abs(now_s - self._first_s) < 1e-6:
            return True
        if any(abs(now_s - at) < 1e-6 for at in self._extra):
            return True
        segments = (now_s - self._start_s) / self._segment_s
        return abs(segments - round(segments)) < 1e-6 and now_s < self._end_s - 1e-9

    async def choose(self, world: World, now_s: float) -> int:
        current = world.num_speculative_tokens
        at_boundary = self._at_boundary(now_s)
        continuing = self._continuing(world, current, now_s) if at_boundary else None
        self._past.extend(world.undrained_completions())  # the runner drains them after this call
        if continuing is None:
            return current
        k_now, base, future = continuing
        floor = self._value(future)
        best = Candidate(k_now, base, floor, future)
        for k in self._gammas:
            for other in self._bases:
                if k == k_now and other is base:
                    continue
                future = future_of(world, k, now_s=now_s, end_s=self._end_s, base=other,
                                   boundaries=self._boundaries)
                value = self._value(future)
                if value > best.value and beats(value, floor):
                    best = Candidate(k, other, value, future)
        self.log.append((now_s - self._start_s, floor, best.value))
        self._chosen = best
        self._completed_at_boundary = world.lifetime.completed_requests
        return best.k

    def _continuing(self, world: World, current: int, now_s: float) -> tuple[int, BasePolicy, Future]:
        """The run committed to at the last boundary, from here: the gamma its base policy runs now and the rest of
        the future computed then (the world has since run exactly its first part: determinism); on the first
        boundary, holding what runs, run afresh."""
        chosen = self._chosen
        if chosen is None:
            return current, hold, future_of(world, current, now_s=now_s, end_s=self._end_s)
        done_since = world.lifetime.completed_requests - self._completed_at_boundary
        return chosen.base(now_s, current), chosen.base, chosen.future.after(done_since)
