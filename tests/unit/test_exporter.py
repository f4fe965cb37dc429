"""The exporter: families built from the Board at scrape time, on a fresh private registry per test."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.types import (
    AcceptanceEvidence,
    CurvePoint,
    DataState,
    Decision,
    Evidence,
    GpuSnapshot,
    Why,
    WhyCode,
)
from service.board import Board, Pricing
from service.exporter import MetricsPage, build_registry
from service.sources.errors import ScrapeErrorReason

NOW_S = 1_800_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
IDS = {"target": "llama", "model": MODEL}


def make_evidence(**overrides: object) -> Evidence:
    base = Evidence(
        target="llama",
        model=MODEL,
        at_s=NOW_S,
        state=DataState.OK,
        speculation_on=True,
        deployed_k=3,
        acceptance=AcceptanceEvidence(
            per_position=(0.8, 0.6, 0.4),
            per_position_low=(0.78, 0.57, 0.37),
            per_position_high=(0.82, 0.63, 0.43),
            drafts=1000.0,
            draft_tokens=3000.0,
            accepted_tokens=1800.0,
            mean_acceptance_length=2.8,
            acceptance_rate=0.6,
            mean_proposed_length=3.0,
            window_s=60.0,
        ),
        batch=12.0,
        waiting=2.0,
        step_time_s=0.025,
        gpu=GpuSnapshot(
            taken_at_s=NOW_S,
            source="nvml",
            device_name="NVIDIA H100 80GB HBM3",
            device_count=1,
            gpu_util_ratio=0.97,
            tensor_active_ratio=0.31,
            dram_active_ratio=0.72,
            activity_source="gpm",
        ),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def make_decision(**overrides: object) -> Decision:
    base = Decision(
        target="llama",
        model=MODEL,
        state=DataState.OK,
        enabled=True,
        num_speculative_tokens=3,
        expected_speedup=1.42,
        expected_speedup_low=1.31,
        expected_speedup_high=1.55,
        reason="on",
        evaluated_at_s=NOW_S,
        curve=(
            CurvePoint(gamma=0, speedup=1.0, speedup_low=1.0, speedup_high=1.0, expected_accepted_length=1.0,
                       step_time_s=0.02),
            CurvePoint(gamma=3, speedup=1.42, speedup_low=1.31, speedup_high=1.55, expected_accepted_length=2.8,
                       step_time_s=0.03),
        ),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def published_board() -> Board:
    board = Board([("llama", None)], started_at_s=NOW_S - 100)
    board.publish("llama", evidence=make_evidence(), decision=make_decision(), good_scrape_s=NOW_S - 10)
    return board


def test_recommendation_and_acceptance_families() -> None:
    registry = build_registry(published_board(), clock=lambda: NOW_S, version="1.2.3")
    value = registry.get_sample_value

    assert value("specadvisor_recommended_enabled", IDS) == 1.0
    assert value("specadvisor_recommended_num_speculative_tokens", IDS) == 3.0
    assert value("specadvisor_expected_speedup", IDS) == 1.42
    assert value("specadvisor_expected_speedup_low", IDS) == 1.31
    assert value("specadvisor_expected_speedup_high", IDS) == 1.55
    assert value("specadvisor_predicted_speedup", {**IDS, "gamma": "3"}) == 1.42
    assert value("specadvisor_acceptance_per_position_ratio", {**IDS, "position": "0"}) == 0.8
    assert value("specadvisor_acceptance_per_position_ratio", {**IDS, "position": "2"}) == 0.4
    assert value("specadvisor_mean_acceptance_length_tokens", IDS) == 2.8
    assert value("specadvisor_acceptance_rate_ratio", IDS) == 0.6
    assert value("specadvisor_batch_requests", IDS) == 12.0
    assert value("specadvisor_waiting_requests", IDS) == 2.0
    assert value("specadvisor_deployed_num_speculative_tokens", IDS) == 3.0
    assert value("specadvisor_step_time_seconds", IDS) == 0.025
    assert value("specadvisor_build_info", {"version": "1.2.3"}) == 1.0


def test_calibration_error_and_objective_come_from_the_decision() -> None:
    board = Board([("llama", None)], started_at_s=NOW_S - 100)
    decision = make_decision(objective="capacity", calibration_error_ratio=0.041)
    board.publish("llama", evidence=make_evidence(), decision=decision, good_scrape_s=NOW_S - 10)
    page = MetricsPage(board, clock=lambda: NOW_S, version="x")
    samples = parse(page.render())
    ids = (("model", MODEL), ("target", "llama"))
    assert samples[("specadvisor_calibration_relative_error_ratio", ids)] == 0.041
    assert samples[("specadvisor_objective_info", (ids[0], ("objective", "capacity"), ids[1]))] == 1.0

    # The next decision held (insufficient data: no curve, so no objective) and has no calibration point yet:
    # both series go away with the re-rendered page rather than keep the previous values.
    held = make_decision(state=DataState.INSUFFICIENT_DATA, objective="", calibration_error_ratio=None)
    board.publish("llama", evidence=make_evidence(), decision=held, good_scrape_s=NOW_S)
    names = {name for name, _ in parse(page.render())}
    assert "specadvisor_calibration_relative_error_ratio" not in names
    assert "specadvisor_objective_info" not in names


def test_cost_model_series_wait_for_the_first_good_scrape() -> None:
    board = Board([("llama", MODEL)], started_at_s=NOW_S)
    early = make_decision(objective="latency", calibration_error_ratio=0.2)
    board.publish("llama", evidence=make_evidence(), decision=early, good_scrape_s=None)
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    assert registry.get_sample_value("specadvisor_calibration_relative_error_ratio", IDS) is None
    assert registry.get_sample_value("specadvisor_objective_info", {**IDS, "objective": "latency"}) is None


def test_decision_causes_are_labelled_by_code_from_zero() -> None:
    why = (Why(WhyCode.BEST, (("gamma", 3.0),)), Why(WhyCode.WAITING, (("left_s", 20.0),)))
    board = Board([("llama", None)], started_at_s=NOW_S - 100)
    board.publish("llama", evidence=make_evidence(), decision=make_decision(why=why), good_scrape_s=NOW_S - 10)
    value = build_registry(board, clock=lambda: NOW_S, version="1").get_sample_value
    assert value("specadvisor_decision_cause", {**IDS, "code": "best"}) == 1.0
    assert value("specadvisor_decision_cause", {**IDS, "code": "waiting"}) == 1.0
    # Every other code is present at 0, so a cause that appears is a change, not a new series.
    assert all(
        value("specadvisor_decision_cause", {**IDS, "code": code.value}) == 0.0
        for code in WhyCode if code not in (WhyCode.BEST, WhyCode.WAITING)
    )


def test_decision_state_is_one_hot() -> None:
    registry = build_registry(published_board(), clock=lambda: NOW_S, version="x")
    states = {s.value: registry.get_sample_value("specadvisor_decision_state", {**IDS, "state": s.value})
              for s in DataState}
    assert states == {"ok": 1.0, "insufficient_data": 0.0, "stale": 0.0, "error": 0.0}


def test_gpu_signals_keep_their_source() -> None:
    registry = build_registry(published_board(), clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value
    assert value("specadvisor_gpu_utilization_ratio", {**IDS, "signal": "gpu_util", "source": "nvml"}) == 0.97
    assert value("specadvisor_gpu_utilization_ratio", {**IDS, "signal": "tensor_active", "source": "gpm"}) == 0.31
    assert value("specadvisor_gpu_utilization_ratio", {**IDS, "signal": "dram_active", "source": "gpm"}) == 0.72
    # sm_active was not measured: absent, not 0.
    assert value("specadvisor_gpu_utilization_ratio", {**IDS, "signal": "sm_active", "source": "gpm"}) is None


def test_engine_estimated_saturation_has_source_engine() -> None:
    board = Board([("llama", None)], started_at_s=NOW_S)
    board.publish(
        "llama",
        evidence=make_evidence(gpu=None),
        decision=make_decision(),
        good_scrape_s=NOW_S,
        pricing=Pricing(engine_activity={"tensor_active": 0.4, "dram_active": 0.7}),
    )
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value
    assert value("specadvisor_gpu_utilization_ratio", {**IDS, "signal": "tensor_active", "source": "engine"}) == 0.4
    assert value("specadvisor_gpu_utilization_ratio", {**IDS, "signal": "dram_active", "source": "engine"}) == 0.7


def test_freshness_and_error_counter() -> None:
    board = published_board()
    board.record_error("llama", "timeout", "slow")
    board.record_error("llama", "timeout", "slow")
    board.record_error("llama", "connect", "refused")
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value

    assert value("specadvisor_last_good_scrape_timestamp_seconds", IDS) == NOW_S - 10
    assert value("specadvisor_last_good_scrape_age_seconds", IDS) == 10.0  # NOW - (NOW - 10)
    assert value("specadvisor_scrape_errors_total", {**IDS, "reason": "timeout"}) == 2.0
    assert value("specadvisor_scrape_errors_total", {**IDS, "reason": "connect"}) == 1.0


def test_scrape_error_reasons_start_at_zero_for_every_configured_target() -> None:
    # A counter series born at 1 has no earlier sample, so increase() misses the first error of each kind.
    board = Board([("llama", MODEL), ("idle", None)], started_at_s=NOW_S)
    board.record_error("llama", "timeout", "slow")
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value
    reasons = [r.value for r in ScrapeErrorReason] + ["internal"]
    for reason in reasons:
        expected = 1.0 if reason == "timeout" else 0.0
        assert value("specadvisor_scrape_errors_total", {**IDS, "reason": reason}) == expected
        assert value("specadvisor_scrape_errors_total", {"target": "idle", "model": "", "reason": reason}) == 0.0


def test_gpu_telemetry_errors_are_counted_by_source_and_reason() -> None:
    board = published_board()
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value
    assert value("specadvisor_gpu_telemetry_errors_total", {"source": "nvml", "reason": "nvml_error"}) is None
    version = board.version
    board.record_gpu_error("nvml", "nvml_error")
    board.record_gpu_error("nvml", "nvml_error")
    board.record_gpu_error("dcgm", "timeout")
    assert board.version > version  # a board write: cached /metrics pages re-render
    assert value("specadvisor_gpu_telemetry_errors_total", {"source": "nvml", "reason": "nvml_error"}) == 2.0
    assert value("specadvisor_gpu_telemetry_errors_total", {"source": "dcgm", "reason": "timeout"}) == 1.0
    assert value("specadvisor_gpu_telemetry_errors_total", {"source": "nvml", "reason": "unexpected"}) is None


def test_gpu_telemetry_errors_reach_the_cached_page() -> None:
    board = published_board()
    page = MetricsPage(board, clock=lambda: NOW_S, version="x")
    key = ("specadvisor_gpu_telemetry_errors_total", (("reason", "unexpected"), ("source", "nvml")))
    assert key not in parse(page.render())
    board.record_gpu_error("nvml", "unexpected")
    assert parse(page.render())[key] == 1.0


def test_a_target_never_scraped_exports_no_recommendation_values() -> None:
    # The loop publishes a decision on every tick, even when the scrape failed: before any good scrape that
    # decision is defaults (off, gamma 0, speedup 1.0) that must not read as "turn it off".
    board = Board([("llama", MODEL)], started_at_s=NOW_S)
    never = make_decision(state=DataState.ERROR, enabled=False, num_speculative_tokens=0, expected_speedup=1.0)
    board.publish("llama", evidence=make_evidence(model=""), decision=never, good_scrape_s=None)
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value
    for name in ("recommended_enabled", "recommended_num_speculative_tokens", "expected_speedup"):
        assert value(f"specadvisor_{name}", IDS) is None, name
    assert value("specadvisor_predicted_speedup", {**IDS, "gamma": "3"}) is None
    assert value("specadvisor_decision_state", {**IDS, "state": "error"}) == 1.0
    board.publish("llama", evidence=make_evidence(), decision=make_decision(enabled=False), good_scrape_s=NOW_S)
    assert value("specadvisor_recommended_enabled", IDS) == 0.0


def test_scrape_time_collection_sees_new_board_values() -> None:
    board = published_board()
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    assert registry.get_sample_value("specadvisor_recommended_enabled", IDS) == 1.0
    board.publish(
        "llama",
        evidence=make_evidence(),
        decision=make_decision(enabled=False, num_speculative_tokens=0),
        good_scrape_s=NOW_S,
    )
    assert registry.get_sample_value("specadvisor_recommended_enabled", IDS) == 0.0
    assert registry.get_sample_value("specadvisor_recommended_num_speculative_tokens", IDS) == 0.0


def test_unevaluated_target_exports_no_values_but_its_state() -> None:
    board = Board([("idle", "m")], started_at_s=NOW_S)
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    ids = {"target": "idle", "model": "m"}
    assert registry.get_sample_value("specadvisor_recommended_enabled", ids) is None
    assert registry.get_sample_value("specadvisor_batch_requests", ids) is None
    assert registry.get_sample_value("specadvisor_decision_state", {**ids, "state": "ok"}) == 0.0


def test_loop_step_histogram() -> None:
    board = published_board()
    board.timings.observe("scrape", 0.003)
    board.timings.observe("scrape", 0.2)
    board.finish_iteration(NOW_S)
    registry = build_registry(board, clock=lambda: NOW_S, version="x")
    value = registry.get_sample_value

    assert value("specadvisor_loop_step_duration_seconds_count", {"step": "scrape"}) == 2.0
    # sum = 0.003 + 0.2
    assert value("specadvisor_loop_step_duration_seconds_sum", {"step": "scrape"}) == pytest.approx(0.203)
    # 0.003 is above the 0.0025 bucket and inside 0.005; 0.2 lands in 0.25.
    assert value("specadvisor_loop_step_duration_seconds_bucket", {"step": "scrape", "le": "0.0025"}) == 0.0
    assert value("specadvisor_loop_step_duration_seconds_bucket", {"step": "scrape", "le": "0.005"}) == 1.0
    assert value("specadvisor_loop_step_duration_seconds_bucket", {"step": "scrape", "le": "0.25"}) == 2.0
    assert value("specadvisor_loop_step_duration_seconds_bucket", {"step": "scrape", "le": "+Inf"}) == 2.0
    assert value("specadvisor_loop_iterations_total") == 1.0
    assert value("specadvisor_last_iteration_timestamp_seconds") == NOW_S


def test_exposition_parses_and_follows_naming_rules() -> None:
    registry = build_registry(published_board(), clock=lambda: NOW_S, version="x")
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert families
    for family in families:
        assert family.name.startswith("specadvisor_")
        if family.type == "gauge":
            assert not family.name.endswith("_total"), family.name  # _total only on counters
    # Never on the process-global registry.
    assert REGISTRY.get_sample_value("specadvisor_build_info", {"version": "x"}) is None


# ----------------------------------------------------------------------------------------------------------------
# The /metrics page: the board's families rendered once per write, the scrape age per request.
# ----------------------------------------------------------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(page: bytes) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page.decode())
        for sample in family.samples
    }


def age_key() -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("specadvisor_last_good_scrape_age_seconds", tuple(sorted(IDS.items())))


def test_page_carries_the_same_samples_as_the_registry_each_family_once() -> None:
    board = published_board()
    board.record_error("llama", "timeout", "slow")
    board.timings.observe("scrape", 0.003)
    board.finish_iteration(NOW_S)
    page = MetricsPage(board, clock=lambda: NOW_S, version="x").render()
    assert parse(page) == parse(generate_latest(build_registry(board, clock=lambda: NOW_S, version="x")))
    names = [family.name for family in text_string_to_metric_families(page.decode())]
    assert len(names) == len(set(names))  # the age family is appended, never split or repeated


def test_page_age_moves_with_the_clock_without_a_board_write() -> None:
    now = {"s": NOW_S}
    board = published_board()  # last good scrape at NOW - 10
    page = MetricsPage(board, clock=lambda: now["s"], version="x")
    assert parse(page.render())[age_key()] == 10.0  # NOW - (NOW - 10)
    version = board.version
    now["s"] = NOW_S + 5
    assert parse(page.render())[age_key()] == 15.0  # (NOW + 5) - (NOW - 10)
    assert board.version == version


def test_page_follows_every_kind_of_board_write() -> None:
    board = published_board()
    page = MetricsPage(board, clock=lambda: NOW_S, version="x")
    enabled = ("specadvisor_recommended_enabled", tuple(sorted(IDS.items())))
    errors = ("specadvisor_scrape_errors_total", tuple(sorted({**IDS, "reason": "connect"}.items())))
    iterations: tuple[str, tuple[tuple[str, str], ...]] = ("specadvisor_loop_iterations_total", ())
    scrapes = ("specadvisor_loop_step_duration_seconds_count", (("step", "scrape"),))
    before = parse(page.render())
    # Every known scrape-error reason starts at 0 (see test_scrape_error_reasons_start_at_zero...).
    assert before[enabled] == 1.0 and before[errors] == 0.0 and before[iterations] == 0.0 and scrapes not in before

    board.publish("llama", evidence=make_evidence(), decision=make_decision(enabled=False), good_scrape_s=NOW_S)
    assert parse(page.render())[enabled] == 0.0
    board.record_error("llama", "connect", "refused")
    assert parse(page.render())[errors] == 1.0
    board.finish_iteration(NOW_S)
    assert parse(page.render())[iterations] == 1.0
    board.timings.observe("scrape", 0.2)  # timings are not a board write: they carry their own count
    assert parse(page.render())[scrapes] == 1.0


def test_board_version_grows_on_every_write() -> None:
    board = Board([("llama", None)], started_at_s=NOW_S)
    seen = [board.version]
    board.publish("llama", evidence=make_evidence(), decision=make_decision(), good_scrape_s=NOW_S)
    seen.append(board.version)
    board.record_error("llama", "timeout", "slow")
    seen.append(board.version)
    board.finish_iteration(NOW_S)
    seen.append(board.version)
    assert seen == sorted(set(seen))  # strictly increasing
    observed = board.timings.observations
    board.timings.observe("gpu", 0.001)
    assert board.timings.observations == observed + 1
