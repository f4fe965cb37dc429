"""Benchmark accounting, scenario-file validation and the world hooks the benchmark adds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.bench.accounting import (
    Metrics,
    Objective,
    headline_tokens,
    nearest_rank,
    request_itl_s,
    request_ttft_s,
    summarize,
)
from service.bench.runner import RunResult
from service.bench.spec import load_bench_scenario
from service.bench.suite import scenario_objective
from service.sim.scenario import ScenarioError, default_scenario
from service.sim.world import Completion, World

SCENARIOS = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios"


def test_summarize_counts_tokens_and_token_weighted_itl() -> None:
    done = [
        # 11 tokens over 1.0 s after the first: ITL 0.1 s
        Completion(arrival_s=0.0, first_token_s=1.0, done_s=2.0, output_tokens=11),
        # 5 tokens over 0.2 s: ITL 0.05 s
        Completion(arrival_s=0.0, first_token_s=1.0, done_s=1.2, output_tokens=5),
        # one token: no inter-token gap, counts for goodput only
        Completion(arrival_s=0.0, first_token_s=1.0, done_s=1.0, output_tokens=1),
    ]
    m = summarize(done, duration_s=4.0, itl_slo_s=0.06)
    # (11 + 5 + 1) tokens / 4 s = 4.25 tokens/s
    assert m.goodput_tokens_per_s == pytest.approx(4.25)
    # token-weighted: (1.0 + 0.2) s / (10 + 4) gaps
    assert m.mean_itl_s == pytest.approx(1.2 / 14)
    # per-request ITLs 0.1 and 0.05: the 99th percentile (nearest rank) is the larger
    assert m.p99_itl_s == pytest.approx(0.1)
    # meeting 60 ms: the 5-token and the 1-token request, (5 + 1) / 4 s
    assert m.slo_goodput_tokens_per_s == pytest.approx(1.5)
    assert m.completed_requests == 3


def test_requests_in_flight_at_the_end_count_what_their_clients_received() -> None:
    done = [
        # finished: 11 tokens, first after 0.5 s, ITL 0.1 s
        Completion(arrival_s=0.0, first_token_s=0.5, done_s=1.5, output_tokens=11),
        # finished: 11 tokens, ITL 0.2 s
        Completion(arrival_s=1.0, first_token_s=1.5, done_s=3.5, output_tokens=11),
        # in flight at the end (t = 10 s): 6 tokens over the last 0.5 s, ITL 0.1 s
        Completion(arrival_s=9.0, first_token_s=9.5, done_s=10.0, output_tokens=6, complete=False),
        # in flight with no token yet: waited 7 s so far, no ITL
        Completion(arrival_s=3.0, first_token_s=-1.0, done_s=10.0, output_tokens=0, complete=False),
    ]
    m = summarize(done, duration_s=10.0, itl_slo_s=0.15)
    assert m.goodput_tokens_per_s == pytest.approx(2.8)  # (11 + 11 + 6) / 10 s
    assert m.mean_itl_s == pytest.approx(3.5 / 25)  # (1.0 + 2.0 + 0.5) s over (10 + 10 + 5) gaps
    assert m.slo_goodput_tokens_per_s == pytest.approx(1.7)  # the 0.1 s requests: (11 + 6) / 10 s
    assert (m.completed_requests, m.in_flight_requests) == (2, 2)
    # TTFTs 0.5, 0.5, 0.5 and the waiting one's 7 s so far: p50 0.5, p99 7
    assert request_ttft_s(done[3]) == pytest.approx(7.0)
    assert m.p50_ttft_s == pytest.approx(0.5) and m.p99_ttft_s == pytest.approx(7.0)
    assert m.p50_itl_s == pytest.approx(0.1) and m.p99_itl_s == pytest.approx(0.2)
    assert headline_tokens(done, itl_slo_s=None) == 28.0
    assert headline_tokens(done, itl_slo_s=0.05) == 0.0  # no request with a gap meets 50 ms


def test_world_reports_its_requests_in_flight() -> None:
    world = World(default_scenario(), seed=3, start_s=0.0, record_completions=True)
    world.advance_to(60.0)
    flying = world.in_flight()
    assert len(flying) == world.num_running + world.num_waiting > 0
    assert all(not c.complete and c.done_s == 60.0 and c.arrival_s <= 60.0 for c in flying)
    # a running request has had its first token; none has more than it asked for
    assert any(c.output_tokens > 0 and c.first_token_s >= c.arrival_s for c in flying)
    finished = world.drain_completions()
    assert finished and all(c.complete for c in finished)


def test_no_slo_means_no_slo_goodput_and_one_token_requests_have_no_itl() -> None:
    one = Completion(arrival_s=0.0, first_token_s=1.0, done_s=1.0, output_tokens=1)
    assert request_itl_s(one) is None
    m = summarize([one], duration_s=1.0, itl_slo_s=None)
    assert m.slo_goodput_tokens_per_s is None
    assert m.mean_itl_s is None and m.p99_itl_s is None


def test_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert nearest_rank(values, 0.99) == 99.0  # ceil(0.99 x 100) = 99th smallest
    assert nearest_rank([3.0], 0.99) == 3.0


def _write(tmp_path: Path, data: object, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _bench_data() -> dict[str, object]:
    data = yaml.safe_load((SCENARIOS / "bench" / "low-load.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_bench_section_errors_name_file_and_field(tmp_path: Path) -> None:
    data = _bench_data()
    data["bench"] = {"duration_s": -5, "gamma_max": 2}
    path = _write(tmp_path, data)
    with pytest.raises(ScenarioError) as info:
        load_bench_scenario(path)
    assert str(path) in str(info.value)
    assert "bench.duration_s" in str(info.value)


def test_world_errors_still_name_their_field(tmp_path: Path) -> None:
    data = _bench_data()
    engine = data["engine"]
    assert isinstance(engine, dict)
    del engine["max_num_seqs"]
    path = _write(tmp_path, data)
    with pytest.raises(ScenarioError, match=r"engine\.max_num_seqs"):
        load_bench_scenario(path)


@pytest.mark.parametrize(("section", "field"), [("hardware", "step_overhead_s"), ("engine", "restart_delay_s")])
def test_infinite_numbers_are_refused_by_name(tmp_path: Path, section: str, field: str) -> None:
    # YAML's .inf passed every bound (>= 0) and failed mid-run as a ZeroDivisionError naming nothing.
    data = _bench_data()
    part = data[section]
    assert isinstance(part, dict)
    part[field] = float("inf")
    path = _write(tmp_path, data)
    with pytest.raises(ScenarioError, match=rf"{section}\.{field}") as info:
        load_bench_scenario(path)
    assert str(path) in str(info.value)


def test_plain_simulator_scenarios_load_with_bench_defaults() -> None:
    bench = load_bench_scenario(SCENARIOS / "demo.yaml")
    assert bench.name == "demo"
    assert bench.bench.itl_slo_s is None
    # demo deploys k=3; the grid goes to max(k, 5)
    assert bench.gamma_max == 5
    # powers of 4 from 4 below max_num_seqs 256 (4, 16, 64) plus 256 / 2 = 128
    assert bench.batch_thresholds == (4, 16, 64, 128)


def test_world_records_completions_only_when_asked() -> None:
    scenario = default_scenario()
    quiet = World(scenario, seed=3, start_s=0.0)
    quiet.advance_to(60.0)
    assert quiet.drain_completions() == ()
    recording = World(scenario, seed=3, start_s=0.0, record_completions=True)
    recording.advance_to(60.0)
    done = recording.drain_completions()
    assert len(done) == recording.lifetime.completed_requests > 0
    assert all(c.arrival_s <= c.first_token_s <= c.done_s <= 60.0 for c in done)
    assert recording.drain_completions() == ()  # drained


def test_disable_by_batch_size_runs_no_drafts_at_or_above_the_threshold() -> None:
    scenario = default_scenario()  # deploys k=3
    world = World(scenario, seed=3, start_s=0.0, disable_by_batch_size=1)
    world.advance_to(60.0)
    page = world.exposition()
    # every step has at least one running request, so every step ran without drafts: no drafts counted
    drafts = [line for line in page.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total{")]
    assert drafts and all(float(line.rsplit(" ", 1)[1]) == 0.0 for line in drafts)
    assert world.lifetime.completed_requests > 0
    with pytest.raises(ValueError, match="disable_by_batch_size"):
        World(scenario, start_s=0.0, disable_by_batch_size=0)


def _metrics(*, goodput: float, mean_itl_s: float | None, slo: float | None = None, errors: float = 0.0) -> Metrics:
    return Metrics(goodput_tokens_per_s=goodput, mean_itl_s=mean_itl_s, p50_itl_s=None, p99_itl_s=None,
                   p50_ttft_s=None, p99_ttft_s=None, slo_goodput_tokens_per_s=slo, completed_requests=1,
                   in_flight_requests=0, error_tokens_per_s=errors)


def test_objectives_score_what_they_say() -> None:
    assert Objective("throughput").score(_metrics(goodput=2100.0, mean_itl_s=0.01)) == 2100.0
    slo = Objective("slo_goodput", itl_slo_s=0.02)
    assert slo.score(_metrics(goodput=2100.0, mean_itl_s=0.01, slo=1500.0)) == 1500.0
    latency = Objective("latency", floor_tokens_per_s=2000.0)
    # at the floor: 1 / 10 ms = 100 tokens/s per sequence
    assert latency.score(_metrics(goodput=2100.0, mean_itl_s=0.010)) == pytest.approx(100.0)
    # faster but 10% short of the floor: 125 x 0.9
    assert latency.score(_metrics(goodput=1800.0, mean_itl_s=0.008)) == pytest.approx(112.5)
    assert latency.score(_metrics(goodput=1800.0, mean_itl_s=None)) == 0.0
    # Errors count against every objective by the tokens the dropped requests asked for.
    assert slo.score(_metrics(goodput=2100.0, mean_itl_s=0.01, slo=1500.0, errors=300.0)) == 1200.0
    assert Objective("throughput").score(_metrics(goodput=2100.0, mean_itl_s=0.01, errors=100.0)) == 2000.0
    assert latency.score(_metrics(goodput=2100.0, mean_itl_s=0.010, errors=300.0)) == pytest.approx(90.0)


def test_a_restart_counts_the_tokens_its_dropped_requests_asked_for() -> None:
    world = World(default_scenario(), seed=3, start_s=0.0, record_completions=True)
    world.advance_to(60.0)
    dropped = world.num_running + world.num_waiting
    assert dropped > 0 and world.lifetime.lost_tokens == 0
    world.set_speculation(1, now_s=60.0)  # a restart: every request in flight or queued gets an error
    assert world.lifetime.lost_requests >= dropped
    assert world.lifetime.lost_tokens >= dropped  # each asked for at least one token
    m = summarize(world.drain_completions(), duration_s=60.0, itl_slo_s=None,
                  error_tokens=world.lifetime.lost_tokens)
    assert m.error_tokens_per_s == pytest.approx(world.lifetime.lost_tokens / 60.0)


def _run(goodput: float, slo_goodput: float) -> RunResult:
    metrics = Metrics(goodput, 0.05, 0.05, 0.06, 0.2, 0.5, slo_goodput, completed_requests=100, in_flight_requests=0)
    return RunResult(policy="static", metrics=metrics, config_changes=0, lost_requests=0, ticks=())


def test_an_slo_no_static_setting_meets_is_graded_on_throughput(tmp_path: Path) -> None:
    data = _bench_data()
    data["bench"] = {"objective": "slo_goodput", "itl_slo_s": 0.045}
    bench = load_bench_scenario(_write(tmp_path, data))
    # Every static run misses the SLO: every headline would be 0 and every ratio 0 / 0.
    unmet = scenario_objective(bench, [_run(2056.0, 0.0), _run(1541.0, 3.0)])
    assert unmet.kind == "throughput"
    assert "45 ms met by no static setting" in unmet.note
    assert unmet.score(_run(1839.0, 0.0).metrics) == pytest.approx(1839.0)
    # One static run meets it for a fair share: the SLO grades, as the scenario says.
    met = scenario_objective(bench, [_run(2056.0, 900.0), _run(1541.0, 3.0)])
    assert met.kind == "slo_goodput" and met.note == ""
    assert met.score(_run(1839.0, 700.0).metrics) == pytest.approx(700.0)
