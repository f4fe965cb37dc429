"""What a benchmark scenario's advisor section reaches: every field gets to the advisor's settings or is refused
with its path (settings the benchmark sets itself were silently overridden before)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.bench.pipeline import bench_advisor_settings
from service.bench.spec import load_bench_scenario
from service.cli.command import main
from service.sim.scenario import ScenarioError

SCENARIOS = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios"


def _with_advisor(tmp_path: Path, advisor: dict[str, Any]) -> Path:
    data = yaml.safe_load((SCENARIOS / "bench" / "low-load.yaml").read_text(encoding="utf-8"))
    data["bench"]["advisor"] = {**data["bench"].get("advisor", {}), **advisor}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_tensor_parallel_reaches_the_advisor(tmp_path: Path) -> None:
    bench = load_bench_scenario(_with_advisor(tmp_path, {"tensor_parallel": 8, "model_profile": "llama-3.1-70b"}))
    [target] = bench_advisor_settings(bench).targets
    assert target.tensor_parallel == 8
    assert target.model_profile == "llama-3.1-70b"


def _with_gamma_max(tmp_path: Path, gamma_max: int | None, settings: dict[str, Any] | None = None) -> Path:
    data = yaml.safe_load((SCENARIOS / "bench" / "low-load.yaml").read_text(encoding="utf-8"))
    data["bench"].pop("gamma_max", None)
    if gamma_max is not None:
        data["bench"]["gamma_max"] = gamma_max
    if settings is not None:
        data["bench"]["advisor"] = {**data["bench"].get("advisor", {}), "settings": settings}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_the_advisor_may_run_every_gamma_the_static_runs_do(tmp_path: Path) -> None:
    # bench.gamma_max 12: the fixed-gamma runs and the oracle range over 0..12, and so does the advisor.
    assert bench_advisor_settings(load_bench_scenario(_with_gamma_max(tmp_path, 12))).decide.gamma_max == 12
    # Unset (max(k = 3, 5) = 5): never fewer than the sidecar's own default, 8.
    assert bench_advisor_settings(load_bench_scenario(_with_gamma_max(tmp_path, None))).decide.gamma_max == 8
    # The scenario's own advisor settings say what its operator configured, and win.
    bench = load_bench_scenario(_with_gamma_max(tmp_path, 12, {"decide": {"gamma_max": 10}}))
    assert bench_advisor_settings(bench).decide.gamma_max == 10


def _draft_model_advisor(tmp_path: Path, advisor: dict[str, Any]) -> Path:
    data = yaml.safe_load((SCENARIOS / "bench" / "draft-model.yaml").read_text(encoding="utf-8"))
    data["bench"]["advisor"] = {**data["bench"]["advisor"], "tensor_parallel": 4, "model_profile": "llama-3.1-70b",
                                **advisor}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_the_draft_models_own_tensor_parallel_reaches_the_advisor(tmp_path: Path) -> None:
    [target] = bench_advisor_settings(load_bench_scenario(_draft_model_advisor(tmp_path, {}))).targets
    assert target.drafter.tensor_parallel is None  # unset: the target's 4, as vLLM does
    bench = load_bench_scenario(_draft_model_advisor(tmp_path, {"draft_tensor_parallel": 1}))
    [target] = bench_advisor_settings(bench).targets
    assert (target.tensor_parallel, target.drafter.tensor_parallel) == (4, 1)


def test_a_draft_tensor_parallel_vllm_would_refuse_is_a_file_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _draft_model_advisor(tmp_path, {"draft_tensor_parallel": 3})
    assert main(["bench", str(path), "--no-plots", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: invalid bench.advisor" in err
    assert "drafter.tensor_parallel must be 1 or the target's tensor_parallel (4), got 3" in err


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"targets": [{"name": "x", "url": "http://a/metrics", "tensor_parallel": 8}]}, "settings.targets"),
        ({"gpu": {"telemetry": "nvml"}}, "settings.gpu"),
        ({"scrape_interval_s": 1}, "settings.scrape_interval_s"),
        ({"objective": {"itl_slo_s": 0.02}, "decide": {"dwell_s": 60}}, "settings.objective.itl_slo_s"),
    ],
)
def test_settings_the_benchmark_sets_itself_are_refused_by_path(
    tmp_path: Path, settings: dict[str, Any], field: str
) -> None:
    path = _with_advisor(tmp_path, {"settings": settings})
    with pytest.raises(ScenarioError) as info:
        load_bench_scenario(path)
    message = str(info.value)
    assert str(path) in message and field in message and "bench.advisor" in message


def test_other_sidecar_settings_reach_the_advisor(tmp_path: Path) -> None:
    bench = load_bench_scenario(_with_advisor(tmp_path, {"settings": {"decide": {"dwell_s": 60}}}))
    assert bench_advisor_settings(bench).decide.dwell_s == 60


def test_a_catalog_miss_is_a_file_error_that_suggests_the_nearest_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_advisor(tmp_path, {"model_profile": "llama-3.1-8b-instrct"})
    assert main(["bench", str(path), "--no-plots", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: invalid bench.advisor" in err
    assert "did you mean llama-3.1-8b" in err and "model_config_path" in err


def test_a_config_json_next_to_the_scenario_describes_a_model_the_catalog_lacks(tmp_path: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }
    (tmp_path / "my-model.json").write_text(json.dumps(config), encoding="utf-8")
    bench = load_bench_scenario(_with_advisor(tmp_path, {"model_profile": None, "model_config_path": "my-model.json"}))
    [target] = bench_advisor_settings(bench).targets
    assert target.model_config_path == tmp_path / "my-model.json"  # relative to the scenario file
    assert target.model_profile is None
    with pytest.raises(ScenarioError, match="exactly one of model_profile and model_config_path"):
        load_bench_scenario(_with_advisor(tmp_path, {"model_config_path": "my-model.json"}))


@pytest.mark.parametrize(
    ("bench", "message"),
    [
        ({"objective": "slo_goodput", "itl_slo_s": None}, "objective slo_goodput needs itl_slo_s"),
        ({"objective": "latency", "itl_slo_s": 0.02}, "an SLO is graded as slo_goodput"),
        ({"oracle_segment_s": 7, "decision_interval_s": 5}, "whole multiple of decision_interval_s"),
    ],
)
def test_the_objective_and_the_oracle_segment_are_checked(
    tmp_path: Path, bench: dict[str, Any], message: str
) -> None:
    data = yaml.safe_load((SCENARIOS / "bench" / "low-load.yaml").read_text(encoding="utf-8"))
    data["bench"] = {**data["bench"], **bench}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ScenarioError, match=message):
        load_bench_scenario(path)


def test_every_packaged_scenario_states_its_objective() -> None:
    files = sorted(SCENARIOS.glob("*/*.yaml"))  # bench/ and every held-out set
    assert len(files) >= 40
    for path in files:
        assert load_bench_scenario(path).bench.objective is not None, path.name
