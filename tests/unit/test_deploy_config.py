"""The shipped example settings file is valid and says what it claims."""

from __future__ import annotations

from pathlib import Path

import yaml

from service.settings import load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"


def test_example_config_loads_and_keeps_its_documented_values() -> None:
    settings = load_settings(EXAMPLE)
    (target,) = settings.targets
    assert target.name == "vllm-llama-8b"
    assert target.metrics_url == "http://127.0.0.1:8000/metrics"
    assert target.drafter.method == "eagle3"
    assert settings.gpu.telemetry == "dcgm"
    assert settings.gpu.dcgm_url is not None
    # The file states the defaults; a default changed in code without the file would make them disagree here.
    assert settings.decide.dwell_s == 120
    assert settings.estimator.window_s == 60
    assert settings.scrape_interval_s == 5
    assert settings.objective.itl_slo_s is None
    assert settings.calibration.half_life_s == 900
    # Every settings section appears in the file (a field added in code shows up in the example too).
    assert set(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))) >= {"estimator", "decide", "calibration", "gpu"}
    decide = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["decide"]
    assert set(decide) == set(type(settings.decide).model_fields)
