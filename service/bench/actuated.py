"""The advisor with the `kubernetes` actuator in the loop: the benchmark's advisor policy, but the recommendation
reaches the world only through the real actuation gate (`ActuationRunner` -> `policies.act.gate.gate_action`:
dwell, cooldown, hourly/daily caps, never during a rollout or on stale data) and an actuator whose "Deployment"
is the simulated world, so every change pays the world's restart or rolling-update cost.

`WorldActuator` keeps the vLLM container args a Deployment would carry and edits them with the same arg editor as
the Kubernetes actuator (`service.actuators.vllm_args`), so the audit log holds the strategic merge patch a real
cluster would have received. `ActuatedAdvisorController` is a benchmark `Controller`: per tick it runs
`AdvisorLoop.run_once(now)` with the runner as its listener, waits for the runner's pass, and reports the k the
world then runs (the runner already applied it, so the benchmark runner has nothing left to change).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from service.actuators.kubernetes import PATCH_TYPE
from service.actuators.runner import ActuationRunner, TargetActuation
from service.actuators.vllm_args import (
    ArgsError,
    config_for,
    read_vllm_command,
    setting_from_config,
    with_speculative_config,
)
from service.app import Actuation, advisor_loop, build_actuation, build_sidecar, target_specs
from service.bench.controllers import Controller
from service.bench.pipeline import TARGET, SimClock, WorldTransport, bench_advisor_settings
from service.bench.runner import PolicySpec
from service.bench.spec import BenchScenario
from service.loop import AdvisorLoop
from service.settings import ActuationSettings, Settings
from service.sim.world import World
from service.sources.gpu import NoGpuSource

ACTUATED_ADVISOR = "advisor+k8s"
NAMESPACE = "bench"
DEPLOYMENT = "vllm"
CONTAINER = "vllm"


class WorldActuator:
    """The `kubernetes` actuator with the simulated world as its Deployment.

    The world's configured k is the truth. The container args mirror it (`--speculative-config <json>`, dropped when
    off), and `resource_version` grows with every change: ours through `apply`, or another writer's (anything that
    calls `world.set_speculation` directly), which `observe` notices and which then makes a patch computed from the
    older observation a CONFLICT, as a 409 would. A rollout is in progress while the engine restarts or rolls.
    """

    def __init__(self, world: World) -> None:
        self._world = world
        k = world.num_speculative_tokens
        # The config to turn speculation back on with (a real Deployment keeps it in an annotation when off).
        self._base: dict[str, Any] = {"method": world.scenario.drafter.method, "num_speculative_tokens": max(1, k)}
        self._args: list[str] = [world.model_name, "--port", "8000"]
        self._sync_args(k)
        self._version = 1
        self.applied: list[tuple[float, int]] = []  # (world time, k) of each change sent

    @property
    def mode(self) -> str:
        return "kubernetes"

    @property
    def target_ref(self) -> str:
        return f"deployment/{NAMESPACE}/{DEPLOYMENT}"

    @property
    def resource_version(self) -> str:
        return str(self._version)

    @property
    def args(self) -> tuple[str, ...]:
        """The vLLM container's args as the Deployment carries them now."""
        return tuple(self._args)

    async def observe(self, now_s: float) -> DeploymentObservation:
        k = self._refresh()
        restarting = self._world.restart_remaining_s
        rolling = self._world.rolling_update_remaining_s
        busy = not self._world.serving or rolling > 0.0
        why = ""
        if not self._world.serving:
            why = f"engine restarting, {restarting:.0f} s left"
        elif rolling > 0.0:
            why = f"rolling update, {rolling:.0f} s left"
        return DeploymentObservation(
            at_s=now_s, setting=SpeculationSetting(k), rollout_in_progress=busy,
            resource_version=self.resource_version, detail=why,
        )

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        self._refresh()  # read the object again, as a real apply does, so a change since `observed` is seen
        if observed.resource_version != self.resource_version:
            return _failed(dry_run, ActuatorError.CONFLICT,
                           f"{self.target_ref} changed since it was observed (resourceVersion "
                           f"{observed.resource_version} -> {self.resource_version}); observe again before acting")
        if desired.schedule:
            return _failed(dry_run, ActuatorError.INVALID,
                           "the simulated engine runs a fixed k; a per-batch schedule is the schedule mode's")
        k = desired.num_speculative_tokens
        wanted = config_for(self._base, desired, schedule=False) if k > 0 else None
        try:
            _, new_args = with_speculative_config([], self._args, wanted)
        except ArgsError as exc:
            return _failed(dry_run, exc.reason, f"{self.target_ref}: {exc.detail}")
        patch = {
            "metadata": {"resourceVersion": self.resource_version},
            "spec": {"template": {"spec": {"containers": [{"name": CONTAINER, "args": new_args}]}}},
        }
        if dry_run:
            return ApplyResult(applied=False, dry_run=True, patch=patch, patch_type=PATCH_TYPE.value)
        try:
            # The world's own price of the change: a restart (requests dropped, nothing served for a while) or a
            # rolling update (reduced capacity), as its scenario says.
            self._world.set_speculation(k, now_s=observed.at_s)
        except ValueError as exc:
            return _failed(dry_run, ActuatorError.INVALID, str(exc), patch=patch)
        self._args = new_args
        self._version += 1
        self.applied.append((self._world.now_s, k))
        return ApplyResult(applied=True, dry_run=False, patch=patch, patch_type=PATCH_TYPE.value,
                           resource_version=self.resource_version)

    def _refresh(self) -> int:
        """The world's k now; a change made by another writer since the last read becomes a new version."""
        k = self._world.num_speculative_tokens
        if self._args_k() != k:
            self._sync_args(k)
            self._version += 1
        return k

    def _args_k(self) -> int:
        return setting_from_config(read_vllm_command([], self._args).speculative_config).num_speculative_tokens

    def _sync_args(self, k: int) -> None:
        wanted = config_for(self._base, SpeculationSetting(k), schedule=False) if k > 0 else None
        _, self._args = with_speculative_config([], self._args, wanted)


def _failed(
    dry_run: bool, error: ActuatorError, detail: str, *, patch: object | None = None
) -> ApplyResult:
    return ApplyResult(applied=False, dry_run=dry_run, patch=patch,
                       patch_type=None if patch is None else PATCH_TYPE.value, error=error, detail=detail)


def actuated_settings(bench: BenchScenario, *, state_dir: Path) -> Settings:
    """The advisor's settings for `bench` (as the plain advisor's) plus an actuation section in mode kubernetes on
    the benchmark target, with the audit log and acceptance memory in `state_dir`. The gate's numbers are the
    settings' defaults (what an operator gets) unless the scenario's advisor settings set them. Raises
    SettingsError on bad settings."""
    ours = {
        "actuation": {
            "mode": "kubernetes",
            "targets": [{"target": TARGET, "deployment": DEPLOYMENT, "container": CONTAINER}],
            "state_dir": str(state_dir),
            "api": {"write_endpoints": False},  # nothing serves HTTP here; and a token would be needed for them
        }
    }
    return bench_advisor_settings(bench, extra=ours)


class ActuatedAdvisorController:
    """The advisor acting through the gate: one `run_once(now)` per tick with the `ActuationRunner` as the loop's
    listener, the runner's pass awaited, then the k the world runs. `settings` must enable actuation in mode
    kubernetes on the benchmark target (`actuated_settings`)."""

    def __init__(self, settings: Settings, *, world: World, clock: SimClock) -> None:
        if settings.actuation.mode != "kubernetes":
            raise ValueError(f"actuation.mode must be kubernetes, got {settings.actuation.mode}")
        self._settings = settings
        self._world = world
        self._clock = clock
        self._transport = WorldTransport(world)
        self.actuator = WorldActuator(world)
        # The sidecar (board, profile checks) as recommend-only; the actuation is built below from the full
        # settings so this controller owns its audit log and closes it.
        self._sidecar = build_sidecar(
            settings.model_copy(update={"actuation": ActuationSettings()}),
            clock=clock, gpu_source=NoGpuSource(), transport=self._transport,
        )
        self._actuation: Actuation | None = None
        self._loop: AdvisorLoop | None = None
        self._stack = contextlib.AsyncExitStack()

    @property
    def runner(self) -> ActuationRunner:
        if self._actuation is None:
            raise RuntimeError("ActuatedAdvisorController is used outside `async with`")
        return self._actuation.runner

    @property
    def audit_path(self) -> Path:
        return self._settings.actuation.state_dir / "actions.jsonl"

    def status(self) -> TargetActuation:
        """The runner's view of the target now: actions by result, skips by reason, cooldown."""
        (status,) = self.runner.statuses(self._clock.now_s)
        return status

    async def __aenter__(self) -> ActuatedAdvisorController:
        s = self._settings
        actuation = build_actuation(s, self._sidecar.board, actuators={TARGET: self.actuator}, environ={},
                                    now_s=self._clock())
        assert actuation is not None  # the mode is kubernetes (checked in __init__)
        self._actuation = actuation
        self._stack.callback(actuation.audit.close)
        self._stack.push_async_callback(actuation.runner.aclose)  # runs before the audit log closes
        client = await self._stack.enter_async_context(httpx.AsyncClient(transport=self._transport))
        # The sidecar's own seam, with the runner as its listener and the memory in state_dir, as when acting.
        self._loop = advisor_loop(s, target_specs(s, client), board=self._sidecar.board, gpu=NoGpuSource(),
                                  listeners=(actuation.runner,))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    async def choose(self, world: World, now_s: float) -> int:
        if self._loop is None or self._actuation is None:
            raise RuntimeError("ActuatedAdvisorController is used outside `async with`")
        self._clock.now_s = now_s
        await self._loop.run_once(now_s)  # the runner's pass starts in the background, as in production
        await self._actuation.runner.idle()  # and has applied (or skipped) before the world moves on
        return world.num_speculative_tokens


def actuated_advisor_policy(bench: BenchScenario, *, state_dir: Path | None = None) -> PolicySpec:
    """The "advisor+k8s" policy for `bench`: starts at the scenario's k like the advisor. Each run writes its audit
    log and memory under `state_dir` (a fresh temporary directory per run when None, removed afterwards). Raises
    SettingsError now for bad advisor settings."""
    actuated_settings(bench, state_dir=state_dir or Path(tempfile.gettempdir()))  # fail early, before any run

    @contextlib.asynccontextmanager
    async def factory(world: World, start_s: float) -> AsyncIterator[Controller]:
        async with contextlib.AsyncExitStack() as stack:
            where = state_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spec-advisor-bench-")))
            settings = actuated_settings(bench, state_dir=where)
            controller = ActuatedAdvisorController(settings, world=world, clock=SimClock(start_s))
            yield await stack.enter_async_context(controller)

    return PolicySpec(name=ACTUATED_ADVISOR, initial_k=bench.scenario.drafter.num_speculative_tokens,
                      controller=factory)
