"""Benchmark one scenario with every policy, and a list of scenarios one after the other, never stopping at a
failing one: its error is recorded and the rest go on."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from service.bench.controllers import Controller
from service.bench.oracle import Oracle
from service.bench.pipeline import AdvisorController, SimClock, advisor_settings
from service.bench.runner import ControllerFactory, PolicySpec, RunResult, run_policy
from service.bench.spec import BenchScenario
from service.sim.world import World

ADVISOR = "advisor"
ORACLE = "oracle"
ALWAYS_OFF = "always-off"
ALWAYS_ON = "always-on"
BEST_THRESHOLD = "best-threshold"
BEST_FIXED = "best-fixed-gamma"
POLICIES: tuple[str, ...] = (ADVISOR, ALWAYS_OFF, ALWAYS_ON, BEST_THRESHOLD, BEST_FIXED, ORACLE)
STATIC_POLICIES: tuple[str, ...] = (ALWAYS_OFF, ALWAYS_ON, BEST_THRESHOLD, BEST_FIXED)

# Two runs whose headline figures are within this share of each other are a tie: the lower mean ITL wins.
TIE_RATIO = 0.005

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """One compared policy: the run, and for grid-searched policies the setting that won in hindsight."""

    run: RunResult
    setting: str = ""


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    name: str
    source: str
    duration_s: float
    itl_slo_s: float | None
    outcomes: dict[str, PolicyOutcome] = field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0

    def headline(self, policy: str) -> float:
        """The figure policies are ranked by: SLO goodput when the scenario sets an SLO, else goodput."""
        m = self.outcomes[policy].run.metrics
        if self.itl_slo_s is not None and m.slo_goodput_tokens_per_s is not None:
            return m.slo_goodput_tokens_per_s
        return m.goodput_tokens_per_s


def headline_of(run: RunResult, itl_slo_s: float | None) -> float:
    m = run.metrics
    return m.slo_goodput_tokens_per_s if itl_slo_s is not None and m.slo_goodput_tokens_per_s is not None else (
        m.goodput_tokens_per_s
    )


def best_of(runs: Sequence[RunResult], itl_slo_s: float | None) -> RunResult:
    """The best run in hindsight: the highest headline figure; within TIE_RATIO of it, the lowest mean ITL."""
    top = max(headline_of(r, itl_slo_s) for r in runs)
    close = [r for r in runs if headline_of(r, itl_slo_s) >= top * (1.0 - TIE_RATIO)]
    return min(close, key=lambda r: r.metrics.mean_itl_s if r.metrics.mean_itl_s is not None else float("inf"))


def _advisor_factory(bench: BenchScenario) -> ControllerFactory:
    section = bench.bench
    settings = advisor_settings(
        model_name=bench.scenario.model_name,
        hardware=section.advisor.hardware,
        model_profile=section.advisor.model_profile,
        drafter_method=section.advisor.drafter_method or bench.scenario.drafter.method,
        draft_model_profile=section.advisor.draft_model_profile,
        interval_s=section.decision_interval_s,
        itl_slo_s=section.itl_slo_s,
        extra=section.advisor.settings,
    )

    @contextlib.asynccontextmanager
    async def factory(world: World, start_s: float) -> AsyncIterator[Controller]:
        async with AdvisorController(settings, world=world, clock=SimClock(start_s)) as controller:
            yield controller

    return factory


def _oracle(bench: BenchScenario, start_s: float) -> Oracle:
    return Oracle(
        bench.scenario,
        start_s=start_s,
        gamma_max=bench.gamma_max,
        horizon_s=max(300.0, 10.0 * bench.scenario.engine.restart_delay_s),
        itl_slo_s=bench.bench.itl_slo_s,
    )


def _oracle_factory(bench: BenchScenario) -> ControllerFactory:
    @contextlib.asynccontextmanager
    async def factory(world: World, start_s: float) -> AsyncIterator[Controller]:
        yield _oracle(bench, start_s)

    return factory


async def run_scenario(bench: BenchScenario, *, duration_s: float | None = None,
                       progress: Progress | None = None) -> ScenarioResult:
    """Every policy on one scenario, the same world seed for each. Raises on a bug or bad advisor settings; the
    caller (`run_suite`) turns that into the scenario's error."""
    duration = duration_s if duration_s is not None else bench.bench.duration_s
    slo = bench.bench.itl_slo_s
    say = progress or (lambda _msg: None)
    # Bad advisor settings fail here, before any run, with the settings' own message.
    advisor_factory = _advisor_factory(bench)

    async def run(spec: PolicySpec) -> RunResult:
        result = await run_policy(bench, spec, duration_s=duration)
        say(f"  {bench.name}: {spec.name} done")
        return result

    fixed = [await run(PolicySpec(name=f"fixed gamma={g}", initial_k=g)) for g in range(bench.gamma_max + 1)]
    k = bench.drafter_k
    always_on = fixed[k] if k < len(fixed) else await run(PolicySpec(name=ALWAYS_ON, initial_k=k))
    thresholds = [
        await run(PolicySpec(name=f"threshold B*={b}", initial_k=k, disable_by_batch_size=b))
        for b in bench.batch_thresholds
    ]
    best_fixed = best_of(fixed, slo)
    best_threshold = best_of(thresholds, slo)
    oracle_start_k = _oracle(bench, 0.0).initial_k()
    oracle = await run(PolicySpec(name=ORACLE, initial_k=oracle_start_k, controller=_oracle_factory(bench)))
    advisor = await run(
        PolicySpec(name=ADVISOR, initial_k=bench.scenario.drafter.num_speculative_tokens,
                   controller=advisor_factory)
    )
    outcomes = {
        ADVISOR: PolicyOutcome(advisor),
        ALWAYS_OFF: PolicyOutcome(fixed[0]),
        ALWAYS_ON: PolicyOutcome(always_on, setting=f"k={k}"),
        BEST_THRESHOLD: PolicyOutcome(best_threshold, setting=best_threshold.policy.removeprefix("threshold ")),
        BEST_FIXED: PolicyOutcome(best_fixed, setting=best_fixed.policy.removeprefix("fixed ")),
        ORACLE: PolicyOutcome(oracle),
    }
    return ScenarioResult(name=bench.name, source=bench.source, duration_s=duration, itl_slo_s=slo, outcomes=outcomes)


async def run_suite(
    benches: Sequence[BenchScenario], *, duration_s: float | None = None, progress: Progress | None = None
) -> list[ScenarioResult]:
    """Run every scenario; one that raises is reported with its error and the next one runs."""
    say = progress or (lambda _msg: None)
    results: list[ScenarioResult] = []
    for i, bench in enumerate(benches, 1):
        started = time.perf_counter()
        say(f"[{i}/{len(benches)}] {bench.name} ({bench.source})")
        try:
            result = await run_scenario(bench, duration_s=duration_s, progress=progress)
        except Exception as exc:  # one broken scenario (or a bug it exposes) must not lose the others' results
            duration = duration_s if duration_s is not None else bench.bench.duration_s
            result = ScenarioResult(
                name=bench.name, source=bench.source, duration_s=duration, itl_slo_s=bench.bench.itl_slo_s,
                error=f"{type(exc).__name__}: {exc}",
            )
            say(f"  {bench.name}: FAILED: {result.error}")
        wall = time.perf_counter() - started
        results.append(ScenarioResult(
            name=result.name, source=result.source, duration_s=result.duration_s, itl_slo_s=result.itl_slo_s,
            outcomes=result.outcomes, error=result.error, wall_s=wall,
        ))
        say(f"  {bench.name}: {'failed' if result.error else 'done'} in {wall:.1f} s")
    return results
