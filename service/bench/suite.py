"""Benchmark one scenario with every policy, and a list of scenarios one after the other, never stopping at a
failing one: its error is recorded and the rest go on."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from service.bench.accounting import Objective
from service.bench.actuated import ACTUATED_ADVISOR, actuated_advisor_policy
from service.bench.checks import (
    QualityChecks,
    Truth,
    crossing_lags,
    flaps,
    steady_changes,
    steady_ticks,
    worst_wrong_spell_s,
)
from service.bench.controllers import Controller
from service.bench.hindsight import BasePolicy, HindsightOracle, Schedule, future_of
from service.bench.pipeline import AdvisorController, SimClock, bench_advisor_settings
from service.bench.runner import EPOCH_S, ControllerFactory, PolicySpec, RunResult, run_policy, with_k
from service.bench.spec import BenchScenario
from service.bench.steady_state import PlanGrid, SteadyStatePlanner
from service.settings import Settings
from service.sim.physics import acceptance_at, arrival_rate_at
from service.sim.world import World

ADVISOR = "advisor"
ORACLE = "oracle"
# The oracle's rollout started from the deployed k, as the advisor starts: what correcting the deployment costs.
ORACLE_DEPLOYED = "oracle-deployed"
ALWAYS_OFF = "always-off"
ALWAYS_ON = "always-on"
BEST_THRESHOLD = "best-threshold"
BEST_FIXED = "best-fixed-gamma"
POLICIES: tuple[str, ...] = (
    ADVISOR, ACTUATED_ADVISOR, ALWAYS_OFF, ALWAYS_ON, BEST_THRESHOLD, BEST_FIXED, ORACLE, ORACLE_DEPLOYED,
)
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
    quality: QualityChecks | None = None
    objective: Objective | None = None  # None only for a scenario that failed before its runs

    def headline(self, policy: str) -> float:
        """The figure policies are ranked by: the scenario's objective (accounting.Objective) on the run."""
        objective = self.objective or Objective("throughput")
        return objective.score(self.outcomes[policy].run.metrics)


def headline_of(run: RunResult, objective: Objective) -> float:
    return objective.score(run.metrics)


def best_of(runs: Sequence[RunResult], objective: Objective) -> RunResult:
    """The best run in hindsight: the highest headline figure; within TIE_RATIO of it, the lowest mean ITL."""
    top = max(headline_of(r, objective) for r in runs)
    close = [r for r in runs if headline_of(r, objective) >= top * (1.0 - TIE_RATIO)]
    return min(close, key=_itl_or_inf)


# Under an ITL SLO, a best static SLO goodput below this share of the best static goodput means no setting meets it.
SLO_UNMET_SHARE = 0.01


def scenario_objective(bench: BenchScenario, statics: Sequence[RunResult]) -> Objective:
    """The scenario's objective; for latency, its floor is `latency_floor_ratio` x the best static goodput.

    An ITL SLO that no static setting meets (the best SLO goodput under `SLO_UNMET_SHARE` of the best goodput: an
    overload in which every setting's ITL is past it) grades nothing: every headline is ~0 and every ratio 0 / 0.
    The scenario is then graded on throughput (the tokens the clients got, late), and `Objective.note` says so;
    the advisor itself keeps the SLO's ranking there (policies/model/objectives.py). Example: SLO 45 ms, best
    static SLO goodput 0 of 2056 tokens/s -> throughput, "ITL SLO 45 ms met by no static setting (best 0 of 2056
    tokens/s)".
    """
    section = bench.bench
    kind = section.objective_kind
    best_goodput = max(r.metrics.goodput_tokens_per_s for r in statics)
    floor = section.latency_floor_ratio * best_goodput
    if kind == "slo_goodput" and section.itl_slo_s is not None:
        best_slo = max(r.metrics.slo_goodput_tokens_per_s or 0.0 for r in statics)
        if best_slo < SLO_UNMET_SHARE * best_goodput:
            note = (f"ITL SLO {section.itl_slo_s * 1e3:.0f} ms met by no static setting (best {best_slo:.0f} of "
                    f"{best_goodput:.0f} tokens/s): graded on throughput")
            return Objective("throughput", itl_slo_s=section.itl_slo_s, note=note)
    return Objective(kind, itl_slo_s=section.itl_slo_s, floor_tokens_per_s=floor if kind == "latency" else 0.0)


def _itl_or_inf(run: RunResult) -> float:
    return run.metrics.mean_itl_s if run.metrics.mean_itl_s is not None else float("inf")


def _advisor_factory(bench: BenchScenario) -> tuple[ControllerFactory, Settings]:
    settings = bench_advisor_settings(bench)

    @contextlib.asynccontextmanager
    async def factory(world: World, start_s: float) -> AsyncIterator[Controller]:
        async with AdvisorController(settings, world=world, clock=SimClock(start_s)) as controller:
            yield controller

    return factory, settings


def _oracle_factory(oracle: HindsightOracle) -> ControllerFactory:
    @contextlib.asynccontextmanager
    async def factory(world: World, start_s: float) -> AsyncIterator[Controller]:
        yield oracle

    return factory


def quality_checks(bench: BenchScenario, *, advisor: RunResult, oracle: RunResult, planner: SteadyStatePlanner,
                   settings: Settings) -> QualityChecks:
    """The advisor's per-tick checks against the oracle's run (service.bench.checks), in the advisor's own units:
    lags in decision windows (its estimator window), flaps against its dwell period."""
    interval = bench.bench.decision_interval_s
    dwell = settings.decide.dwell_s
    adv = [t.k for t in advisor.ticks]
    orc = [t.k for t in oracle.ticks]
    times = [t.t_s for t in advisor.ticks]
    rates = [arrival_rate_at(bench.scenario, t) for t in times]
    first_acceptance = [acceptance_at(bench.scenario, t, 1)[0] for t in times]
    steady = steady_ticks(rates, first_acceptance, interval_s=interval, span_s=max(dwell, 2 * interval))
    initial = bench.scenario.drafter.num_speculative_tokens
    change_times = [times[i] for i, k in enumerate(adv) if k != (adv[i - 1] if i else initial)]
    # Crossings are the oracle's changes after its first decision: correcting a wrong deployed k at the start is
    # not a load shift or drift across a crossover, and the /best ratio already grades how fast it was made.
    first = orc[0] if orc else planner.initial_k()
    # A change that costs a restart is the advisor's bet on its payback horizon: judged over it.
    horizon = round(settings.decide.payback_horizon_s / interval) if settings.decide.change_cost_s > 0 else 1
    return QualityChecks(
        crossings=crossing_lags(adv, orc, oracle_initial_k=first, interval_s=interval,
                                utility=planner.utility),
        window_s=settings.estimator.window_s,
        flaps=flaps(change_times, dwell_s=dwell),
        steady_changes=steady_changes(
            adv, steady, initial_k=initial, oracle_k=orc,
            truth=Truth(utility=planner.utility, itl_s=planner.itl_s, horizon_ticks=horizon),
        ),
        worst_wrong_spell_s=worst_wrong_spell_s(adv, orc, interval_s=interval, utility=planner.utility),
    )


def plan_policy(planner: SteadyStatePlanner, *, start_s: float, interval_s: float) -> BasePolicy:
    """The steady-state planner's plan as a base policy for the oracle: the gamma it plans for the interval that
    starts at a boundary (the last one past its end)."""
    plan = planner.plan

    def at(t_s: float, _k: int) -> int:
        return plan[min(len(plan) - 1, max(0, round((t_s - start_s) / interval_s)))]

    return at


def schedule_of(initial_k: int, run: RunResult, *, interval_s: float) -> Schedule:
    """A run's k over time (its ticks' configured k, in the world's seconds on the runner's tick grid, start +
    i x `interval_s`), to replay (hindsight.Schedule)."""
    changes: list[tuple[float, int]] = []
    k = initial_k
    for tick in run.ticks:
        if tick.k != k:
            changes.append((EPOCH_S + round(tick.t_s / interval_s) * interval_s, tick.k))
            k = tick.k
    return Schedule(initial_k, tuple(changes))


def _world_at(bench: BenchScenario) -> Callable[[int], World]:
    return lambda k: World(with_k(bench.scenario, k), seed=bench.bench.seed, start_s=EPOCH_S, record_completions=True)


def hindsight_spec(bench: BenchScenario, duration_s: float, statics: Sequence[tuple[PolicySpec, RunResult]],
                   objective: Objective, plan: BasePolicy | None = None) -> tuple[PolicySpec, HindsightOracle]:
    """The hindsight oracle's run: configured as the static run with the highest headline, or as a gamma whose run
    under the planner's plan does better, then the rollout (service.bench.hindsight) at every
    `bench.oracle_segment_s`. Returns the run's spec and the oracle (its `log` says what it committed to). It is
    blind to the advisor (the quality checks grade the advisor's moves against its choices); the bound on the
    advisor is `deployed_oracle_spec`'s."""
    # The highest headline (the bound needs the maximum, not best_of's tie margin); exact ties by mean ITL.
    top = max(headline_of(run, objective) for _, run in statics)
    start_spec, _ = min(((spec, run) for spec, run in statics if headline_of(run, objective) >= top),
                        key=lambda pair: _itl_or_inf(pair[1]))
    oracle = _rollout(bench, duration_s, objective, plan)
    initial_k, threshold = start_spec.initial_k, start_spec.disable_by_batch_size
    if plan is not None:
        planned = oracle.planned_start(_world_at(bench), static_value=top)
        if planned is not None:
            initial_k, threshold = planned, None
    spec = PolicySpec(name=ORACLE, initial_k=initial_k, disable_by_batch_size=threshold,
                      controller=_oracle_factory(oracle))
    return spec, oracle


def _rollout(bench: BenchScenario, duration_s: float, objective: Objective, plan: BasePolicy | None) -> HindsightOracle:
    interval = bench.bench.decision_interval_s
    end_s = EPOCH_S + max(1, round(duration_s / interval)) * interval
    gammas = range(max(bench.gamma_max, bench.scenario.drafter.num_speculative_tokens) + 1)
    return HindsightOracle(start_s=EPOCH_S, end_s=end_s, segment_s=bench.bench.oracle_segment_s, gammas=gammas,
                           objective=objective, plan=plan)


def deployed_oracle_spec(bench: BenchScenario, duration_s: float, objective: Objective,
                         plan: BasePolicy | None = None,
                         replays: Sequence[Schedule] = ()) -> tuple[PolicySpec, HindsightOracle]:
    """The oracle's rollout started from the deployed k (no static run chooses its start), with a boundary at the
    first decision tick as well: the most a policy that starts where the advisor does reaches with the oracle's
    moves. advisor / this run (`/reach`) is the advice's own share; the best known policy's figure also charges
    the deployment (the restart out of a wrong k that a static run configured right from the start never pays).
    It may start as each of `replays` that starts at the deployed k (the advisor's runs), their changes added as
    boundaries, so it ends at or above each of them: the bound on the advisor by construction. Returns the run's
    spec and the oracle."""
    oracle = _rollout(bench, duration_s, objective, plan)
    interval = bench.bench.decision_interval_s
    if interval < bench.bench.oracle_segment_s:
        oracle.decide_first_at(EPOCH_S + interval)
    deployed_k = bench.scenario.drafter.num_speculative_tokens
    mine = list(dict.fromkeys(schedule for schedule in replays if schedule.initial_k == deployed_k))
    if mine:
        holding = future_of(_world_at(bench)(deployed_k), deployed_k, now_s=EPOCH_S, end_s=oracle.end_s)
        oracle.replayed_start(_world_at(bench), mine, static_value=oracle.value_of(holding))
    spec = PolicySpec(name=ORACLE_DEPLOYED, initial_k=deployed_k, controller=_oracle_factory(oracle))
    return spec, oracle


@dataclass(frozen=True, slots=True)
class StaticRuns:
    """The static policies of one scenario, each run from the start on the same world seed: every fixed gamma
    0..gamma_max (`fixed[g]`), always-on at the deployed k, each engine-native batch threshold, and the objective
    they set (its latency floor is the best static goodput's share)."""

    fixed_specs: tuple[PolicySpec, ...]
    fixed: tuple[RunResult, ...]
    always_on: RunResult
    threshold_specs: tuple[PolicySpec, ...]
    thresholds: tuple[RunResult, ...]
    objective: Objective

    def best_fixed(self) -> RunResult:
        return best_of(self.fixed, self.objective)

    def best_threshold(self) -> RunResult:
        return best_of(self.thresholds, self.objective)

    def headline(self) -> float:
        """The best static policy's headline figure as the bench's `/static` ranks them (report.advisor_ratios):
        the best of always-off, always-on, the best threshold and the best fixed gamma, each of the last two
        chosen by `best_of` (within the tie margin, the lower mean ITL)."""
        runs = (self.fixed[0], self.always_on, self.best_threshold(), self.best_fixed())
        return max(headline_of(run, self.objective) for run in runs)


async def run_statics(bench: BenchScenario, run: Callable[[PolicySpec], Awaitable[RunResult]]) -> StaticRuns:
    """Every static policy of `bench`, each through `run` (one policy, one run)."""
    fixed_specs = tuple(PolicySpec(name=f"fixed gamma={g}", initial_k=g) for g in range(bench.gamma_max + 1))
    fixed = tuple([await run(spec) for spec in fixed_specs])
    k = bench.drafter_k
    always_on = fixed[k] if k < len(fixed) else await run(PolicySpec(name=ALWAYS_ON, initial_k=k))
    threshold_specs = tuple(PolicySpec(name=f"threshold B*={b}", initial_k=k, disable_by_batch_size=b)
                            for b in bench.batch_thresholds)
    thresholds = tuple([await run(spec) for spec in threshold_specs])
    objective = scenario_objective(bench, [*fixed, always_on, *thresholds])
    return StaticRuns(fixed_specs=fixed_specs, fixed=fixed, always_on=always_on, threshold_specs=threshold_specs,
                      thresholds=thresholds, objective=objective)


def advisor_spec(bench: BenchScenario) -> tuple[PolicySpec, Settings]:
    """The advisor policy of `bench` (the sidecar pipeline from the deployed k) and its settings. Raises
    SettingsError on bad advisor settings."""
    factory, settings = _advisor_factory(bench)
    deployed_k = bench.scenario.drafter.num_speculative_tokens
    return PolicySpec(name=ADVISOR, initial_k=deployed_k, controller=factory), settings


async def run_scenario(bench: BenchScenario, *, duration_s: float | None = None,
                       progress: Progress | None = None) -> ScenarioResult:
    """Every policy on one scenario, the same world seed for each. Raises on a bug or bad advisor settings; the
    caller (`run_suite`) turns that into the scenario's error."""
    duration = duration_s if duration_s is not None else bench.bench.duration_s
    slo = bench.bench.itl_slo_s
    say = progress or (lambda _msg: None)
    # Bad advisor settings fail here, before any run, with the settings' own message.
    advisor_policy, settings = advisor_spec(bench)

    async def run(spec: PolicySpec) -> RunResult:
        result = await run_policy(bench, spec, duration_s=duration)
        say(f"  {bench.name}: {spec.name} done")
        return result

    statics_run = await run_statics(bench, run)
    fixed, always_on, thresholds = statics_run.fixed, statics_run.always_on, statics_run.thresholds
    objective = statics_run.objective
    k = bench.drafter_k
    best_fixed = statics_run.best_fixed()
    best_threshold = statics_run.best_threshold()
    grid = PlanGrid(start_s=EPOCH_S, interval_s=bench.bench.decision_interval_s, duration_s=duration)
    # The planner's utility grades the advisor's crossings and seeds the oracle: in the objective's units, so an
    # SLO no setting meets (graded on throughput) is not planned for either.
    planned_slo = slo if objective.kind == "slo_goodput" else None
    planner = SteadyStatePlanner(bench.scenario, grid, gamma_max=bench.gamma_max, itl_slo_s=planned_slo)
    statics = [*zip(statics_run.fixed_specs, fixed, strict=True),
               *zip(statics_run.threshold_specs, thresholds, strict=True)]
    if k >= len(fixed):  # always-on ran on its own (the deployed k is past gamma_max): a start like the others
        statics.append((PolicySpec(name=ALWAYS_ON, initial_k=k), always_on))
    plan = plan_policy(planner, start_s=EPOCH_S, interval_s=bench.bench.decision_interval_s)
    deployed_k = bench.scenario.drafter.num_speculative_tokens
    advisor = await run(advisor_policy)
    actuated = await run(actuated_advisor_policy(bench))
    oracle = await run(hindsight_spec(bench, duration, statics, objective, plan)[0])
    # The run from the deployed k may start as either advisor's run replayed: an upper bound on both.
    interval = bench.bench.decision_interval_s
    replays = [schedule_of(deployed_k, run, interval_s=interval) for run in (advisor, actuated)]
    deployed, _ = deployed_oracle_spec(bench, duration, objective, plan, replays)  # starts at 0 where deployed off
    from_deployed = await run(deployed)
    outcomes = {
        ADVISOR: PolicyOutcome(advisor),
        ACTUATED_ADVISOR: PolicyOutcome(actuated),
        ALWAYS_OFF: PolicyOutcome(fixed[0]),
        ALWAYS_ON: PolicyOutcome(always_on, setting=f"k={k}"),
        BEST_THRESHOLD: PolicyOutcome(best_threshold, setting=best_threshold.policy.removeprefix("threshold ")),
        BEST_FIXED: PolicyOutcome(best_fixed, setting=best_fixed.policy.removeprefix("fixed ")),
        ORACLE: PolicyOutcome(oracle),
        ORACLE_DEPLOYED: PolicyOutcome(from_deployed, setting=f"from k={deployed.initial_k}"),
    }
    quality = quality_checks(bench, advisor=advisor, oracle=oracle, planner=planner, settings=settings)
    return ScenarioResult(name=bench.name, source=bench.source, duration_s=duration, itl_slo_s=slo, outcomes=outcomes,
                          quality=quality, objective=objective)


def _failed(bench: BenchScenario, duration_s: float | None, exc: BaseException) -> ScenarioResult:
    duration = duration_s if duration_s is not None else bench.bench.duration_s
    return ScenarioResult(name=bench.name, source=bench.source, duration_s=duration, itl_slo_s=bench.bench.itl_slo_s,
                          error=f"{type(exc).__name__}: {exc}")


def run_one(bench: BenchScenario, duration_s: float | None, progress: Progress | None) -> ScenarioResult:
    """One scenario, start to end, in this process (also the worker of a parallel suite); never raises: a
    broken scenario (or a bug it exposes) is reported with its error so the others' results are kept."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    try:
        result = asyncio.run(run_scenario(bench, duration_s=duration_s, progress=progress))
    except Exception as exc:  # one broken scenario must not lose the others' results
        result = _failed(bench, duration_s, exc)
        say(f"  {bench.name}: FAILED: {result.error}")
    wall = time.perf_counter() - started
    say(f"  {bench.name}: {'failed' if result.error else 'done'} in {wall:.1f} s")
    return ScenarioResult(
        name=result.name, source=result.source, duration_s=result.duration_s, itl_slo_s=result.itl_slo_s,
        outcomes=result.outcomes, error=result.error, wall_s=wall, quality=result.quality, objective=result.objective,
    )


def run_suite(
    benches: Sequence[BenchScenario],
    *,
    duration_s: float | None = None,
    progress: Progress | None = None,
    jobs: int = 1,
    worker_init: Callable[[], None] | None = None,
) -> list[ScenarioResult]:
    """Run every scenario, in order, or `jobs` at a time in worker processes (each scenario is independent and
    single-threaded, so a 2-core machine runs the suite in about half the time). Results come back in the order
    of `benches`; one that raises is reported with its error and the others run. With jobs > 1, `progress` and
    `worker_init` must be picklable (module-level functions): workers are spawned, not forked."""
    say = progress or (lambda _msg: None)
    for i, bench in enumerate(benches, 1):
        say(f"[{i}/{len(benches)}] queued {bench.name} ({bench.source})")
    if jobs <= 1 or len(benches) <= 1:
        return [run_one(bench, duration_s, progress) for bench in benches]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited event loop or locks
    with ProcessPoolExecutor(max_workers=min(jobs, len(benches)), mp_context=context,
                             initializer=worker_init) as pool:
        futures = [pool.submit(run_one, bench, duration_s, progress) for bench in benches]
        results = []
        for bench, future in zip(benches, futures, strict=True):
            try:
                results.append(future.result())
            except Exception as exc:  # the worker itself died (e.g. out of memory): report, keep the rest
                results.append(_failed(bench, duration_s, exc))
        return results
