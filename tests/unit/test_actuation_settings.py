"""The `actuation` settings section: defaults, per-mode validation with clear messages, the write token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import Settings, SettingsError, load_settings, write_token

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
TARGETS = [{"name": "a", "url": "http://127.0.0.1:8000"}, {"name": "b", "url": "http://127.0.0.1:8001"}]


def settings(**actuation: Any) -> Settings:
    return load_settings(overrides={"targets": TARGETS, "actuation": actuation})


def test_default_is_recommend_only_with_the_documented_gate() -> None:
    a = load_settings(overrides={"targets": TARGETS}).actuation
    assert a.mode == "recommend-only" and not a.enabled and a.targets == []
    g = a.gate
    assert (g.dwell_s, g.cooldown_s, g.max_actions_per_hour, g.max_actions_per_day) == (300, 900, 2, 8)
    # The example file lists every field of the section, and of each of its sections, with its default.
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["actuation"]
    assert set(example) == set(type(a).model_fields)
    for name in ("gate", "schedule", "kubernetes", "api"):
        assert set(example[name]) == set(type(getattr(a, name)).model_fields), name
    assert load_settings(EXAMPLE).actuation == a.model_copy(update={"state_dir": Path("/var/lib/spec-advisor")})


def test_kubernetes_and_schedule_modes_need_a_deployment() -> None:
    for mode in ("kubernetes", "schedule"):
        with pytest.raises(SettingsError, match=f"target a: mode {mode} needs deployment"):
            settings(mode=mode, targets=[{"target": "a"}])
    ok = settings(mode="schedule", targets=[{"target": "a", "deployment": "vllm-a", "container": "vllm"}])
    assert ok.actuation.enabled and ok.actuation.targets[0].deployment == "vllm-a"


def test_routing_needs_route_backends_and_the_on_pool_k() -> None:
    with pytest.raises(SettingsError, match="mode routing needs on_backend, off_backend, on_pool_k"):
        settings(mode="routing", targets=[{"target": "a", "route": "r"}])
    with pytest.raises(SettingsError, match="must differ"):
        settings(mode="routing", targets=[{"target": "a", "route": "r", "on_backend": "x", "off_backend": "x",
                                           "on_pool_k": 3}])
    with pytest.raises(SettingsError, match="deployment do not apply in mode routing"):
        settings(mode="routing", targets=[{"target": "a", "route": "r", "on_backend": "x", "off_backend": "y",
                                           "on_pool_k": 3, "deployment": "d"}])


def test_an_acting_mode_needs_targets_that_exist_once() -> None:
    with pytest.raises(SettingsError, match=r"needs actuation\.targets"):
        settings(mode="kubernetes")
    with pytest.raises(SettingsError, match="not configured: c"):
        settings(mode="kubernetes", targets=[{"target": "c", "deployment": "d"}])
    with pytest.raises(SettingsError, match="repeated: a"):
        settings(mode="kubernetes", targets=[{"target": "a", "deployment": "d"}, {"target": "a", "deployment": "e"}])


def test_bad_values_are_named() -> None:
    with pytest.raises(SettingsError, match=r"actuation\.mode"):
        settings(mode="yolo")
    with pytest.raises(SettingsError, match="deployment"):
        settings(mode="kubernetes", targets=[{"target": "a", "deployment": "Not_A_Name"}])
    with pytest.raises(SettingsError, match="api_url"):
        settings(kubernetes={"api_url": "ftp://kube"})
    with pytest.raises(SettingsError, match=r"actuation\.gate: .*max_actions_per_day must be at least"):
        settings(mode="kubernetes", targets=[{"target": "a", "deployment": "d"}],
                 gate={"max_actions_per_hour": 5, "max_actions_per_day": 3})
    with pytest.raises(SettingsError, match="dwel"):
        settings(gate={"dwel_s": 3})  # a typo is an error, not a silent default


@pytest.mark.parametrize(("old", "new"), [
    ("dwell_s", "gate.dwell_s"),
    ("skip_log_interval_s", "gate.skip_log_interval_s"),
    ("schedule_max_num_seqs", "schedule.max_num_seqs"),
    ("namespace", "kubernetes.namespace"),
    ("kube_timeout_s", "kubernetes.timeout_s"),
    ("write_token_file", "api.write_token_file"),
    ("max_override_s", "api.max_override_s"),
])
def test_a_flat_key_that_moved_is_refused_naming_its_new_place(old: str, new: str) -> None:
    with pytest.raises(SettingsError, match=rf"actuation\.{old} moved: use actuation\.{new}"):
        settings(**{old: 1})


def test_a_moved_key_from_the_environment_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ADVISOR_ACTUATION__DWELL_S", "60")
    with pytest.raises(SettingsError, match=r"actuation\.dwell_s moved: use actuation\.gate\.dwell_s"):
        settings()


def test_nested_keys_reach_the_gate_runner_and_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ADVISOR_ACTUATION__GATE__COOLDOWN_S", "120")
    a = settings(dry_run=True, gate={"dwell_s": 60, "max_actions_per_hour": 3, "min_schedule_change_share": 0.2},
                 schedule={"max_num_seqs": 64}, kubernetes={"namespace": "llm", "timeout_s": 5}).actuation
    config = a.gate.to_config(dry_run=a.dry_run)
    assert (config.dwell_s, config.cooldown_s, config.max_actions_per_hour) == (60, 120, 3)
    assert (config.max_actions_per_day, config.min_schedule_change_share, config.dry_run) == (8, 0.2, True)
    assert (a.schedule.max_num_seqs, a.kubernetes.namespace, a.kubernetes.timeout_s) == (64, "llm", 5)


def test_write_token_from_file_or_env(tmp_path: Path) -> None:
    a = settings().actuation
    assert write_token(a, {"SPEC_ADVISOR_ACTIONS_TOKEN": " t0k-0123456789abcdef \n"}) == "t0k-0123456789abcdef"
    assert write_token(a, {}) is None
    assert write_token(a, {"SPEC_ADVISOR_ACTIONS_TOKEN": "  "}) is None  # blank is no token
    token_file = tmp_path / "token"
    token_file.write_text("from-file-0123456789\n", encoding="utf-8")
    from_file = settings(api={"write_token_file": str(token_file)}).actuation
    assert write_token(from_file, {"SPEC_ADVISOR_ACTIONS_TOKEN": "env-0123456789abcdef"}) == "from-file-0123456789"
    with pytest.raises(SettingsError, match="cannot read"):
        write_token(settings(api={"write_token_file": str(tmp_path / "missing")}).actuation, {})


def test_a_write_token_shorter_than_16_characters_is_refused(tmp_path: Path) -> None:
    a = settings().actuation
    with pytest.raises(SettingsError, match="SPEC_ADVISOR_ACTIONS_TOKEN: the write token has 15 characters"):
        write_token(a, {"SPEC_ADVISOR_ACTIONS_TOKEN": "x" * 15})
    assert write_token(a, {"SPEC_ADVISOR_ACTIONS_TOKEN": "x" * 16}) == "x" * 16  # 16 is enough
    token_file = tmp_path / "token"
    token_file.write_text("short\n", encoding="utf-8")  # 5 characters once stripped
    with pytest.raises(SettingsError, match=r"write_token_file .*5 characters, fewer than 16"):
        write_token(settings(api={"write_token_file": str(token_file)}).actuation, {})


def test_the_token_env_var_is_not_mistaken_for_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ADVISOR_ACTIONS_TOKEN", "x")
    monkeypatch.setenv("SPEC_ADVISOR_ACTUATION__DRY_RUN", "true")
    assert settings().actuation.dry_run is True
