"""World additions for the benchmark: rolling updates across replicas (reduced capacity, no outage), mixture-of-
experts weight streaming, and the scenario validation of their fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_sim_world import BASE, T0, make_scenario, run, value

from service.sim import physics
from service.sim.scenario import ScenarioError, load_scenario, scenario_from_mapping

BENCH = Path(__file__).parents[2] / "service" / "sim" / "scenarios" / "bench"


def _error(**overrides: Any) -> str:
    data = {**BASE, **{k: {**BASE[k], **v} for k, v in overrides.items()}}
    with pytest.raises(ScenarioError) as caught:
        scenario_from_mapping(data, source="rolling.yaml")
    return str(caught.value)


# -- rolling updates -------------------------------------------------------------------------------------------


def test_rolling_update_keeps_serving_with_less_capacity_and_switches_k() -> None:
    scenario = make_scenario(
        engine={"replicas": 4, "reconfigure": "rolling"},
        workload={"arrival_rate": [{"t_s": 0, "requests_per_s": 40.0}]},
    )
    world = run(scenario, 60.0)
    running_before = world.num_running
    assert running_before >= 8
    world.set_speculation(1, now_s=T0 + 60.0)
    # 4 replicas x restart_delay_s 10 = 40 s of rollout; /metrics keeps answering throughout (no 503).
    assert world.serving
    assert world.rolling_update_remaining_s == pytest.approx(40.0)
    world.advance_to(T0 + 61.0)
    world.exposition()
    # The first replica went down at the next group boundary: its quarter of the requests (every 4th) was lost.
    assert world.lifetime.lost_requests >= running_before // 4
    assert world.num_speculative_tokens == 1
    # More than half of the replicas run k = 1 after the third restart ends (60 + 3 x 10 s): counters reset then.
    world.advance_to(T0 + 91.0)
    page = world.exposition()
    assert value(page, "vllm:generation_tokens_created") >= T0 + 90.0
    world.advance_to(T0 + 101.0)
    assert world.rolling_update_remaining_s == 0.0
    assert world.serving


def test_restart_mode_with_replicas_is_a_full_outage() -> None:
    world = run(make_scenario(engine={"replicas": 4}), 30.0)
    world.set_speculation(1, now_s=T0 + 30.0)
    assert not world.serving
    assert world.rolling_update_remaining_s == 0.0


def test_rolling_loses_fewer_requests_than_a_restart() -> None:
    lost = {}
    for mode in ("restart", "rolling"):
        world = run(make_scenario(engine={"replicas": 4, "reconfigure": mode}), 60.0)
        world.set_speculation(0, now_s=T0 + 60.0)
        world.advance_to(T0 + 120.0)
        lost[mode] = world.lifetime.lost_requests
    # restart drops everything in flight plus 10 s of arrivals (~5/s); rolling drops a quarter per replica restart.
    assert lost["rolling"] < lost["restart"]


def test_rolling_needs_more_than_one_replica() -> None:
    message = _error(engine={"reconfigure": "rolling"})
    assert "rolling.yaml" in message and "engine" in message and "replicas" in message


def test_unknown_reconfigure_mode_and_bad_replicas_name_the_field() -> None:
    assert "engine.reconfigure" in _error(engine={"reconfigure": "blue-green"})
    assert "engine.replicas" in _error(engine={"replicas": 0})


# -- mixture of experts ----------------------------------------------------------------------------------------

MOE = {"moe": {"num_experts": 4, "experts_per_token": 2, "expert_bytes": 1.0e9}}


def test_moe_streams_the_experts_its_tokens_touch() -> None:
    scenario = make_scenario(model=MOE)
    kv = 0.0
    # Uniform routing, E = 4, k = 2: one token touches 4 x (1 - (1 - 2/4)^1) = 2 experts, two tokens
    # 4 x (1 - 0.25) = 3, so bytes are weight_bytes 8e9 + 2e9 and 8e9 + 3e9.
    assert physics.forward_read_bytes(scenario, kv_tokens_read=kv, tokens=1) == pytest.approx(10.0e9)
    assert physics.forward_read_bytes(scenario, kv_tokens_read=kv, tokens=2) == pytest.approx(11.0e9)
    # A big batch touches all 4: 8e9 + 4e9.
    assert physics.forward_read_bytes(scenario, kv_tokens_read=kv, tokens=1000) == pytest.approx(12.0e9)
    dense = make_scenario()
    assert physics.forward_read_bytes(dense, kv_tokens_read=kv, tokens=1) == physics.forward_read_bytes(
        dense, kv_tokens_read=kv, tokens=1000
    )


def test_moe_makes_verification_dearer_at_batch_one() -> None:
    def ratio(scenario: Any) -> float:
        one = physics.target_step_time_s(scenario, tokens=1, kv_tokens_read=500, attention_pairs=500)
        four = physics.target_step_time_s(scenario, tokens=4, kv_tokens_read=500, attention_pairs=2000)
        return four / one

    assert ratio(make_scenario(model=MOE)) > ratio(make_scenario())


def test_impossible_routing_names_the_field() -> None:
    message = _error(model={"moe": {"num_experts": 4, "experts_per_token": 8, "expert_bytes": 1.0e9}})
    assert "rolling.yaml" in message and "model.moe" in message and "experts_per_token" in message
    assert "model.moe.expert_bytes" in _error(model={"moe": {"num_experts": 4, "experts_per_token": 2}})


# -- packaged benchmark scenarios ------------------------------------------------------------------------------


def test_packaged_bench_scenarios_validate_and_say_what_they_test() -> None:
    files = sorted(BENCH.glob("*.yaml"))
    assert len(files) >= 13
    for path in files:
        load_scenario_without_bench(path)
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# ") and len(first) > 20, path.name


def load_scenario_without_bench(path: Path) -> None:
    from service.bench.spec import load_bench_scenario  # noqa: PLC0415  (the bench section is the bench's)

    bench = load_bench_scenario(path)
    assert bench.scenario == load_scenario_via_mapping(path)


def load_scenario_via_mapping(path: Path) -> Any:
    import yaml  # noqa: PLC0415

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.pop("bench", None)
    return scenario_from_mapping(data, source=str(path))


def test_a_plain_simulator_scenario_loads_too() -> None:
    assert load_scenario(Path(__file__).parents[2] / "service" / "sim" / "scenarios" / "demo.yaml")
