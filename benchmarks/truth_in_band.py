"""Does the published band hold the simulated world's true speedup? Figures per scenario, not assertions.

    .venv/bin/python -m benchmarks.truth_in_band                      # the demo world and every bench scenario
    .venv/bin/python -m benchmarks.truth_in_band path/to/world.yaml   # any scenario files
    .venv/bin/python -m benchmarks.truth_in_band WORLD.yaml --at 2 250  # the world's true S(1..4) at batches 2, 250
    .venv/bin/python -m benchmarks.truth_in_band WORLD.yaml --force 0:3 750:2  # the world runs k=3, then k=2

The real sidecar pipeline runs against the simulated server in simulated time (the bench's advisor policy:
scrape -> estimate -> model -> decide). After every tick whose decision is ok and whose objective compares options
at one batch (latency, or capacity while every option holds the same batch), the world's true S at the published
gamma (the running one while off is not judged) is computed from the world's own physics at the window's mean
decoding batch and its context (the requests whose prompt is computed, sampled at each tick: about the sequences a
step verifies; a request still prefilling is running but verifies nothing, and a MoE world's S moves with the batch):

    S_true(gamma) = E[L]_true(gamma) x T_true(B, 0) / T_true(B, gamma)      (service/sim/physics.py)

and compared with the published band [expected_speedup_low, expected_speedup_high]. Reported per scenario: the
share of judged ticks inside, per load phase (low, ramp, high: the arrival rate against the scenario's range),
and the first misses. The world's physics is not the advisor's: the simulator shares no code with policies/.

With `--force T:K ...` the world runs k=K from T seconds on whatever the advisor says (it watches and publishes,
nothing acts), and every tick judges each gamma from 1 to the largest forced K + 1 on the published curve (each
point's speedup and band, not only the published gamma's): how the model prices what it has not seen (the plain
step, a k never run) from the kinds of step it has, e.g. two k and no plain step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from policies.types import DataState, Decision
from service.bench import pipeline
from service.bench.controllers import Controller
from service.bench.runner import PolicySpec, run_policy
from service.bench.spec import BenchScenario, load_bench_scenario
from service.sim import physics
from service.sim.scenario import Scenario
from service.sim.world import World

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "service" / "sim" / "scenarios" / "demo.yaml"
BENCH = ROOT / "service" / "sim" / "scenarios" / "bench"
JUDGED_OBJECTIVES = frozenset({"latency", "capacity"})
FORCED_SETTLE_S = 40.0  # after a forced switch: the restart (20 s in the demo) and a first window at the new k


@dataclass(frozen=True, slots=True)
class Judged:
    """One judged tick: time since start (s), phase, window batch, gamma, the truth and the published band."""

    t_s: float
    phase: str
    batch: float
    gamma: int
    truth: float
    speedup: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.truth <= self.high


@dataclass(frozen=True, slots=True)
class Coverage:
    scenario: str
    judged: tuple[Judged, ...] = field(default_factory=tuple)

    def share(self, phase: str | None = None, *, gamma: int | None = None, since_s: float = 0.0) -> float | None:
        """Share of judged ticks inside the band (in `phase`, at `gamma`, from `since_s` s on, when given); None
        when none was judged."""
        chosen = [j for j in self.judged if (phase is None or j.phase == phase)
                  and (gamma is None or j.gamma == gamma) and j.t_s >= since_s]
        return sum(j.inside for j in chosen) / len(chosen) if chosen else None


def true_speedup(scenario: Scenario, *, elapsed_s: float, batch: float, context: float, gamma: int) -> float:
    """S_true(gamma) at `batch` decoding sequences (rounded, >= 1) and `context` tokens (module docstring)."""
    if gamma == 0:
        return 1.0
    seqs = max(1, round(batch))
    acceptance = physics.acceptance_at(scenario, elapsed_s, gamma)
    length = physics.expected_tokens_per_verification(scenario.drafter, gamma, acceptance)
    plain = physics.expected_step_time_s(scenario, num_seqs=seqs, num_speculative_tokens=0, mean_context_tokens=context)
    spec = physics.expected_step_time_s(
        scenario, num_seqs=seqs, num_speculative_tokens=gamma, mean_context_tokens=context
    )
    return length * plain / spec


def _phase(rate: float, low: float, high: float) -> str:
    if high - low < 1e-9:
        return "steady"
    share = (rate - low) / (high - low)
    return "low" if share <= 0.2 else "high" if share >= 0.8 else "ramp"


def coverage(bench: BenchScenario, *, name: str, forced: Sequence[tuple[float, int]] = ()) -> Coverage:
    """Run the advisor policy over the scenario and judge every eligible tick (module docstring). `forced`: (from
    seconds since the start >= 0, k >= 0) in time order; the world runs that k schedule instead of the advice (the
    scenario's deployed k before the first entry), and each tick judges gammas 1 .. max k + 1 of the published
    curve."""
    scenario = bench.scenario
    initial_k = _k_at(forced, 0.0, default=scenario.drafter.num_speculative_tokens)
    settings = pipeline.bench_advisor_settings(bench)
    window_s = settings.estimator.window_s
    rates = [point.requests_per_s for point in scenario.workload.arrival_rate]
    history: list[tuple[float, int, float, float]] = []  # (now, decoding, their context, arrival rate)
    decisions: list[tuple[float, Decision, int]] = []

    class Watching(pipeline.AdvisorController):
        async def choose(self, world: World, now_s: float) -> int:
            k = await super().choose(world, now_s)
            history.append((now_s, world.num_decoding, world.mean_decode_context_tokens, world.arrival_rate_per_s))
            status = self._sidecar.board.get(pipeline.TARGET)
            if status is not None and status.decision is not None:
                decisions.append((now_s, status.decision, world.num_speculative_tokens))
            return _k_at(forced, now_s - history[0][0], default=initial_k) if forced else k

    @contextlib.asynccontextmanager
    async def advisor(world: World, start_s: float) -> AsyncIterator[Controller]:
        async with Watching(settings, world=world, clock=pipeline.SimClock(start_s)) as controller:
            yield controller

    policy = PolicySpec("advisor", initial_k=initial_k, controller=advisor)
    asyncio.run(run_policy(bench, policy, duration_s=bench.bench.duration_s))
    if not history:
        return Coverage(name)
    start = history[0][0]
    judged: list[Judged] = []
    top = max(k for _, k in forced) + 1 if forced else 0
    for now, d, running_k in decisions:
        if d.state is not DataState.OK or d.objective not in JUDGED_OBJECTIVES:
            continue
        window = [h for h in history if now - window_s < h[0] <= now and h[1] > 0]
        if not window or running_k == 0:
            continue
        if forced:
            points = [(p.gamma, p.speedup, p.speedup_low, p.speedup_high) for p in d.curve if 1 <= p.gamma <= top]
        elif d.enabled and d.num_speculative_tokens > 0:
            points = [(d.num_speculative_tokens, d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high)]
        else:
            continue
        batch = statistics.mean(h[1] for h in window)
        context = statistics.mean(h[2] for h in window)
        phase = _phase(window[-1][3], min(rates), max(rates))
        for gamma, speedup, low, high in points:
            truth = true_speedup(scenario, elapsed_s=now - start, batch=batch, context=context, gamma=gamma)
            judged.append(Judged(
                t_s=now - start, phase=phase, batch=batch, gamma=gamma, truth=truth, speedup=speedup, low=low,
                high=high,
            ))
    return Coverage(name, tuple(judged))


def _k_at(forced: Sequence[tuple[float, int]], since_s: float, *, default: int) -> int:
    """The k a forced schedule runs `since_s` seconds in: its last entry at or before then, `default` before its
    first. Example: ((0, 3), (750, 2)) at 800 s -> 2."""
    return next((k for at, k in reversed(forced) if at <= since_s), default)


def _forced(text: str) -> tuple[float, int]:
    """"750:2" -> (750.0, 2): from 750 s on, the world runs k=2."""
    at, _, k = text.partition(":")
    try:
        seconds, gamma = float(at), int(k)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected T:K (seconds:k), got {text!r}") from None
    if not (seconds >= 0.0 and gamma >= 0):  # NaN fails too
        raise argparse.ArgumentTypeError(f"T must be >= 0 s and K >= 0, got {text!r}")
    return seconds, gamma


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path, help="default: the demo and the bench scenarios")
    parser.add_argument("--at", type=float, nargs="+", metavar="BATCH",
                        help="print the world's true S(1..4) at these batches instead of judging a run")
    parser.add_argument("--context", type=float, default=600.0, help="context tokens for --at (default 600)")
    parser.add_argument("--elapsed-s", type=float, default=0.0, help="scenario time for --at (acceptance drifts)")
    parser.add_argument("--force", nargs="+", type=_forced, metavar="T:K", default=[],
                        help="the world runs k=K from T s on (the advisor only watches); judge gammas 1..max K + 1")
    args = parser.parse_args(argv)
    paths = args.scenarios or [DEMO, *sorted(BENCH.glob("*.yaml"))]
    if args.at:
        for path in paths:
            scenario = load_bench_scenario(path).scenario
            for batch in args.at:
                values = [
                    true_speedup(scenario, elapsed_s=args.elapsed_s, batch=batch, context=args.context, gamma=g)
                    for g in range(1, 5)
                ]
                truths = "  ".join(f"S({g}) {v:.3f}" for g, v in enumerate(values, start=1))
                print(f"{path.stem:26s} batch {batch:6.1f} context {args.context:6.0f}: {truths}")
        return 0
    for path in paths:
        result = coverage(load_bench_scenario(path), name=path.stem, forced=sorted(args.force))
        overall = result.share()
        if overall is None:
            print(f"{path.stem:26s} nothing judged (speculation off, or no latency/capacity tick)")
            continue
        phases = " ".join(
            f"{phase} {share:.0%}" for phase in ("low", "ramp", "high", "steady")
            if (share := result.share(phase)) is not None
        )
        print(f"{path.stem:26s} truth inside the band at {overall:4.0%} of {len(result.judged):3d} ticks ({phases})")
        if len(args.force) > 1:
            since = max(at for at, _ in args.force) + FORCED_SETTLE_S
            by_gamma = " ".join(f"S({g}) {share:.0%}" for g in sorted({j.gamma for j in result.judged})
                                if (share := result.share(gamma=g, since_s=since)) is not None)
            print(f"{'':26s} from {since:.0f} s (after the last switch): {by_gamma}")
        for miss in [j for j in result.judged if not j.inside][:3]:
            print(f"    miss t={miss.t_s:5.0f}s B={miss.batch:6.1f} gamma {miss.gamma}: true S {miss.truth:.2f}, "
                  f"published {miss.speedup:.2f} [{miss.low:.2f}..{miss.high:.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
