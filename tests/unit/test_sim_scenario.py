"""Scenario files: the packaged demo loads, YAML and JSON round-trip, and bad files fail with the field's path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from service.sim.scenario import Scenario, ScenarioError, default_scenario, load_scenario, scenario_from_mapping


def demo_data() -> dict[str, Any]:
    data: dict[str, Any] = default_scenario().model_dump(mode="json")
    return copy.deepcopy(data)


def error_for(data: Any) -> str:
    with pytest.raises(ScenarioError) as caught:
        scenario_from_mapping(data, source="test.yaml")
    return str(caught.value)


def test_default_scenario_is_the_packaged_demo() -> None:
    scenario = default_scenario()
    assert scenario.model_name == "demo-llama-8b"
    assert scenario.drafter.num_speculative_tokens > 0
    rates = [p.requests_per_s for p in scenario.workload.arrival_rate]
    # The demo must swing load across the crossover within a few minutes.
    assert max(rates) >= 10 * min(rates)
    assert scenario.workload.period_s <= 600


def test_yaml_and_json_files_load_to_the_same_scenario(tmp_path: Path) -> None:
    data = demo_data()
    as_yaml = tmp_path / "s.yaml"
    as_json = tmp_path / "s.json"
    as_yaml.write_text(yaml.safe_dump(data), encoding="utf-8")
    as_json.write_text(json.dumps(data), encoding="utf-8")
    assert load_scenario(as_yaml) == load_scenario(str(as_json)) == default_scenario()


def test_packaged_scenarios_all_validate() -> None:
    folder = Path(__file__).parents[2] / "service" / "sim" / "scenarios"
    files = sorted(folder.glob("*.yaml"))
    assert len(files) >= 3
    for path in files:
        assert isinstance(load_scenario(path), Scenario)


def test_scenario_is_frozen() -> None:
    scenario = default_scenario()
    with pytest.raises(ValidationError):
        scenario.model_name = "other"


def test_unknown_field_names_its_path() -> None:
    data = demo_data()
    data["drafter"]["colour"] = "blue"
    message = error_for(data)
    assert "test.yaml" in message
    assert "drafter.colour" in message


def test_negative_rate_names_the_knot() -> None:
    data = demo_data()
    data["workload"]["arrival_rate"][1]["requests_per_s"] = -3
    assert "workload.arrival_rate[1].requests_per_s" in error_for(data)


def test_unknown_method_is_refused_with_the_choices() -> None:
    data = demo_data()
    data["drafter"]["method"] = "medusa"
    message = error_for(data)
    assert "drafter.method" in message
    assert "'medusa'" in message
    assert "eagle" in message


def test_rate_knots_must_increase_and_start_at_zero() -> None:
    data = demo_data()
    data["workload"]["arrival_rate"] = [{"t_s": 0, "requests_per_s": 1}, {"t_s": 0, "requests_per_s": 2}]
    assert "strictly increasing" in error_for(data)
    data["workload"]["arrival_rate"] = [{"t_s": 5, "requests_per_s": 1}]
    assert "start at t_s = 0" in error_for(data)


def test_lengths_must_fit_the_model() -> None:
    data = demo_data()
    data["engine"]["max_model_len"] = 1000
    assert "max_model_len" in error_for(data)


def test_lookup_methods_have_no_draft_model() -> None:
    data = demo_data()
    data["drafter"]["method"] = "ngram"
    message = error_for(data)
    assert "drafter" in message
    assert "no draft model" in message


def test_acceptance_must_be_a_probability() -> None:
    data = demo_data()
    data["drafter"]["conditional_acceptance"] = [0.9, 1.5]
    assert "drafter.conditional_acceptance[1]" in error_for(data)


def test_missing_section_is_named() -> None:
    data = demo_data()
    del data["engine"]
    assert "engine: Field required" in error_for(data)


def test_unreadable_or_malformed_files_are_scenario_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model_name: [unclosed", encoding="utf-8")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ScenarioError, match="mapping at the top level"):
        load_scenario(listed)
