"""The one composition root: settings -> HTTP client, sources, profiles, loop, board, registry, FastAPI app.

Nothing else in the sidecar constructs an I/O dependency. The FastAPI lifespan owns the HTTP client, the GPU
source and the loop task: it starts them with the server and stops them when uvicorn shuts down (SIGTERM/SIGINT
are handled by uvicorn, which runs the lifespan's exit: the loop task is cancelled between steps and the client
closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI
from prometheus_client.registry import Collector, CollectorRegistry

from policies.advise import AdvisorConfig
from policies.model.costmodel import ModelContext
from policies.model.measured_profile import ProfileError
from policies.model.profiles import (
    HardwareProfile,
    ModelProfile,
    drafter_for,
    hardware_by_name,
    hardware_for_device_name,
    hardware_from_spec,
    model_by_name,
    model_for_served_name,
    model_from_hf_config,
)
from policies.types import GpuSnapshot
from service.actuators.audit import AUDIT_FILE_NAME, AuditLog
from service.actuators.base import Actuator
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.actuators.shadow import ShadowActuator
from service.board import Board
from service.exporter import ApiConnectionsCollector, MetricsPage, ShadowCollector, build_registry
from service.http.actions import create_actions_router, install_auth_errors
from service.http.api import ApiExtensions, create_api
from service.http.backtest import create_backtest_router
from service.http.connection_guard import ConnectionGuard
from service.http.routes import create_routes_router
from service.http.whatif import create_whatif_router, live_targets_from_board
from service.logs import fields, get_logger
from service.loop import (
    AdvisorLoop,
    ContextResolver,
    ContextUnavailableError,
    GpuReader,
    IterationListener,
    LoadedProfile,
    LoopConfig,
    LoopWiring,
    Scraper,
    TargetSpec,
)
from service.profile import read_profile
from service.settings import ActuationSettings, GpuSettings, Settings, SettingsError, TargetSettings, write_token
from service.sources.auth import BasicFileAuth, BearerFileAuth
from service.sources.dcgm import DcgmSource
from service.sources.gpu import SOURCE_ABSENT, NoGpuSource
from service.sources.nvml import NvmlSource
from service.sources.prometheus import MAX_CONCURRENT_QUERIES, FleetSelection, PrometheusFleetSource
from service.sources.scraper import EngineScraper
from service.stores.memory import MemoryStore
from service.tasks import cancel_and_wait

if TYPE_CHECKING:  # recommend-only never imports the Kubernetes client library
    from lightkube import AsyncClient

    from service.actuators.leader import LeaseElector

_log = get_logger("app")


def package_version() -> str:
    try:
        return metadata.version("spec-advisor")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


@dataclass(frozen=True, slots=True)
class Sidecar:
    """What the CLI needs after composition: the ASGI app, and the board the live view reads."""

    app: FastAPI
    board: Board
    registry: CollectorRegistry
    settings: Settings
    connection_guard: ConnectionGuard  # what the API server's protocol enforces (`_start_api` in service/cli)
    actuation: ActuationRunner | None = None


@dataclass(frozen=True, slots=True)
class Actuation:
    """What acting needs at run time: the runner (a loop listener), its audit log, the write endpoints' token, the
    leader election (None when off), and what to close at shutdown (the Kubernetes client)."""

    runner: ActuationRunner
    audit: AuditLog
    token: str | None
    closers: tuple[Callable[[], Awaitable[None]], ...] = ()
    elector: LeaseElector | None = None
    actuators: Mapping[str, Actuator] = field(default_factory=dict)  # by target (the shadow ones are scored)


MEMORY_FILE_NAME = "acceptance-memory.json"


def memory_store(settings: Settings) -> MemoryStore | None:
    """The acceptance memory's file: in actuation.state_dir when actuation is on (the dir is checked writable there)
    or when state_dir is set explicitly; otherwise (the demo, recommend-only with defaults) it lives in memory."""
    a = settings.actuation
    if not a.enabled and "state_dir" not in a.model_fields_set:
        return None
    return MemoryStore(a.state_dir / MEMORY_FILE_NAME)


def gpu_source_name(settings: GpuSettings) -> str:
    """The GpuSnapshot.source the configured telemetry reports ("nvml", "dcgm", or "absent" for none)."""
    return SOURCE_ABSENT if settings.telemetry == "none" else settings.telemetry


def target_specs(
    settings: Settings,
    client: httpx.AsyncClient,
    *,
    resolvers: Mapping[str, ContextResolver] | None = None,
    profiles: Mapping[str, LoadedProfile | None] | None = None,
) -> list[TargetSpec]:
    """What the loop needs per configured target: its scraper on `client` (pod /metrics, or fleet Prometheus), its
    profile resolver and its measured profile (`resolvers` / `profiles` reuse ones already checked, else they are
    built here; SettingsError for a profile file that cannot be used)."""
    loaded = profiles if profiles is not None else measured_profiles(settings)
    return [
        TargetSpec(
            name=t.name,
            model=t.model,
            scraper=_scraper(t, settings, client),
            resolve_context=(resolvers or {}).get(t.name)
            or context_resolver(t, fallback_hardware=settings.fallback_hardware),
            profile=loaded.get(t.name),
            profile_max_age_s=settings.calibration.profile_max_age_s,
            controller=t.speculation_controller,
        )
        for t in settings.targets
    ]


def measured_profiles(settings: Settings) -> dict[str, LoadedProfile | None]:
    """Every target's measured profile file, read and checked (SettingsError naming the target otherwise)."""
    return {t.name: _measured_profile(t) for t in settings.targets}


def _measured_profile(target: TargetSettings) -> LoadedProfile | None:
    """The target's measured profile file, read and checked now; SettingsError naming the problem (whether it fits
    the target is checked when the target's profiles are resolved, its age every tick: service/loop.py)."""
    if target.profile is None:
        return None
    try:
        return LoadedProfile(source=str(target.profile), profile=read_profile(target.profile))
    except ProfileError as exc:
        raise SettingsError(f"target {target.name}: profile: {exc}") from None


def advisor_loop(
    settings: Settings,
    targets: Sequence[TargetSpec],
    *,
    board: Board,
    gpu: GpuReader,
    listeners: Sequence[IterationListener] = (),
) -> AdvisorLoop:
    """The advisor's loop as the settings configure it (estimator, decide, calibration, objective, acceptance
    memory); the sidecar's lifespan drives it in wall time, the benchmark calls `run_once(now)` in simulated time."""
    return AdvisorLoop(
        targets,
        wiring=LoopWiring(
            gpu=gpu,
            board=board,
            gpu_source_name=gpu_source_name(settings.gpu),
            listeners=listeners,
            memory_store=memory_store(settings),
        ),
        config=LoopConfig(
            estimator=settings.estimator.to_config(),
            interval_s=settings.scrape_interval_s,
            advisor=AdvisorConfig(
                decide=settings.decide.to_config(),
                calibration=settings.calibration.to_config(),
                objective=settings.objective.to_config(),
            ),
        ),
    )


def build_sidecar(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    gpu_source: GpuReader | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    actuators: Mapping[str, Actuator] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Sidecar:
    """Compose the sidecar. `gpu_source`/`transport` replace the configured GPU source / the HTTP transport
    (tests and the demo); `actuators` (target name -> Actuator) replace the Kubernetes actuators of the configured
    actuation mode; `environ` replaces os.environ for the write token. Everything else comes from `settings`.
    Raises SettingsError for profiles that do not exist, measured profile files that cannot be used, and when
    actuation is enabled with write endpoints but no token, before anything starts.
    """
    resolvers = {target.name: context_resolver(target, fallback_hardware=settings.fallback_hardware)
                 for target in settings.targets}
    profiles = measured_profiles(settings)
    board = Board(((t.name, t.model) for t in settings.targets), started_at_s=clock())
    version = package_version()
    actuation = build_actuation(
        settings, board, actuators=actuators, environ=os.environ if environ is None else environ, now_s=clock()
    )
    runner = actuation.runner if actuation is not None else None
    # The API server's connection cap and read deadline (uvicorn's protocol, service/http/connection_guard.py).
    guard = ConnectionGuard(max_connections=settings.api_max_connections,
                            read_timeout_s=settings.api_request_read_timeout_s)
    live = _live_collectors(guard, actuation)
    registry = build_registry(board, clock=clock, version=version, actuation=runner)
    for collector in live:
        registry.register(collector)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A fleet target keeps up to MAX_CONCURRENT_QUERIES queries in flight; a pod target one scrape.
        fleet_connections = MAX_CONCURRENT_QUERIES * sum(1 for t in settings.targets if t.fleet)
        limits = httpx.Limits(max_connections=max(4, 2 * len(settings.targets)) + fleet_connections)
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                httpx.AsyncClient(transport=transport, limits=limits, follow_redirects=False)
            )
            gpu = gpu_source if gpu_source is not None else stack.enter_context(_gpu_source(settings.gpu, client))
            loop = advisor_loop(
                settings, target_specs(settings, client, resolvers=resolvers, profiles=profiles), board=board, gpu=gpu,
                listeners=() if runner is None else (runner,),
            )
            if actuation is not None:
                stack.push_async_callback(_close_actuation, actuation)
                _start_actuation(actuation)
            task = asyncio.create_task(loop.run_forever(clock), name="spec-advisor-loop")
            task.add_done_callback(_report_loop_exit)
            _log.info(
                "advisor started",
                extra=fields(targets=[t.name for t in settings.targets], interval_s=settings.scrape_interval_s),
            )
            try:
                yield
            finally:
                await cancel_and_wait(task)
                await loop.flush_memory(clock())  # keep the last minute's acceptance memory across a clean stop
                _log.info("advisor stopped", extra=fields(iterations=board.iterations))

    def context_for(target: str) -> ModelContext | None:
        # The loop's resolved profiles, so /v1/schedule prices a config.json model or a draft model exactly.
        status = board.get(target)
        return status.context if status is not None else None

    whatif = create_whatif_router(
        live_targets=live_targets_from_board(board, context_for=context_for), gamma_max=settings.decide.gamma_max,
        default_max_num_seqs=settings.actuation.schedule.max_num_seqs,
    )
    app = create_api(
        board,
        metrics=MetricsPage(board, clock=clock, version=version, actuation=runner, live=live),
        clock=clock,
        stall_after_s=settings.stall_after_intervals * settings.scrape_interval_s,
        version=version,
        extensions=ApiExtensions(lifespan=lifespan, routers=[whatif, create_backtest_router(settings),
                                                             create_routes_router(board, _routes(settings)),
                                                             create_actions_router(
            runner,
            actuation.audit if actuation is not None else None,
            clock=clock,
            token=actuation.token if actuation is not None else None,
            max_override_s=settings.actuation.api.max_override_s,
            mode=settings.actuation.mode,
        )]),
    )
    install_auth_errors(app)
    return Sidecar(app=app, board=board, registry=registry, settings=settings, connection_guard=guard,
                   actuation=runner)


# ----------------------------------------------------------------------------------------------------------------
# Actuation (opt-in): the runner, its audit log, the write endpoints' token, the Kubernetes actuators
# ----------------------------------------------------------------------------------------------------------------


def build_actuation(
    settings: Settings,
    board: Board,
    *,
    actuators: Mapping[str, Actuator] | None,
    environ: Mapping[str, str],
    now_s: float,
) -> Actuation | None:
    """The runner for the configured mode, or None in recommend-only; its gate state (pause, override, recent
    actions) restored from the whole audit log as of `now_s`. Refuses (SettingsError) write endpoints without a
    token, an unwritable state_dir, and a Kubernetes configuration that cannot be loaded."""
    a = settings.actuation
    if not a.enabled:
        return None
    token = write_token(a, environ) if a.api.write_endpoints else None
    if a.api.write_endpoints and token is None:
        raise SettingsError(
            "actuation: the write endpoints (pause/resume/override) need a bearer token: put it in the file named "
            f"by actuation.api.write_token_file or in env {a.api.write_token_env}, or set "
            "actuation.api.write_endpoints: false"
        )
    closers: tuple[Callable[[], Awaitable[None]], ...] = ()
    client: AsyncClient | None = None
    if actuators is None and a.mode == "shadow":
        actuators = _shadow_actuators(settings, board)
    if actuators is None or a.leader_election.enabled:
        client = _kube_client(a)
        closers = (client.close,)
    if actuators is None:
        assert client is not None
        actuators = _kube_actuators(a, client)
    missing = sorted({t.target for t in a.targets} - set(actuators))
    if missing:
        raise SettingsError(f"actuation: no actuator for {', '.join(missing)}")
    audit = AuditLog(a.state_dir / AUDIT_FILE_NAME)
    try:
        audit.open()
    except OSError as exc:
        raise SettingsError(
            f"actuation.state_dir: cannot write the audit log {audit.path}: {exc.strerror or exc}"
        ) from None
    on_pool_k = {t.target: t.on_pool_k for t in a.targets if t.on_pool_k is not None}
    options = RunnerOptions(
        mode=a.mode,
        config=a.gate.to_config(dry_run=a.dry_run or a.mode == "shadow"),  # shadow sends nothing, ever
        on_pool_k=on_pool_k,
        schedule_max_num_seqs=a.schedule.max_num_seqs,
        schedule_gamma_max=settings.decide.gamma_max,
        actuator_timeout_s=a.actuator_timeout_s,
        skip_interval_s=a.gate.skip_log_interval_s,
    )
    elector = _lease_elector(a, client, environ) if client is not None and a.leader_election.enabled else None
    runner = ActuationRunner(board, {t.target: actuators[t.target] for t in a.targets}, options=options, audit=audit,
                             leadership=elector)
    runner.restore(audit.gate_records(), now_s=now_s)  # from the whole log, not just its recent tail
    _log.info(
        "actuation enabled",
        extra=fields(mode=a.mode, dry_run=a.dry_run, targets=[t.target for t in a.targets], audit=str(audit.path),
                     write_endpoints=a.api.write_endpoints,
                     leader_election=None if elector is None else f"{elector.lease_ref} as {elector.identity}"),
    )
    return Actuation(runner=runner, audit=audit, token=token, closers=closers, elector=elector,
                     actuators=dict(actuators))


def _kube_client(a: ActuationSettings) -> AsyncClient:
    """The one Kubernetes client of the actuators and the leader election; SettingsError when it cannot be built."""
    # Imported here: recommend-only never needs the Kubernetes client library.
    from service.actuators.kube_client import kube_client  # noqa: PLC0415

    try:
        k = a.kubernetes
        return kube_client(api_url=k.api_url, kubeconfig=k.kubeconfig, token_file=k.token_file,
                           namespace=k.namespace, timeout_s=k.timeout_s)
    except Exception as exc:  # lightkube's ConfigError and the OSErrors of reading the files
        raise SettingsError(f"actuation: cannot configure the Kubernetes client: {type(exc).__name__}: {exc}") from None


def _lease_elector(a: ActuationSettings, client: AsyncClient, environ: Mapping[str, str]) -> LeaseElector:
    """The leader election on actuation.leader_election's Lease, as this pod (POD_NAME, else HOSTNAME) plus a random
    suffix, so a restarted pod is a new candidate."""
    from policies.act.leader import ElectionConfig  # noqa: PLC0415
    from service.actuators.leader import LeaseElector, LeaseName, leader_identity  # noqa: PLC0415

    le = a.leader_election
    config = ElectionConfig(identity=leader_identity(environ), lease_duration_s=le.lease_duration_s,
                            renew_deadline_s=le.renew_deadline_s, retry_period_s=le.retry_period_s)
    return LeaseElector(client, lease=LeaseName(a.lease_namespace, le.lease_name), config=config)


def _start_actuation(actuation: Actuation) -> None:
    if actuation.elector is not None:
        actuation.elector.start()


def _live_collectors(guard: ConnectionGuard, actuation: Actuation | None) -> list[Collector]:
    """The /metrics families that move without a board write: the API's closed connections, and with leader
    election on, this replica's standing (service/actuators/leader_metrics.py)."""
    live: list[Collector] = [ApiConnectionsCollector(guard.closed)]
    shadows = {name: a for name, a in (actuation.actuators if actuation is not None else {}).items()
               if isinstance(a, ShadowActuator)}
    if shadows:
        live.append(ShadowCollector(shadows))
    if actuation is not None and actuation.elector is not None:
        from service.actuators.leader_metrics import LeadershipCollector  # noqa: PLC0415

        live.append(LeadershipCollector(actuation.elector))
    return live


def _shadow_actuators(settings: Settings, board: Board) -> dict[str, Actuator]:
    """Shadow mode: each target's actions recorded and scored over decide.payback_horizon_s, nothing sent."""
    return {t.target: ShadowActuator(board, t.target, horizon_s=settings.decide.payback_horizon_s)
            for t in settings.actuation.targets}


def _kube_actuators(a: ActuationSettings, client: AsyncClient) -> dict[str, Actuator]:
    k = a.kubernetes
    actuators: dict[str, Actuator] = {}
    if a.mode == "routing":
        from service.actuators.routing import RoutingActuator  # noqa: PLC0415

        for t in a.targets:
            assert t.route and t.on_backend and t.off_backend and t.on_pool_k  # enforced by ActuatedTargetSettings
            actuators[t.target] = RoutingActuator(client, namespace=k.namespace, route=t.route,
                                                  on_backend=t.on_backend, off_backend=t.off_backend,
                                                  on_pool_k=t.on_pool_k)
    else:
        from service.actuators.kubernetes import DeploymentActuator  # noqa: PLC0415

        for t in a.targets:
            assert t.deployment  # enforced by ActuatedTargetSettings
            actuators[t.target] = DeploymentActuator(client, namespace=k.namespace, deployment=t.deployment,
                                                     container=t.container, schedule_mode=a.mode == "schedule",
                                                     speculative_config=t.speculative_config)
    return actuators


async def _close_actuation(actuation: Actuation) -> None:
    await actuation.runner.aclose()
    if actuation.elector is not None:  # after the last pass, before the client closes: give the lease back
        await actuation.elector.aclose()
    for close in actuation.closers:
        with contextlib.suppress(Exception):  # shutting down: a failed close must not mask the real exit
            await close()
    actuation.audit.close()


def _routes(settings: Settings) -> dict[str, str]:
    """Target name -> the route its settings name (targets without one are left out of /v1/routes)."""
    return {t.name: t.route for t in settings.targets if t.route is not None}


def _scraper(target: TargetSettings, settings: Settings, client: httpx.AsyncClient) -> Scraper:
    """The target's evidence source: its pod's /metrics, or (fleet mode) its model's replicas in Prometheus."""
    if target.prometheus_url is not None:
        assert target.model is not None  # enforced by TargetSettings
        return PrometheusFleetSource(
            client,
            target.prometheus_url,
            FleetSelection(model=target.model, selector=target.selector, rate_window_s=target.rate_window_s),
            timeout_s=settings.scrape_timeout_s,
            max_body_bytes=settings.max_body_bytes,
            auth=target_auth(target),
        )
    return EngineScraper(
        client, target.metrics_url, timeout_s=settings.scrape_timeout_s, max_body_bytes=settings.max_body_bytes,
        auth=target_auth(target), engine=target.engine,
    )


def target_auth(target: TargetSettings) -> httpx.Auth | None:
    """The credentials each scrape of `target` sends, read from their files per request (service/sources/auth.py)."""
    if target.authorization is not None:
        return BearerFileAuth(target.authorization.credentials_file)
    if target.basic_auth is not None:
        return BasicFileAuth(target.basic_auth.username, target.basic_auth.password_file)
    return None


def _report_loop_exit(task: asyncio.Task[None]) -> None:
    # The loop only ends by cancellation; anything else is a bug that /healthz will also show as a stall.
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        _log.critical("advisor loop died; /healthz will fail", exc_info=exc)


@contextlib.contextmanager
def _gpu_source(settings: GpuSettings, client: httpx.AsyncClient) -> Iterator[GpuReader]:
    if settings.telemetry == "dcgm":
        assert settings.dcgm_url is not None  # enforced by GpuSettings
        yield DcgmSource(
            client, settings.dcgm_url, timeout_s=settings.timeout_s, label_match=settings.dcgm_label_match
        )
    elif settings.telemetry == "nvml":
        nvml = NvmlSource()
        try:
            yield nvml
        finally:
            nvml.close()  # frees GPM buffers; a no-op when NVML never initialised
    else:
        yield NoGpuSource()


# ----------------------------------------------------------------------------------------------------------------
# Profiles: resolved per target when the served model name is first known
# ----------------------------------------------------------------------------------------------------------------


def context_resolver(target: TargetSettings, *, fallback_hardware: str) -> ContextResolver:
    """Check what can be checked now (named profiles exist, config.json parses), defer what needs the server."""
    fixed_hardware: HardwareProfile | None
    if isinstance(target.hardware, str):
        where = f"target {target.name}: hardware"
        fixed_hardware = None if target.hardware == "auto" else _named_hardware(target.hardware, where)
    else:
        # Operator-supplied datasheet numbers; the settings model already checked each field.
        fixed_hardware = hardware_from_spec(target.hardware.model_dump(exclude_none=True))
    fallback = _named_hardware(fallback_hardware, "fallback_hardware")
    fixed_model = _fixed_model(target)
    draft_model = _draft_model(target)

    def resolve(model_name: str, gpu: GpuSnapshot) -> ModelContext:
        hardware = fixed_hardware or _auto_hardware(gpu, fallback)
        model = fixed_model or model_for_served_name(model_name)
        if model is None:
            raise ContextUnavailableError(
                f"model '{model_name}' is not in the catalog; set the target's model_profile or model_config_path"
            )
        drafter = drafter_for(target.drafter.method, model, draft_model=draft_model,
                              draft_tensor_parallel=target.drafter.tensor_parallel or 0)
        if target.drafter.allowed_k:
            drafter = replace(drafter, allowed_k=tuple(sorted(set(target.drafter.allowed_k))))
        if target.drafter.prefix_stable is not None:
            drafter = replace(drafter, prefix_stable=target.drafter.prefix_stable)
        return ModelContext(hardware=hardware, model=model, drafter=drafter, tensor_parallel=target.tensor_parallel,
                            step_token_budget=target.max_num_batched_tokens, max_num_seqs=target.max_num_seqs)

    return resolve


def _named_hardware(name: str, where: str) -> HardwareProfile:
    try:
        return hardware_by_name(name)
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def _auto_hardware(gpu: GpuSnapshot, fallback: HardwareProfile) -> HardwareProfile:
    if gpu.device_name:
        detected = hardware_for_device_name(gpu.device_name)
        if detected is not None:
            return detected
    # Resolved once per (model, device name), so this is logged once, not every tick.
    seen = f"GPU '{gpu.device_name}' is not in the catalog" if gpu.device_name else f"no GPU name ({gpu.source})"
    _log.warning(
        "hardware 'auto' falls back",
        extra=fields(hardware=fallback.name, why=seen, fix="set the target's hardware to a catalog name"),
    )
    return fallback


def _fixed_model(target: TargetSettings) -> ModelProfile | None:
    if target.model_profile:
        try:
            return model_by_name(target.model_profile)
        except ValueError as exc:
            raise SettingsError(f"target {target.name}: model_profile: {exc}") from None
    if target.model_config_path is not None:
        path = target.model_config_path
        try:
            config: Any = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SettingsError(f"target {target.name}: model_config_path: cannot read {path}: {exc}") from None
        if not isinstance(config, dict):
            raise SettingsError(f"target {target.name}: model_config_path: {path} is not a JSON object")
        try:
            return model_from_hf_config(config, name=target.model or path.parent.name or "custom")
        except (KeyError, ValueError, TypeError) as exc:
            raise SettingsError(f"target {target.name}: model_config_path: {path}: {exc}") from None
    return None


def _draft_model(target: TargetSettings) -> ModelProfile | None:
    name = target.drafter.draft_model_profile
    if name is None:
        return None
    try:
        return model_by_name(name)
    except ValueError as exc:
        raise SettingsError(f"target {target.name}: drafter.draft_model_profile: {exc}") from None
