"""GET /v1/actions and the write endpoints over real HTTP, with the runner wired into the sidecar's loop (a fake
Actuator stands in for Kubernetes): auth (none / wrong / right token), validation, refuse-to-start."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from actuation_fakes import FakeActuator
from fastapi import FastAPI
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from policies.act.deployment import SpeculationSetting
from policies.act.gate import ActuationConfig
from service.actuators.audit import AuditLog
from service.actuators.base import Actuator
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.app import build_sidecar
from service.board import Board
from service.http.actions import create_actions_router, install_auth_errors
from service.settings import Settings, SettingsError, load_settings
from service.sources.gpu import NoGpuSource

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def settings_for(url: str, state_dir: Path, **actuation: Any) -> Settings:
    return load_settings(overrides={
        "targets": [{"name": "llama", "url": url, "hardware": "h100-sxm", "drafter": {"method": "eagle"}}],
        "scrape_interval_s": 0.1,
        "scrape_timeout_s": 0.1,
        "estimator": {"window_s": 0.4, "stale_after_s": 0.5},
        "decide": {"dwell_s": 0},
        "gpu": {"telemetry": "none"},
        "actuation": {"mode": "kubernetes", "gate": {"dwell_s": 0}, "state_dir": str(state_dir),
                      "targets": [{"target": "llama", "deployment": "vllm-llama-8b"}], **actuation},
    })


def run(
    tmp_path: Path,
    check: Callable[[httpx.AsyncClient, FakeActuator], Awaitable[None]],
    *,
    environ: dict[str, str] | None = None,
    **actuation: Any,
) -> None:
    # Runs something implausible, so whatever the recommendation is, the runner has a change to make.
    fake = FakeActuator(setting=SpeculationSetting(7))

    async def scenario() -> None:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url:
            actuators: dict[str, Actuator] = {"llama": fake}
            sidecar = build_sidecar(
                settings_for(capture_url, tmp_path / "state", **actuation), gpu_source=NoGpuSource(),
                actuators=actuators, environ={"SPEC_ADVISOR_ACTIONS_TOKEN": TOKEN} if environ is None else environ,
            )
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                await check(client, fake)

    asyncio.run(scenario())


def test_the_loop_drives_the_runner_and_get_actions_shows_the_action(tmp_path: Path) -> None:
    async def check(client: httpx.AsyncClient, fake: FakeActuator) -> None:
        body = (await wait_for(client, "/v1/actions",
                               lambda r: r.json()["targets"][0]["actions"].get("applied") == 1)).json()
        assert body["mode"] == "kubernetes" and body["dry_run"] is False and body["write_endpoints"] is True
        (target,) = body["targets"]
        assert target["target"] == "llama" and target["target_ref"] == "deployment/llm/vllm"
        assert target["actions_last_hour"] == 1 and target["cooldown_remaining_s"] > 0
        (action,) = [r for r in body["records"] if r["kind"] == "action"]
        assert action["result"] == "applied" and action["patch"] is not None
        assert action["observed"] == {"num_speculative_tokens": 7, "schedule": []}
        # One live action: the patch computed first (a dry run, recorded as action_started), then sent once.
        assert [dry for _, dry in fake.applied] == [True, False] and fake.applied[1][0] != SpeculationSetting(7)
        metrics = (await client.get("/metrics")).text
        assert 'specadvisor_actions_total{mode="kubernetes",result="applied",target="llama"} 1.0' in metrics
        assert 'specadvisor_actuation_paused{target="llama"} 0.0' in metrics
        # Bounded and filtered reads.
        assert len((await client.get("/v1/actions", params={"limit": 1})).json()["records"]) == 1
        assert (await client.get("/v1/actions", params={"limit": 0})).status_code == 422
        missing = await client.get("/v1/actions", params={"target": "nope"})
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"

    run(tmp_path, check)
    # The audit log is on disk, where the settings said.
    assert (tmp_path / "state" / "actions.jsonl").read_text(encoding="utf-8").count('"kind":"action"') == 1


def test_write_endpoints_need_the_bearer_token(tmp_path: Path) -> None:
    async def check(client: httpx.AsyncClient, fake: FakeActuator) -> None:
        body = {"target": "llama", "reason": "maintenance"}
        none = await client.post("/v1/actions/pause", json=body)
        assert none.status_code == 401 and none.json()["error"] == "unauthorized"
        assert none.headers["www-authenticate"].startswith("Bearer")
        basic = await client.post("/v1/actions/pause", json=body, headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert basic.status_code == 401
        wrong = await client.post("/v1/actions/pause", json=body, headers={"Authorization": "Bearer not-it"})
        assert wrong.status_code == 403 and wrong.json()["error"] == "forbidden"
        # Auth comes before validation: an unauthenticated caller learns nothing about the body.
        assert (await client.post("/v1/actions/pause", json={"bogus": 1})).status_code == 401
        assert (await client.get("/v1/actions")).json()["targets"][0]["paused"] is False

        ok = await client.post("/v1/actions/pause", json=body, headers=AUTH)
        assert ok.status_code == 200 and ok.json() == {"targets": ["llama"], "paused": True, "override": None,
                                                       "cleared": None}
        state = (await client.get("/v1/actions")).json()
        assert state["targets"][0]["paused"] is True
        assert any(r["kind"] == "pause" and r["reason"] == "maintenance" for r in state["records"])
        await wait_for(client, "/v1/actions", lambda r: r.json()["targets"][0]["last_skip_reason"] == "paused")
        assert fake.applied == []  # the 3600 s dwell holds every action in this test
        resumed = await client.post("/v1/actions/resume", json={"reason": "done"}, headers=AUTH)
        assert resumed.status_code == 200 and resumed.json()["targets"] == ["llama"]

    run(tmp_path, check, gate={"dwell_s": 3600})  # no action during the test: the dwell outlasts it


def test_override_is_validated_applied_and_cleared(tmp_path: Path) -> None:
    async def check(client: httpx.AsyncClient, fake: FakeActuator) -> None:
        too_long = {"target": "llama", "num_speculative_tokens": 2, "expires_in_s": 7200, "reason": "try k 2"}
        refused = await client.post("/v1/actions/override", json=too_long, headers=AUTH)
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "expires_in_s"]
        unknown = await client.post("/v1/actions/override", headers=AUTH,
                                    json={**too_long, "target": "other", "expires_in_s": 60})
        assert unknown.status_code == 422 and unknown.json()["error"] == "invalid_request"
        negative = await client.post("/v1/actions/override", headers=AUTH,
                                     json={**too_long, "num_speculative_tokens": -1, "expires_in_s": 60})
        assert negative.status_code == 422
        assert (await client.post("/v1/actions/override", json={**too_long, "expires_in_s": 60})).status_code == 401

        ok = await client.post("/v1/actions/override", json={**too_long, "expires_in_s": 600}, headers=AUTH)
        assert ok.status_code == 200
        override = ok.json()["override"]
        assert override["setting"] == {"num_speculative_tokens": 2, "schedule": []}
        assert override["reason"] == "try k 2" and 0 < override["expires_in_s"] <= 600
        # The override acts at once (no dwell, no cooldown): the fake runs k 2.
        await wait_for(client, "/v1/actions", lambda r: r.json()["targets"][0]["actions"].get("applied") == 1)
        assert fake.setting == SpeculationSetting(2)

        assert (await client.delete("/v1/actions/override", params={"target": "llama"})).status_code == 401
        cleared = await client.delete("/v1/actions/override", params={"target": "llama"}, headers=AUTH)
        assert cleared.status_code == 200 and cleared.json()["cleared"] is True
        body = (await client.get("/v1/actions")).json()
        assert body["targets"][0]["override"] is None
        assert [r["kind"] for r in body["records"] if r["kind"].startswith("override")] == [
            "override", "override_cleared"]

    run(tmp_path, check, gate={"dwell_s": 3600}, api={"max_override_s": 3600})


def test_refuses_to_start_with_write_endpoints_and_no_token(tmp_path: Path) -> None:
    settings = settings_for("http://127.0.0.1:9", tmp_path / "state")
    actuators: dict[str, Actuator] = {"llama": FakeActuator()}
    with pytest.raises(SettingsError, match="bearer token"):
        build_sidecar(settings, gpu_source=NoGpuSource(), actuators=actuators, environ={})
    assert not (tmp_path / "state").exists()  # refused before anything was written
    # A token file works; an unreadable one is refused with its path.
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    with_file = settings_for("http://127.0.0.1:9", tmp_path / "state", api={"write_token_file": str(token_file)})
    assert build_sidecar(with_file, gpu_source=NoGpuSource(), actuators=actuators, environ={}).actuation is not None
    missing = settings_for("http://127.0.0.1:9", tmp_path / "state", api={"write_token_file": str(tmp_path / "nope")})
    with pytest.raises(SettingsError, match="write_token_file"):
        build_sidecar(missing, gpu_source=NoGpuSource(), actuators=actuators, environ={})
    # Without write endpoints no token is needed, and the write routes do not exist.
    read_only = settings_for("http://127.0.0.1:9", tmp_path / "state", api={"write_endpoints": False})
    sidecar = build_sidecar(read_only, gpu_source=NoGpuSource(), actuators=actuators, environ={})
    assert "/v1/actions/pause" not in sidecar.app.openapi()["paths"]


def test_recommend_only_serves_an_empty_read_and_no_writes(tmp_path: Path) -> None:
    settings = load_settings(overrides={"targets": [{"name": "llama", "url": "http://127.0.0.1:9"}],
                                        "gpu": {"telemetry": "none"}})

    async def scenario() -> None:
        sidecar = build_sidecar(settings, gpu_source=NoGpuSource(), environ={})
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            body = (await client.get("/v1/actions")).json()
            assert body["mode"] == "recommend-only" and body["targets"] == [] and body["records"] == []
            assert body["write_endpoints"] is False
            refused = await client.post("/v1/actions/pause", json={"reason": "x"}, headers=AUTH)
            assert refused.status_code in (404, 405)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("mode", "target", "ref_kind"),
    [("kubernetes", {"deployment": "vllm-llama-8b"}, "deployment"),
     ("schedule", {"deployment": "vllm-llama-8b"}, "deployment"),
     ("routing", {"route": "r", "on_backend": "spec", "off_backend": "plain", "on_pool_k": 3}, "httproute")],
)
def test_each_mode_composes_its_kubernetes_actuator(
    tmp_path: Path, mode: str, target: dict[str, Any], ref_kind: str
) -> None:
    settings = load_settings(overrides={
        "targets": [{"name": "llama", "url": "http://127.0.0.1:9"}],
        "gpu": {"telemetry": "none"},
        "actuation": {"mode": mode, "state_dir": str(tmp_path),
                      "kubernetes": {"api_url": "http://127.0.0.1:9", "namespace": "llm"},
                      "targets": [{"target": "llama", **target}]},
    })
    sidecar = build_sidecar(settings, gpu_source=NoGpuSource(), environ={"SPEC_ADVISOR_ACTIONS_TOKEN": TOKEN})
    assert sidecar.actuation is not None and sidecar.actuation.mode == mode
    (status,) = sidecar.actuation.statuses(0.0)
    assert ref_kind in status.target_ref.lower() and "llm" in status.target_ref


class FullDiskAuditLog(AuditLog):
    """An audit log on a full disk: every append fails the way os.write does with ENOSPC."""

    def append(self, record: Mapping[str, Any]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_command_whose_audit_record_is_not_persisted_answers_503(tmp_path: Path) -> None:
    audit = FullDiskAuditLog(tmp_path / "actions.jsonl")
    audit.open()
    board = Board([("llama", None)], started_at_s=0.0)
    actuators: dict[str, Actuator] = {"llama": FakeActuator()}
    runner = ActuationRunner(board, actuators, audit=audit,
                             options=RunnerOptions(mode="kubernetes", config=ActuationConfig()))
    app = install_auth_errors(FastAPI())
    app.include_router(create_actions_router(runner, audit, clock=lambda: 100.0, token=TOKEN))

    async def scenario() -> None:
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            paused = await client.post("/v1/actions/pause", json={"reason": "incident"}, headers=AUTH)
            assert paused.status_code == 503
            assert paused.json()["error"] == "not_persisted"
            assert "applied in memory, not persisted" in paused.json()["detail"]
            # It is in force (in memory) all the same, and the write error is counted.
            body = (await client.get("/v1/actions")).json()
            assert body["targets"][0]["paused"] is True and body["audit"]["write_errors"] == 1
            override = await client.post("/v1/actions/override", headers=AUTH, json={
                "target": "llama", "num_speculative_tokens": 2, "expires_in_s": 60, "reason": "try"})
            assert override.status_code == 503 and override.json()["error"] == "not_persisted"
            cleared = await client.delete("/v1/actions/override", params={"target": "llama"}, headers=AUTH)
            assert cleared.status_code == 503
            resumed = await client.post("/v1/actions/resume", json={"reason": "over"}, headers=AUTH)
            assert resumed.status_code == 503

    asyncio.run(scenario())
    audit.close()


def test_the_sidecar_restores_a_pause_written_long_before_the_last_500_records(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    log = AuditLog(state_dir / "actions.jsonl")
    log.open()
    log.append({"at_s": 1000.0, "kind": "pause", "target": "llama", "result": "ok", "reason": "incident"})
    for i in range(600):  # 600 skip lines after it: more than the 500 records kept for GET /v1/actions
        log.append({"at_s": 1001.0 + 600 * i, "kind": "skip", "target": "llama", "reason": "paused",
                    "result": "skipped"})
    log.close()
    settings = settings_for("http://127.0.0.1:9", state_dir)
    actuators: dict[str, Actuator] = {"llama": FakeActuator()}
    sidecar = build_sidecar(settings, gpu_source=NoGpuSource(), actuators=actuators,
                            environ={"SPEC_ADVISOR_ACTIONS_TOKEN": TOKEN})
    assert sidecar.actuation is not None
    (status,) = sidecar.actuation.statuses(400_000.0)
    assert status.paused
