"""The decide section of the settings reaches the pure DecideConfig the loop uses (DecideSettings.to_config)."""

from __future__ import annotations

import pytest

from policies.decide.rule import DecideConfig
from policies.estimate.window import EstimatorConfig
from policies.model.calibrate import CalibrationConfig
from policies.model.objectives import ObjectiveConfig
from service.settings import SettingsError, load_settings

TARGET = {"name": "a", "url": "http://127.0.0.1:8000/metrics"}


def test_every_decide_setting_reaches_the_policy() -> None:
    decide = {"margin": 0.07, "dwell_s": 45.0, "confirm_s": 15.0, "gamma_max": 6, "change_cost_s": 25.0,
              "payback_horizon_s": 900.0, "explore": False, "probe_timeout_s": 600.0, "probe_backoff_s": 7200.0}
    config = load_settings(None, overrides={"targets": [TARGET], "decide": decide}).decide.to_config()
    assert {name: getattr(config, name) for name in decide} == decide


@pytest.mark.parametrize("bad", [{"probe_timeout_s": 0}, {"probe_backoff_s": -1}, {"change_cost_s": float("nan")},
                                 {"confirm_s": -1}, {"margin": 2}])
def test_impossible_decide_values_are_refused_by_name(bad: dict[str, float]) -> None:
    with pytest.raises(SettingsError, match=next(iter(bad))):
        load_settings(None, overrides={"targets": [TARGET], "decide": bad})


def test_a_confirm_longer_than_the_dwell_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"confirm_s \(200\) must not exceed decide.dwell_s \(120\)"):
        load_settings(None, overrides={"targets": [TARGET], "decide": {"confirm_s": 200, "dwell_s": 120}})
    load_settings(None, overrides={"targets": [TARGET], "decide": {"confirm_s": 120, "dwell_s": 120}})


def test_the_default_confirm_follows_a_shorter_dwell() -> None:
    config = load_settings(None, overrides={"targets": [TARGET], "decide": {"dwell_s": 10}}).decide.to_config()
    assert config.confirm_s == 10.0 and config.dwell_s == 10.0


@pytest.mark.parametrize(("key", "says"), [("min_speedup_gain_to_change_gamma", "margin"),
                                           ("planned_confirm_s", "confirm_s"),
                                           ("decisive_gain", "cost / expected gain")])
def test_a_replaced_setting_names_its_replacement(key: str, says: str) -> None:
    with pytest.raises(SettingsError, match=rf"decide.{key} was replaced: .*{says}"):
        load_settings(None, overrides={"targets": [TARGET], "decide": {key: 0.1}})


def test_defaults_are_the_policies_own() -> None:
    # Each default is declared once, in the policy config: untouched settings build exactly the policy defaults.
    settings = load_settings(None, overrides={"targets": [TARGET]})
    assert settings.decide.to_config() == DecideConfig()
    assert settings.estimator.to_config() == EstimatorConfig()
    assert settings.calibration.to_config() == CalibrationConfig()
    assert settings.objective.to_config() == ObjectiveConfig()


def test_every_estimator_setting_reaches_the_policy() -> None:
    estimator = {"window_s": 30.0, "min_drafts": 50, "z": 2.576, "stale_after_s": 12.0}
    config = load_settings(None, overrides={"targets": [TARGET], "estimator": estimator}).estimator.to_config()
    assert {name: getattr(config, name) for name in estimator} == estimator
