"""The oracle: the best gamma at every decision tick from the world's TRUE physics, paying for each change.

It knows what no advisor can: the true conditional acceptance now, the true step-time function
(`service.sim.physics`), and the arrival rate now and over the coming `horizon_s` (the scenario's profile). For
each gamma it predicts the steady state the engine would settle into at each future arrival rate (Little's law:
batch B = rate x output tokens x ITL(B), solved by fixed-point iteration, capped at max_num_seqs), and scores it by

    score(gamma) = served fraction x (1 / ITL)        served fraction = min(1, capacity / offered tokens/s)

i.e. per-sequence speed while the server keeps up, and the share of the offered load it can carry once it cannot
(with an ITL SLO, options that miss it score by served fraction x 1/ITL x 0.5, so meeting the SLO dominates).
The score is averaged over the horizon; the oracle switches only when the relative gain over the horizon pays
the restart: gain x horizon_s > restart_delay_s x (1 + in-flight share), where the in-flight share counts the
requests a restart drops. Greedy with lookahead, not a dynamic program: a good policy may tie or edge past it;
the report shows such ratios as they are.
"""

from __future__ import annotations

import math

from service.sim.physics import (
    acceptance_at,
    arrival_rate_at,
    expected_step_time_s,
    expected_tokens_per_verification,
)
from service.sim.scenario import FixedLength, LengthDistribution, LogNormalLength, Scenario
from service.sim.world import World

HORIZON_SAMPLES = 8
_FIXED_POINT_ITERATIONS = 30


def mean_length(dist: LengthDistribution) -> float:
    """Mean of a request-length distribution (log-normal: the unclipped mean median x exp(sigma^2 / 2), clipped)."""
    if isinstance(dist, FixedLength):
        return float(dist.tokens)
    if isinstance(dist, LogNormalLength):
        mean = dist.median_tokens * math.exp(dist.sigma**2 / 2)
        return min(float(dist.max_tokens), max(float(dist.min_tokens), mean))
    return (dist.min_tokens + dist.max_tokens) / 2


class Oracle:
    """Controller that knows the truth; `start_s` is the world's start (scenario times are relative to it)."""

    def __init__(self, scenario: Scenario, *, start_s: float, gamma_max: int, horizon_s: float,
                 itl_slo_s: float | None) -> None:
        self._s = scenario
        self._start_s = start_s
        self._gamma_max = gamma_max
        self._horizon_s = horizon_s
        self._slo = itl_slo_s
        self._out = mean_length(scenario.workload.output_tokens)
        self._prompt = mean_length(scenario.workload.prompt_tokens)

    def _itl(self, gamma: int, batch: float, ctx: float, acceptance: tuple[float, ...]) -> float:
        seqs = max(1, round(batch))
        step = expected_step_time_s(self._s, num_seqs=seqs, num_speculative_tokens=gamma, mean_context_tokens=ctx)
        return step / expected_tokens_per_verification(self._s.drafter, gamma, acceptance[:gamma])

    def score(self, gamma: int, *, elapsed_s: float, context_tokens: float) -> float:
        """Served fraction x 1/ITL of gamma at the steady state for the arrival rate at `elapsed_s` (see module)."""
        acceptance = acceptance_at(self._s, elapsed_s, self._gamma_max)
        rate = arrival_rate_at(self._s, elapsed_s)
        cap = self._s.engine.max_num_seqs
        offered = rate * self._out  # tokens/s asked for
        batch = 1.0
        for _ in range(_FIXED_POINT_ITERATIONS):
            nxt = min(float(cap), max(1.0, offered * self._itl(gamma, batch, context_tokens, acceptance)))
            if abs(nxt - batch) < 0.5:
                batch = nxt
                break
            batch = nxt
        itl = self._itl(gamma, batch, context_tokens, acceptance)
        capacity = cap / self._itl(gamma, cap, context_tokens, acceptance)
        served = 1.0 if offered <= 0 else min(1.0, capacity / offered)
        value = served / itl
        if self._slo is not None and itl > self._slo:
            value *= 0.5
        return value

    def _horizon_scores(self, elapsed_s: float, context_tokens: float) -> list[float]:
        times = [elapsed_s + self._horizon_s * i / HORIZON_SAMPLES for i in range(HORIZON_SAMPLES)]
        return [
            sum(self.score(g, elapsed_s=t, context_tokens=context_tokens) for t in times) / len(times)
            for g in range(self._gamma_max + 1)
        ]

    def initial_k(self) -> int:
        """The best gamma at the start, chosen for free (static baselines also start in their configuration)."""
        scores = self._horizon_scores(0.0, self._context(None))
        return max(range(len(scores)), key=lambda g: (scores[g], -g))

    def _context(self, world: World | None) -> float:
        if world is not None and world.num_running > 0:
            return world.mean_context_tokens
        return self._prompt + self._out / 2

    async def choose(self, world: World, now_s: float) -> int:
        current = world.num_speculative_tokens
        if not world.serving:
            return current
        scores = self._horizon_scores(now_s - self._start_s, self._context(world))
        best = max(range(len(scores)), key=lambda g: (scores[g], -g))
        if best == current or scores[current] <= 0:
            return current if scores[current] > 0 else best
        gain = scores[best] / scores[current] - 1.0
        in_flight = world.num_running + world.num_waiting
        carried = max(1.0, arrival_rate_at(self._s, now_s - self._start_s) * self._s.engine.restart_delay_s)
        cost_s = self._s.engine.restart_delay_s * (1.0 + in_flight / carried)
        return best if gain * self._horizon_s > cost_s else current
