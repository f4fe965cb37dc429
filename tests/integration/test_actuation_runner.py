"""The actuation runner with a fake Actuator: observe -> desired -> gate -> apply -> audit -> counters."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from actuation_fakes import FakeActuator, make_evidence

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from policies.act.gate import ActuationConfig
from policies.types import DataState, Decision
from service.actuators.audit import AuditLog, read_tail
from service.actuators.base import Actuator
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.board import Board
from service.exporter import build_registry

T0 = 1_700_000_000.0
CONFIG = ActuationConfig(dwell_s=300, cooldown_s=900, max_actions_per_hour=2, max_actions_per_day=8)


def decision(*, state: DataState = DataState.OK, num_speculative_tokens: int = 3) -> Decision:
    return Decision(
        target="llama", model="m", state=state, enabled=True, num_speculative_tokens=num_speculative_tokens,
        expected_speedup=1.4, expected_speedup_low=1.3, expected_speedup_high=1.5, reason="on", evaluated_at_s=T0,
        objective="latency",
    )


def sent(fake: FakeActuator) -> list[SpeculationSetting]:
    """What reached the deployment: a live action is a dry run (the patch, recorded first) then the send."""
    return [setting for setting, dry_run in fake.applied if not dry_run]


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
        # The patch is computed first (a dry run), recorded, then sent.
        assert fake.applied == [(SpeculationSetting(3), True), (SpeculationSetting(3), False)]
        assert fake.setting == SpeculationSetting(3)
        await tick(runner, T0 + 305)  # it runs now: a no-op

    asyncio.run(scenario())
    (status,) = runner.statuses(T0 + 305)
    assert status.actions == {"applied": 1}
    assert status.skipped == {"dwell": 2, "already_applied": 1}
    assert status.cooldown_remaining_s == 895.0  # 900 - (305 - 300)
    assert status.actions_last_hour == 1
    started = next(r for r in records(audit) if r["kind"] == "action_started")
    assert started["result"] == "started" and started["patch"] == json.loads(json.dumps(fake_patch(3)))
    action = next(r for r in records(audit) if r["kind"] == "action")
    assert action["at_s"] == started["at_s"] == T0 + 300
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
    # The fake refuses the dry run that computes the patch, as a 409 would: nothing is sent.
    assert sent(fake) == [] and fake.setting == SpeculationSetting(0)
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
        assert sent(fake) == [SpeculationSetting(0)]  # the override acts at once (no dwell)
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
    assert fake.observed == 1 and sent(fake) == [SpeculationSetting(3)]


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
    restarted.restore(reopened.gate_records(), now_s=T0 + 60)
    (status,) = restarted.statuses(T0 + 60)
    assert status.paused
    assert status.override is not None and status.override.expires_at_s == T0 + 3601  # set at T0 + 1, 3600 s
    assert status.actions_last_hour == 1 and status.cooldown_remaining_s == 840.0  # 900 - (60 - 0)
    # An override that has expired by the restart is not brought back.
    late = ActuationRunner(board, actuators, audit=reopened,
                           options=RunnerOptions(mode="kubernetes", config=CONFIG))
    late.restore(reopened.gate_records(), now_s=T0 + 3601)
    (status,) = late.statuses(T0 + 3601)
    assert status.override is None and status.paused
    reopened.close()


def restarted_runner(board: Board, fake: FakeActuator, path: Path, *, config: ActuationConfig, now_s: float
                     ) -> tuple[ActuationRunner, AuditLog]:
    """A new process: a fresh AuditLog on the same file, the gate rebuilt from it as service/app.py does."""
    reopened = AuditLog(path)
    reopened.open()
    actuators: dict[str, Actuator] = {"llama": fake}
    runner = ActuationRunner(board, actuators, audit=reopened, options=RunnerOptions(mode="kubernetes", config=config))
    runner.restore(reopened.gate_records(), now_s=now_s)
    return runner, reopened


def test_a_pause_and_an_override_survive_a_restart_after_thousands_of_skip_lines(tmp_path: Path) -> None:
    fake = FakeActuator(setting=SpeculationSetting(3))
    # skip_interval_s 0: every tick writes its skip line, so the pause is soon far behind the recent tail.
    board, runner, audit = setup(tmp_path, fake, skip_interval_s=0)

    async def before_restart() -> None:
        await tick(runner, T0)
        await runner.set_override("llama", num_speculative_tokens=0, expires_in_s=86400, reason="hold", now_s=T0)
        await runner.pause(None, reason="incident", now_s=T0 + 1)
        for i in range(1, 701):  # 700 paused ticks, 700 skip lines after the pause (more than the 500 kept)
            await tick(runner, T0 + 1 + i)

    asyncio.run(before_restart())
    audit.close()
    assert sum(1 for r in records(audit) if r["kind"] == "skip") >= 700
    restarted, reopened = restarted_runner(board, fake, audit.path, config=CONFIG, now_s=T0 + 800)
    assert all(r["kind"] != "pause" for r in reopened.recent(500))  # the recent tail no longer holds it
    (status,) = restarted.statuses(T0 + 800)
    assert status.paused
    assert status.override is not None and status.override.setting == SpeculationSetting(0)
    reopened.close()


def test_actions_of_the_last_day_survive_a_restart_after_thousands_of_records(tmp_path: Path) -> None:
    fake = FakeActuator()
    board, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))

    async def before_restart() -> None:
        await tick(runner, T0)  # acts: k 0 -> 3
    asyncio.run(before_restart())
    for i in range(600):  # 600 other records after it (another target's skips)
        audit.append({"at_s": T0 + 1 + i, "kind": "skip", "target": "other", "result": "skipped"})
    audit.close()
    restarted, reopened = restarted_runner(board, fake, audit.path, config=replace(CONFIG, dwell_s=0),
                                           now_s=T0 + 700)
    (status,) = restarted.statuses(T0 + 700)
    assert status.actions_last_hour == 1 and status.cooldown_remaining_s == 200.0  # 900 - (700 - 0)
    reopened.close()


def test_an_action_cut_off_between_started_and_result_still_counts_after_a_restart(tmp_path: Path) -> None:
    class DiesAfterTheSend(FakeActuator):
        """The PATCH is accepted, then the process stops before it can write the result (kill -9)."""

        async def apply(self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
                        ) -> ApplyResult:
            result = await super().apply(desired, observed, dry_run=dry_run)
            if not dry_run:
                await asyncio.Event().wait()  # never returns: the pass is cancelled here
            return result

    fake = DiesAfterTheSend()
    board, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))

    async def killed_mid_apply() -> None:
        await runner.after_iteration(T0)
        while not sent(fake):
            await asyncio.sleep(0)
        await runner.aclose(grace_s=0)  # the pass dies in the apply, as the process would

    asyncio.run(killed_mid_apply())
    audit.close()
    assert fake.setting == SpeculationSetting(3)  # the change landed
    assert [r["kind"] for r in records(audit)] == ["action_started"]  # and only the started record was written
    restarted, reopened = restarted_runner(board, fake, audit.path, config=replace(CONFIG, dwell_s=0),
                                           now_s=T0 + 60)
    (status,) = restarted.statuses(T0 + 60)
    # The started record counts: one action at T0, 900 - 60 = 840 s of cooldown left.
    assert status.actions_last_hour == 1 and status.cooldown_remaining_s == 840.0
    reopened.close()


def test_a_started_record_and_its_result_count_as_one_action_after_a_restart(tmp_path: Path) -> None:
    fake = FakeActuator()
    board, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))
    asyncio.run(tick(runner, T0))
    audit.close()
    assert [r["kind"] for r in records(audit)] == ["action_started", "action"]
    restarted, reopened = restarted_runner(board, fake, audit.path, config=replace(CONFIG, dwell_s=0),
                                           now_s=T0 + 60)
    (status,) = restarted.statuses(T0 + 60)
    assert status.actions_last_hour == 1  # not 2
    reopened.close()


def test_dry_run_actions_do_not_count_against_live_caps_after_switching_dry_run_off(tmp_path: Path) -> None:
    fake = FakeActuator()
    dry = replace(CONFIG, dry_run=True, dwell_s=0, cooldown_s=0)
    board, runner, audit = setup(tmp_path, fake, config=dry)

    async def dry_runs() -> None:
        await tick(runner, T0)
        await tick(runner, T0 + 10)  # two dry-run "actions" (cooldown 0), the hourly cap of 2 reached
    asyncio.run(dry_runs())
    audit.close()
    assert [r["result"] for r in records(audit) if r["kind"] == "action"] == ["dry_run", "dry_run"]
    live, reopened = restarted_runner(board, fake, audit.path, config=replace(dry, dry_run=False), now_s=T0 + 20)
    (status,) = live.statuses(T0 + 20)
    assert status.actions_last_hour == 0 and status.cooldown_remaining_s == 0.0
    reopened.close()
    still_dry, reopened = restarted_runner(board, fake, audit.path, config=dry, now_s=T0 + 20)
    (status,) = still_dry.statuses(T0 + 20)
    assert status.actions_last_hour == 2  # in dry run they keep counting: the log shows what a live run would do
    reopened.close()


def test_an_ok_decision_over_insufficient_evidence_never_acts(tmp_path: Path) -> None:
    fake = FakeActuator()
    board, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))
    # advise.py kept the decision ok on remembered acceptance, but the live window is thin.
    thin = replace(make_evidence("llama", T0), state=DataState.INSUFFICIENT_DATA)
    board.publish("llama", evidence=thin, decision=decision(), good_scrape_s=T0)
    asyncio.run(tick(runner, T0))
    assert fake.applied == []
    (status,) = runner.statuses(T0)
    assert status.skipped == {"insufficient_data": 1}
    assert status.last_plan is not None and "live evidence is insufficient_data" in status.last_plan.detail
    (skip,) = [r for r in records(audit) if r["kind"] == "skip"]
    assert skip["reason"] == "insufficient_data"
    evidence = skip["evidence"]
    assert isinstance(evidence, dict)
    assert evidence["decision_state"] == "ok" and evidence["evidence_state"] == "insufficient_data"


def test_the_decision_is_read_after_the_observation(tmp_path: Path) -> None:
    gate = asyncio.Event()
    board, runner, _ = setup(tmp_path, FakeActuator(), config=replace(CONFIG, dwell_s=0))

    class SlowObserve(FakeActuator):
        async def observe(self, now_s: float) -> DeploymentObservation:
            await gate.wait()
            return await super().observe(now_s)

    slow = SlowObserve()
    actuators: dict[str, Actuator] = {"llama": slow}
    audit = AuditLog(tmp_path / "slow.jsonl")
    audit.open()
    runner = ActuationRunner(board, actuators, audit=audit,
                             options=RunnerOptions(mode="kubernetes", config=replace(CONFIG, dwell_s=0)))

    async def scenario() -> None:
        await runner.after_iteration(T0)
        await asyncio.sleep(0)  # the pass now waits in observe
        # Meanwhile the recommendation went stale: the gate must see that, not the ok decision from before.
        board.publish("llama", evidence=make_evidence("llama", T0), decision=decision(state=DataState.STALE),
                      good_scrape_s=T0)
        gate.set()
        await runner.idle()

    asyncio.run(scenario())
    assert slow.applied == []
    (status,) = runner.statuses(T0)
    assert status.skipped == {"stale": 1}
    audit.close()


def test_an_apply_that_sends_nothing_is_a_noop_not_applied(tmp_path: Path) -> None:
    class AlreadyThere(FakeActuator):
        async def apply(self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
                        ) -> ApplyResult:
            self.applied.append((desired, dry_run))
            return ApplyResult(applied=False, dry_run=dry_run, patch=None, patch_type=None,
                               detail="already runs the desired setting; nothing to send")

    fake = AlreadyThere()
    _, runner, audit = setup(tmp_path, fake, config=replace(CONFIG, dwell_s=0))
    asyncio.run(tick(runner, T0))
    assert sent(fake) == []  # the dry run found nothing to send, so nothing was sent
    (status,) = runner.statuses(T0)
    assert status.actions == {"noop": 1} and status.last_result == "noop"
    (action,) = [r for r in records(audit) if r["kind"] == "action"]
    assert action["result"] == "noop" and "nothing to send" in str(action["detail"])
    assert [r["kind"] for r in records(audit)] == ["action"]  # no started record: nothing was going to be sent


class SwitchedLeadership:
    """A leader election whose outcome the test sets (`lead`)."""

    def __init__(self) -> None:
        self.lead = True

    @property
    def holder(self) -> str | None:
        return "me" if self.lead else "other"

    def leading(self) -> bool:
        return self.lead

    def describe(self) -> str:
        return "" if self.lead else "another replica holds the lease"


def test_a_replica_that_leads_again_waits_out_a_whole_dwell_as_leader(tmp_path: Path) -> None:
    fake = FakeActuator()
    board = Board([("llama", None)], started_at_s=T0)
    board.publish("llama", evidence=make_evidence("llama", T0), decision=decision(), good_scrape_s=T0)
    audit = AuditLog(tmp_path / "actions.jsonl")
    audit.open()
    leadership = SwitchedLeadership()
    runner = ActuationRunner(board, {"llama": fake}, audit=audit, leadership=leadership,
                             options=RunnerOptions(mode="kubernetes", config=CONFIG, skip_interval_s=600))

    async def scenario() -> None:
        await tick(runner, T0)  # leading: k 3 wanted from T0
        await tick(runner, T0 + 100)  # 100 s of its 300 s dwell
        leadership.lead = False
        await tick(runner, T0 + 200)  # another replica leads for a while
        await tick(runner, T0 + 5000)
        leadership.lead = True
        await tick(runner, T0 + 5005)  # leads again: the wanted k 3 has held since T0, but not as leader
        assert sent(fake) == []
        await tick(runner, T0 + 5200)  # 195 s into a fresh dwell
        assert sent(fake) == []
        await tick(runner, T0 + 5305)  # 300 s as leader: act
        assert sent(fake) == [SpeculationSetting(3)]

    asyncio.run(scenario())
