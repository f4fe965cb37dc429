"""`actuation.leader_election`: off by default, client-go's timing, checked at start with the field named, and
switched on by one env var over a settings file (what deploy/kubernetes/rbac-lease does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import SettingsError, load_settings

TARGETS = [{"name": "a", "url": "http://127.0.0.1:8000"}]
ACTING = {"mode": "kubernetes", "targets": [{"target": "a", "deployment": "vllm-a"}],
          "kubernetes": {"namespace": "llm-serving"}}


def leader_election(**values: Any) -> Any:
    return load_settings(overrides={"targets": TARGETS, "actuation": {**ACTING, "leader_election": values}}).actuation


def test_off_by_default_with_client_go_timing_in_the_acted_on_namespace() -> None:
    a = leader_election()
    le = a.leader_election
    assert le.enabled is False and le.lease_name == "spec-advisor-actuation"
    assert (le.lease_duration_s, le.renew_deadline_s, le.retry_period_s) == (15, 10.0, 2.0)
    assert a.lease_namespace == "llm-serving"
    assert leader_election(namespace="leases").lease_namespace == "leases"


@pytest.mark.parametrize(("values", "message"), [
    ({"lease_duration_s": 10, "renew_deadline_s": 10}, "must be shorter than lease_duration_s"),
    ({"lease_duration_s": 1, "renew_deadline_s": 2, "retry_period_s": 0.2}, "must be shorter than lease_duration_s"),
    ({"renew_deadline_s": 2.0, "retry_period_s": 2.0}, r"must exceed 1\.2 x retry_period_s"),
    ({"lease_duration_s": 1.5}, "lease_duration_s"),  # whole seconds: the Lease stores an integer
    ({"lease_duration_s": 0}, "lease_duration_s"),
    ({"lease_name": "Not_A_Name"}, "lease_name"),
    ({"leader": True}, "leader"),  # a typo is an error, not a silent default
])
def test_bad_values_are_named(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        leader_election(**values)


def test_recommend_only_has_nothing_to_elect_a_leader_for() -> None:
    with pytest.raises(SettingsError, match=r"leader_election\.enabled needs an acting mode"):
        load_settings(overrides={"targets": TARGETS, "actuation": {"leader_election": {"enabled": True}}})


def test_one_env_var_turns_it_on_over_a_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"targets": TARGETS, "actuation": {**ACTING, "dry_run": True}}),
                      encoding="utf-8")
    monkeypatch.setenv("SPEC_ADVISOR_ACTUATION__LEADER_ELECTION__ENABLED", "true")
    a = load_settings(config).actuation
    assert a.leader_election.enabled and a.mode == "kubernetes" and a.dry_run  # the file's section is kept
