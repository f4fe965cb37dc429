"""The actuation runner with a fake Actuator: observe -> desired -> gate -> apply -> audit -> counters."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from actuation_fakes import FakeActuator, make_evidence

from policies.actuation import ActuationConfig
from policies.deployment import ActuatorError, SpeculationSetting
from policies.types import Decision, TargetState
from service.actuators.audit import AuditLog, read_tail
from service.actuators.base import Actuator
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.board import Board
from service.exporter import build_registry

T0 = 1_700_000_000.0
CONFIG = ActuationConfig(dwell_s=300, cooldown_s=900, max_actions_per_hour=2, max_actions_per_day=8)


def decision(**overrides: object) -> Decision:
    base = Decision(
        target="llama", model="m", state=TargetState.OK, enabled=True, num_speculative_tokens=3,
        expected_speedup=1.4, expected_speedup_low=1.3, expected_speedup_high=1.5, reason="on", evaluated_at_s=T0,
        objective="latency",
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def setup(tmp_path: Path, fake: FakeActuator, *, config: ActuationConfig = CONFIG, skip_interval_s: float = 600
          ) -> tuple[Board, ActuationRunner, AuditLog]:
    board = Board([("llama", None)], started_at_s=T0)
    board.publish("llama", evidence=make_evidence("llama", T0), decision=decision(), good_scrape_s=T0)
    audit = AuditLog(tmp_path / "actions.jsonl")
    audit.open()
    actuators: dict[str, Actuator] = {"llama": fake}
    runner = ActuationRunner(board, actuators, audit=audit,
                             options=RunnerOptions(mode="kubernetes", config=config, skip_interval_s=skip_interval_s))
    return board, runner, audit


async def tick(runner: ActuationRunner, now_s: float) -> None:
    await runner.after_iteration(now_s)
    await runner.idle()


def records(audit: AuditLog) -> list[dict[str, object]]:
    return read_tail(audit.path).records


def test_acts_after_the_dwell_and_audits_the_patch_and_the_evidence(tmp_path: Path) -> None:
    fake = FakeActuator()
    _, runner, audit = setup(tmp_path, fake)

    async def scenario() -> None:
        await tick(runner, T0)  # the wanted k 3 starts holding
        await tick(runner, T0 + 150)  # 150 s < 300 s dwell
        assert fake.applied == []
        await tick(runner, T0 + 300)  # 300 s: act
        assert fake.applied == [(SpeculationSetting(3), False)]
        assert fake.setting == SpeculationSetting(3)
        await tick(runner, T0 + 305)  # it runs now: a no-op

    asyncio.run(scenario())
    (status,) = runner.statuses(T0 + 305)
    assert status.actions == {"applied": 1}
    assert status.skipped == {"dwell": 2, "already_applied": 1}
    assert status.cooldown_remaining_s == 895.0  # 900 - (305 - 300)
    assert status.actions_last_hour == 1
    action = next(r for r in records(audit) if r["kind"] == "action")
    assert action["result"] == "applied" and action["reason"] == "recommendation"
    assert action["desired"] == {"num_speculative_tokens": 3, "schedule": []}
    assert action["observed"] == {"num_speculative_tokens": 0, "schedule": []}
    assert action["patch"] == json.loads(json.dumps(fake_patch(3)))
    evidence = action["evidence"]
    assert isinstance(evidence, dict)
    assert evidence["batch"] == 6.0 and evidence["expected_speedup"] == 1.4 and evidence["objective"] == "latency"
    assert evidence["acceptance_rate"] == 0.62


def fake_patch(k: int) -> object:
    return {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": [
        f"--speculative-config={{\"num_speculative_tokens\": {k}}}"]}]}}}}


def test_dry_run_logs_the_exact_patch_and_changes_nothing(tmp_path: Path) -> None:
    fake = FakeActuator()
    _, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dry_run=True, dwell_s=0))

    asyncio.run(tick(runner, T0))
    assert fake.applied == [(SpeculationSetting(3), True)]
    assert fake.setting == SpeculationSetting(0)
    (action,) = [r for r in records(audit) if r["kind"] == "action"]
    assert action["result"] == "dry_run" and action["dry_run"] is True and action["patch"] == fake_patch(3)
    (status,) = runner.statuses(T0)
    assert status.actions == {"dry_run": 1}
    assert status.cooldown_remaining_s == 900.0  # a dry run counts like an action: the log shows what would happen


def test_a_conflict_is_counted_audited_and_not_retried_before_the_cooldown(tmp_path: Path) -> None:
    fake = FakeActuator(apply_error=ActuatorError.CONFLICT)
    _, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))

    async def scenario() -> None:
        await tick(runner, T0)
        await tick(runner, T0 + 60)  # 60 s < 900 s cooldown: no second attempt

    asyncio.run(scenario())
    assert len(fake.applied) == 1 and fake.setting == SpeculationSetting(0)
    (status,) = runner.statuses(T0 + 60)
    assert status.actions == {"failed": 1} and status.errors == {"conflict": 1}
    assert status.skipped == {"cooldown": 1}
    (action,) = [r for r in records(audit) if r["kind"] == "action"]
    assert action["result"] == "failed" and action["error"] == "conflict"


def test_observation_errors_and_a_raising_actuator_never_reach_the_loop(tmp_path: Path) -> None:
    fake = FakeActuator(observe_error=ActuatorError.FORBIDDEN)
    _, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))

    async def scenario() -> None:
        await tick(runner, T0)
        fake.observe_error, fake.raise_on_observe = None, True
        await tick(runner, T0 + 5)

    asyncio.run(scenario())
    assert fake.applied == []
    (status,) = runner.statuses(T0 + 5)
    assert status.errors == {"forbidden": 1, "unexpected": 1}
    assert status.skipped == {"observation_error": 2}
    assert status.last_observation_error is not None and "RuntimeError" in status.last_observation_error
    skips = [r for r in records(audit) if r["kind"] == "skip"]
    # The same skip reason, but a new cause: written, not throttled.
    assert [s["observed_error"] for s in skips] == ["forbidden", "unexpected"]


def test_skips_with_an_unchanged_reason_are_written_once_per_interval(tmp_path: Path) -> None:
    fake = FakeActuator(setting=SpeculationSetting(3))  # already runs the wanted k
    _, runner, audit = setup(tmp_path, fake, skip_interval_s=600)

    async def scenario() -> None:
        for i in range(0, 1300, 5):  # 260 ticks of 5 s: t = 0 .. 1295
            await tick(runner, T0 + i)

    asyncio.run(scenario())
    skips = [r for r in records(audit) if r["kind"] == "skip"]
    # already_applied at 0, then 600 and 1200 (each 600 s after the last written): 3 lines for 260 ticks.
    assert [r["at_s"] for r in skips] == [T0, T0 + 600, T0 + 1200]
    (status,) = runner.statuses(T0 + 1295)
    assert status.skipped == {"already_applied": 260}


def test_pause_and_override_commands_are_audited_and_rule_the_next_tick(tmp_path: Path) -> None:
    fake = FakeActuator(setting=SpeculationSetting(3))
    _, runner, audit = setup(tmp_path, fake)

    async def scenario() -> None:
        await runner.pause(None, reason="incident 42", now_s=T0)
        await runner.set_override("llama", num_speculative_tokens=0, expires_in_s=600, reason="off for now",
                                  now_s=T0)
        await tick(runner, T0 + 1)
        assert fake.applied == []  # paused beats the override
        await runner.resume("llama", reason="over", now_s=T0 + 2)
        await tick(runner, T0 + 3)
        assert fake.applied == [(SpeculationSetting(0), False)]  # the override acts at once (no dwell)
        await tick(runner, T0 + 603)  # expired at T0 + 600: the recommendation (k 3) rules, in cooldown
        assert fake.setting == SpeculationSetting(0)

    asyncio.run(scenario())
    kinds = [r["kind"] for r in records(audit)]
    assert kinds[:2] == ["pause", "override"]
    assert "resume" in kinds and "action" in kinds
    (status,) = runner.statuses(T0 + 603)
    assert status.override is None and not status.paused
    assert status.last_plan is not None and status.last_plan.skip is not None
    # k 3 has been wanted (decision ok) since T0 + 1, past the dwell; the override's action at T0 + 3 holds it:
    # 603 - 3 = 600 s < 900 s of cooldown.
    assert status.last_plan.skip.value == "cooldown"


def test_one_action_in_flight_a_busy_tick_starts_nothing(tmp_path: Path) -> None:
    gate = asyncio.Event()
    fake = FakeActuator(gate=gate)
    _, runner, _ = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))

    async def scenario() -> None:
        await runner.after_iteration(T0)  # starts an apply that waits on the gate
        while fake.observed == 0:
            await asyncio.sleep(0)
        await runner.after_iteration(T0 + 5)
        await runner.after_iteration(T0 + 10)
        assert runner.busy_ticks == 2
        gate.set()
        await runner.idle()

    asyncio.run(scenario())
    assert fake.observed == 1 and len(fake.applied) == 1


def test_the_exporter_counts_by_target_mode_result_and_reason(tmp_path: Path) -> None:
    fake = FakeActuator(apply_error=ActuatorError.FORBIDDEN)
    board, runner, _ = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))
    asyncio.run(tick(runner, T0))
    registry = build_registry(board, clock=lambda: T0 + 100, version="t", actuation=runner)
    value = registry.get_sample_value
    assert value("specadvisor_actions_total", {"target": "llama", "mode": "kubernetes", "result": "failed"}) == 1
    assert value("specadvisor_actions_total", {"target": "llama", "mode": "kubernetes", "result": "applied"}) == 0
    assert value("specadvisor_actuator_errors_total", {"target": "llama", "reason": "forbidden"}) == 1
    assert value("specadvisor_actions_skipped_total", {"target": "llama", "reason": "cooldown"}) == 0
    assert value("specadvisor_actuation_paused", {"target": "llama"}) == 0
    assert value("specadvisor_actuation_cooldown_remaining_seconds", {"target": "llama"}) == 800  # 900 - 100


def test_a_restart_keeps_the_pause_the_override_and_the_rate_limits(tmp_path: Path) -> None:
    fake = FakeActuator()
    board, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))

    async def before_crash() -> None:
        await tick(runner, T0)  # acts (k 0 -> 3)
        await runner.set_override("llama", num_speculative_tokens=0, expires_in_s=3600, reason="hold", now_s=T0 + 1)
        await runner.pause(None, reason="incident", now_s=T0 + 2)

    asyncio.run(before_crash())
    audit.close()

    # A new process: the gate state comes back from the audit log.
    reopened = AuditLog(audit.path)
    reopened.open()
    actuators: dict[str, Actuator] = {"llama": fake}
    restarted = ActuationRunner(board, actuators, audit=reopened,
                                options=RunnerOptions(mode="kubernetes", config=replace(CONFIG, dwell_s=0)))
    restarted.restore(reopened.recent(500), now_s=T0 + 60)
    (status,) = restarted.statuses(T0 + 60)
    assert status.paused
    assert status.override is not None and status.override.expires_at_s == T0 + 3601  # set at T0 + 1, 3600 s
    assert status.actions_last_hour == 1 and status.cooldown_remaining_s == 840.0  # 900 - (60 - 0)
    # An override that has expired by the restart is not brought back.
    late = ActuationRunner(board, actuators, audit=reopened,
                           options=RunnerOptions(mode="kubernetes", config=CONFIG))
    late.restore(reopened.recent(500), now_s=T0 + 3601)
    (status,) = late.statuses(T0 + 3601)
    assert status.override is None and status.paused
    reopened.close()
