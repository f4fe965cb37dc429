"""The hindsight oracle's footing: a copy of the world continues exactly as the world does (so "what would gamma g
have delivered from here" has one answer), and the rollout only acts at its segment boundaries."""

from __future__ import annotations

import asyncio
import copy

import pytest

from service.bench.accounting import Objective, summarize
from service.bench.hindsight import HindsightOracle, Schedule, future_of
from service.sim.scenario import default_scenario
from service.sim.world import Completion, World

START = 1000.0


def _run_on(world: World, *, until_s: float, tick_s: float = 5.0) -> tuple[Completion, ...]:
    done: list[Completion] = []
    t = world.now_s
    while t < until_s:
        t = min(until_s, t + tick_s)
        world.advance_to(t)
        done.extend(world.drain_completions())
    return (*done, *world.in_flight())


def _key(completions: tuple[Completion, ...]) -> list[tuple[float, float, int, bool]]:
    return [(c.arrival_s, c.done_s, c.output_tokens, c.complete) for c in completions]


def test_a_copy_continues_exactly_as_the_world_does_in_any_tick_size() -> None:
    world = World(default_scenario(), seed=7, start_s=START, record_completions=True)
    world.advance_to(START + 60.0)
    world.drain_completions()
    twin = copy.deepcopy(world)
    # The copy switched to k = 1 and run to the end in one call ...
    predicted = future_of(world, 1, now_s=START + 60.0, end_s=START + 180.0)
    # ... is what the world does when switched the same way and run tick by tick.
    world.set_speculation(1, now_s=START + 60.0)
    assert _key(_run_on(world, until_s=START + 180.0)) == _key(predicted.completions)
    assert any(c.complete for c in predicted.completions)
    # The requests the switch at 60 s dropped, by the tokens they asked for: the future says the same.
    assert predicted.lost_tokens == world.lifetime.lost_tokens > 0
    # future_of did not touch the world it copied: the twin taken before it still agrees with the original.
    twin.set_speculation(1, now_s=START + 60.0)
    assert _key(_run_on(twin, until_s=START + 180.0, tick_s=30.0)) == _key(predicted.completions)


def test_the_oracle_acts_only_at_its_segment_boundaries_and_never_below_continuing() -> None:
    oracle = HindsightOracle(start_s=START, end_s=START + 120.0, segment_s=60.0, gammas=range(4),
                             objective=Objective("throughput"))
    world = World(default_scenario(), seed=7, start_s=START, record_completions=True)
    deployed = world.num_speculative_tokens
    for t in (55.0, 60.0):  # the runner's order: advance, choose, then drain
        world.advance_to(START + t)
        chosen = asyncio.run(oracle.choose(world, START + t))
        world.drain_completions()
        if t == 55.0:
            assert chosen == deployed and oracle.log == []  # not a boundary: keeps what runs, weighs nothing
    [(t_s, continuing, committed)] = oracle.log
    assert t_s == 60.0 and committed >= continuing > 0
    assert chosen in range(4) and (chosen == deployed or committed > continuing * 1.001)


def test_a_segment_must_be_positive() -> None:
    with pytest.raises(ValueError, match="segment_s"):
        HindsightOracle(start_s=0.0, end_s=10.0, segment_s=0.0, gammas=(0, 1), objective=Objective("throughput"))


def test_the_first_boundary_must_come_before_the_first_segment_ends() -> None:
    oracle = HindsightOracle(start_s=0.0, end_s=120.0, segment_s=60.0, gammas=(0, 1), objective=Objective("throughput"))
    for bad in (0.0, 60.0, 75.0):
        with pytest.raises(ValueError, match="first boundary"):
            oracle.decide_first_at(bad)
    assert not oracle._at_boundary(5.0)
    oracle.decide_first_at(5.0)
    assert oracle._at_boundary(5.0) and oracle._at_boundary(60.0) and not oracle._at_boundary(10.0)
    with pytest.raises(ValueError, match="set once"):
        oracle.decide_first_at(10.0)


def test_a_base_policy_runs_the_copy_as_the_world_would_be_run() -> None:
    world = World(default_scenario(), seed=7, start_s=START, record_completions=True)

    def off_from_90(t_s: float, k: int) -> int:
        return 0 if t_s >= START + 90.0 else k

    predicted = future_of(world, 2, now_s=START, end_s=START + 180.0, base=off_from_90,
                          boundaries=(START + 60.0, START + 90.0, START + 120.0))
    world.set_speculation(2, now_s=START)
    first = [c for c in _run_on(world, until_s=START + 90.0) if c.complete]
    world.set_speculation(0, now_s=START + 90.0)
    rest = _run_on(world, until_s=START + 180.0)
    assert _key((*first, *rest)) == _key(predicted.completions)
    assert predicted.lost_tokens == world.lifetime.lost_tokens
    assert world.lifetime.lost_requests > 0  # the move off at 90 s restarted the engine and dropped work


def test_a_planned_start_is_taken_only_when_it_beats_the_best_static_run_and_is_what_the_run_delivers() -> None:
    def world_at(k: int) -> World:
        scenario = default_scenario()
        drafter = scenario.drafter.model_copy(update={"num_speculative_tokens": k})
        return World(scenario.model_copy(update={"drafter": drafter}), seed=7, start_s=START, record_completions=True)

    def plan(t_s: float, _k: int) -> int:
        return 1 if t_s >= START + 60.0 else 2

    def oracle() -> HindsightOracle:
        return HindsightOracle(start_s=START, end_s=START + 120.0, segment_s=60.0, gammas=range(3),
                               objective=Objective("throughput"), plan=plan)

    assert oracle().planned_start(world_at, static_value=float("inf")) is None
    taken = oracle()
    chosen = taken.planned_start(world_at, static_value=0.0)
    assert chosen is not None
    [(_, _, promised)] = taken.log
    # Run that start by hand, the plan's move at 60 s included: it delivers exactly what was promised.
    world = world_at(chosen)
    first = [c for c in _run_on(world, until_s=START + 60.0) if c.complete]
    world.set_speculation(plan(START + 60.0, chosen), now_s=START + 60.0)
    delivered = summarize([*first, *_run_on(world, until_s=START + 120.0)], duration_s=120.0, itl_slo_s=None,
                          error_tokens=world.lifetime.lost_tokens)
    assert Objective("throughput").score(delivered) == promised  # errors (a restart at 60 s) included
    # Without a plan there is nothing to start on but the static runs.
    plain = HindsightOracle(start_s=START, end_s=START + 120.0, segment_s=60.0, gammas=range(3),
                            objective=Objective("throughput"))
    assert plain.planned_start(world_at, static_value=0.0) is None


def _world_at(k: int) -> World:
    scenario = default_scenario()
    drafter = scenario.drafter.model_copy(update={"num_speculative_tokens": k})
    return World(scenario.model_copy(update={"drafter": drafter}), seed=7, start_s=START, record_completions=True)


def test_a_schedule_says_the_k_configured_at_each_time() -> None:
    schedule = Schedule(3, ((START + 35.0, 1), (START + 95.0, 0)))
    assert [schedule.k_at(START + t) for t in (0.0, 34.9, 35.0, 60.0, 95.0, 119.0)] == [3, 3, 1, 1, 0, 0]
    assert Schedule(2).k_at(START + 50.0, 7) == 2


def test_a_replayed_run_is_a_start_the_oracle_acts_from_between_its_segments() -> None:
    # A policy that moved 3 -> 1 at 35 s, between the oracle's 60 s boundaries: replayed, it delivers exactly what
    # the policy's own run did, and the oracle that starts as it acts at 35 s too.
    schedule = Schedule(3, ((START + 35.0, 1),))
    world = _world_at(3)
    first = [c for c in _run_on(world, until_s=START + 35.0) if c.complete]
    world.set_speculation(1, now_s=START + 35.0)
    own = summarize([*first, *_run_on(world, until_s=START + 120.0)], duration_s=120.0, itl_slo_s=None,
                    error_tokens=world.lifetime.lost_tokens)
    oracle = HindsightOracle(start_s=START, end_s=START + 120.0, segment_s=60.0, gammas=range(4),
                             objective=Objective("throughput"))
    assert oracle.replayed_start(_world_at, [schedule], static_value=0.0) == 3
    [(_, _, promised)] = oracle.log
    assert promised == Objective("throughput").score(own)
    assert oracle._at_boundary(START + 35.0) and not oracle._at_boundary(START + 30.0)
    # Beaten by the best static run, the replay is not taken; and it is set before anything else.
    assert HindsightOracle(start_s=START, end_s=START + 120.0, segment_s=60.0, gammas=range(4),
                           objective=Objective("throughput")).replayed_start(
        _world_at, [schedule], static_value=float("inf")) is None
    with pytest.raises(ValueError, match="replayed starts"):
        oracle.replayed_start(_world_at, [schedule], static_value=0.0)


def test_a_replay_worth_exactly_the_static_value_is_taken() -> None:
    # A start is not a crossing: a replay worth what the oracle would otherwise start as is taken, so the bound on
    # the replayed policy is exact (no 0.1% margin above it).
    schedule = Schedule(3, ((START + 35.0, 1),))

    def oracle() -> HindsightOracle:
        return HindsightOracle(start_s=START, end_s=START + 120.0, segment_s=60.0, gammas=range(4),
                               objective=Objective("throughput"))

    probe = oracle()
    probe.replayed_start(_world_at, [schedule], static_value=0.0)
    [(_, _, value)] = probe.log
    tied = oracle()
    assert tied.replayed_start(_world_at, [schedule], static_value=value) == 3
    worse = oracle()
    assert worse.replayed_start(_world_at, [schedule], static_value=value * 1.0001 + 1e-9) is None
    assert not worse._at_boundary(START + 35.0)  # a replay not taken leaves the boundaries as they were
