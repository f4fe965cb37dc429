"""The benchmark with the `kubernetes` actuator in the loop: the real advisor loop, the real ActuationRunner and
gate (operator defaults: dwell 300 s, cooldown 900 s, 2 per hour), and the simulated world as the Deployment it
patches, paying the world's restart cost. Behaviour only: no timing assertions."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policies.act.deployment import ActuatorError, SpeculationSetting
from policies.act.gate import ActuationConfig, SkipReason
from service.actuators.audit import read_tail
from service.bench.actuated import ACTUATED_ADVISOR, WorldActuator, actuated_advisor_policy, actuated_settings
from service.bench.runner import EPOCH_S, RunResult, run_policy
from service.bench.spec import BenchScenario, load_bench_scenario
from service.sim.world import World

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios"
BENCH = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios" / "bench"
SCENARIO = FIXTURES / "actuated-overload-then-light.yaml"
SHIFT_S = 600.0  # the fixture's load drops from 45 to 1 request/s at t = 600..610 s
DEFAULTS = ActuationConfig()  # what an operator gets; the benchmark policy must use the same


def _spec_configs(args: list[str]) -> list[dict[str, Any]]:
    """The --speculative-config JSON values in container args (either spelling)."""
    found = []
    for i, word in enumerate(args):
        if word == "--speculative-config":
            found.append(json.loads(args[i + 1]))
        elif word.startswith("--speculative-config="):
            found.append(json.loads(word.split("=", 1)[1]))
    return found


def _patched_args(record: dict[str, Any]) -> list[str]:
    (container,) = record["patch"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "vllm"
    args = container["args"]
    assert isinstance(args, list)
    return [str(a) for a in args]


# -- the whole loop on a load shift across the crossover ------------------------------------------------------


@pytest.fixture(scope="module")
def actuated_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BenchScenario, RunResult, Path]]:
    bench = load_bench_scenario(SCENARIO)
    state_dir = tmp_path_factory.mktemp("actuated-state")
    result = asyncio.run(run_policy(bench, actuated_advisor_policy(bench, state_dir=state_dir),
                                    duration_s=bench.bench.duration_s))
    yield bench, result, state_dir / "actions.jsonl"


def test_run_policy_reports_the_actuated_advisors_goodput(
    actuated_run: tuple[BenchScenario, RunResult, Path],
) -> None:
    bench, result, _ = actuated_run
    assert result.policy == ACTUATED_ADVISOR
    # 1500 s of 5 s ticks = 300 ticks, each recorded.
    assert len(result.ticks) == round(bench.bench.duration_s / bench.bench.decision_interval_s)
    assert result.metrics.goodput_tokens_per_s > 0
    assert result.metrics.completed_requests > 0


def test_the_advisor_acts_only_through_the_gate_with_the_patch_and_the_reason(
    actuated_run: tuple[BenchScenario, RunResult, Path],
) -> None:
    bench, result, audit_path = actuated_run
    records = read_tail(audit_path).records
    actions = [r for r in records if r["kind"] == "action"]
    assert len(actions) >= 2, "overload -> less, then light -> more again: two changes across the crossover"
    for action in actions:
        assert action["result"] == "applied" and action["error"] is None
        assert action["mode"] == "kubernetes" and action["dry_run"] is False
        assert action["target_ref"] == "deployment/bench/vllm"
        assert action["reason"] == "recommendation"
        assert action["patch_type"] == "application/strategic-merge-patch+json"
        assert action["evidence"]["decision_state"] == "ok"
        k = action["desired"]["num_speculative_tokens"]
        args = _patched_args(action)
        # The rest of the command line is kept; the speculative config is there exactly when k > 0.
        assert args[:3] == [bench.scenario.model_name, "--port", "8000"]
        assert [c["num_speculative_tokens"] for c in _spec_configs(args)] == ([k] if k > 0 else [])
        assert all(c["method"] == "ngram" for c in _spec_configs(args))

    # Under overload speculation loses at every k (see the fixture): the first change cuts speculation before the
    # shift (to fewer drafts, or off: with k=3 the only k it has run, the advisor is sure that fewer drafts cost
    # less, not yet by how much plain decoding would, policies/model/uncertainty.py). The second comes after the shift,
    # held back by the cooldown until then. (Which way it goes is the decision rule's: here the plan, which still
    # weighs the overload it just left, turned k=1 off at light load, and a probe turns it on again later.)
    first, last = actions[0], actions[-1]
    assert first["desired"]["num_speculative_tokens"] < bench.scenario.drafter.num_speculative_tokens
    assert first["observed"]["num_speculative_tokens"] == bench.scenario.drafter.num_speculative_tokens
    assert first["at_s"] - EPOCH_S < SHIFT_S
    assert last["desired"]["num_speculative_tokens"] != first["desired"]["num_speculative_tokens"]
    assert last["at_s"] - EPOCH_S > SHIFT_S

    # The world ran what the runner applied, changing exactly at the action ticks and nowhere else.
    ks = [bench.scenario.drafter.num_speculative_tokens] + [t.k for t in result.ticks]
    changes = [(result.ticks[i].t_s, ks[i + 1]) for i in range(len(result.ticks)) if ks[i + 1] != ks[i]]
    assert changes == [(a["at_s"] - EPOCH_S, a["desired"]["num_speculative_tokens"]) for a in actions]

    # Never two changes closer than the cooldown (900 s), at most 2 in any hour.
    times = [float(a["at_s"]) for a in actions]
    assert all(b - a >= DEFAULTS.cooldown_s for a, b in itertools.pairwise(times))
    assert all(sum(1 for t in times if 0 <= t - start < 3600) <= DEFAULTS.max_actions_per_hour for start in times)


def test_skips_are_recorded_with_their_reasons(actuated_run: tuple[BenchScenario, RunResult, Path]) -> None:
    _, _, audit_path = actuated_run
    records = read_tail(audit_path).records
    skips = [r for r in records if r["kind"] == "skip"]
    reasons = {r["reason"] for r in skips}
    assert reasons <= {reason.value for reason in SkipReason}
    assert all(r["result"] == "skipped" and r["detail"] for r in skips)
    # Before the first action the wanted setting had to hold for the dwell; the restart each action causes
    # (20 s, several ticks) is a rollout in progress; and the change back on came while the cooldown still ran.
    assert {SkipReason.DWELL.value, SkipReason.ROLLOUT_IN_PROGRESS.value, SkipReason.COOLDOWN.value} <= reasons
    first_action = min(r["at_s"] for r in records if r["kind"] == "action")
    assert any(r["reason"] == SkipReason.DWELL.value and r["at_s"] < first_action for r in skips)
    cooldown = [r for r in skips if r["reason"] == SkipReason.COOLDOWN.value]
    assert all("cooldown left" in r["detail"] for r in cooldown)


def test_the_benchmark_uses_the_operators_default_gate(tmp_path: Path) -> None:
    bench = load_bench_scenario(SCENARIO)
    a = actuated_settings(bench, state_dir=tmp_path).actuation
    assert a.mode == "kubernetes" and not a.dry_run
    assert a.gate.to_config(dry_run=a.dry_run) == DEFAULTS
    assert a.state_dir == tmp_path


# -- the world as a Deployment -----------------------------------------------------------------------------------


def _world(name: str = "actuated-overload-then-light", *, directory: Path = FIXTURES) -> World:
    return World(load_bench_scenario(directory / f"{name}.yaml").scenario, start_s=EPOCH_S)


def test_world_actuator_restarts_the_world_and_reports_the_rollout() -> None:
    world = _world()
    actuator = WorldActuator(world)

    async def scenario() -> None:
        before = await actuator.observe(EPOCH_S)
        assert before.setting == SpeculationSetting(3) and not before.rollout_in_progress
        assert before.error is None

        result = await actuator.apply(SpeculationSetting(0), before, dry_run=False)
        assert result.applied and result.error is None
        assert world.num_speculative_tokens == 0
        assert result.resource_version is not None and result.resource_version != before.resource_version
        assert _spec_configs(list(actuator.args)) == []

        # The fixture's restart takes 20 s: still restarting 10 s in, serving again at 20 s.
        world.advance_to(EPOCH_S + 10)
        during = await actuator.observe(EPOCH_S + 10)
        assert during.rollout_in_progress and during.setting == SpeculationSetting(0)
        assert during.resource_version == result.resource_version
        world.advance_to(EPOCH_S + 20)
        after = await actuator.observe(EPOCH_S + 20)
        assert not after.rollout_in_progress

        # Back on from off: the drafter's config (method and all) comes back with the new k.
        on = await actuator.apply(SpeculationSetting(2), after, dry_run=False)
        assert on.applied and world.num_speculative_tokens == 2
        assert _spec_configs(list(actuator.args)) == [{"method": "ngram", "num_speculative_tokens": 2}]

    asyncio.run(scenario())


def test_world_actuator_dry_run_sends_nothing() -> None:
    world = _world()
    actuator = WorldActuator(world)

    async def scenario() -> None:
        observed = await actuator.observe(EPOCH_S)
        result = await actuator.apply(SpeculationSetting(1), observed, dry_run=True)
        assert result.dry_run and not result.applied and result.error is None
        assert isinstance(result.patch, dict)
        assert world.num_speculative_tokens == 3 and world.serving
        assert (await actuator.observe(EPOCH_S)).resource_version == observed.resource_version

    asyncio.run(scenario())


def test_world_actuator_refuses_a_patch_computed_before_another_writer_changed_the_engine() -> None:
    world = _world()
    actuator = WorldActuator(world)

    async def scenario() -> None:
        stale = await actuator.observe(EPOCH_S)
        world.set_speculation(1, now_s=EPOCH_S)  # someone else (kubectl edit) reconfigured the engine
        result = await actuator.apply(SpeculationSetting(0), stale, dry_run=False)
        assert result.error == ActuatorError.CONFLICT and not result.applied
        assert world.num_speculative_tokens == 1
        fresh = await actuator.observe(EPOCH_S)
        assert fresh.setting == SpeculationSetting(1) and fresh.resource_version != stale.resource_version

    asyncio.run(scenario())


def test_world_actuator_reports_a_rolling_update_in_progress() -> None:
    world = _world("rolling-update", directory=BENCH)
    actuator = WorldActuator(world)
    replicas = world.scenario.engine.replicas
    delay = world.scenario.engine.restart_delay_s

    async def scenario() -> None:
        observed = await actuator.observe(EPOCH_S)
        k = world.num_speculative_tokens
        result = await actuator.apply(SpeculationSetting(0 if k else 1), observed, dry_run=False)
        assert result.applied
        # Replica j restarts at j x delay; the last one is back at replicas x delay (4 x 20 s = 80 s).
        world.advance_to(EPOCH_S + delay)
        assert (await actuator.observe(EPOCH_S + delay)).rollout_in_progress
        world.advance_to(EPOCH_S + replicas * delay + 1)
        assert not (await actuator.observe(EPOCH_S + replicas * delay + 1)).rollout_in_progress

    asyncio.run(scenario())
