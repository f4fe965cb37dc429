"""`spec-advisor`: serve the sidecar, run the demo against the simulator, run the simulator alone, price a
hypothetical workload (`whatif`), print engine-native per-batch schedules (`schedule`), grade the advisor's
decisions against an oracle and static policies in simulated time (`bench`), or measure a server's step times
(`profile`, service/cli/profile_command.py).

Exit codes: 0 normal end, 1 a sidecar or file could not be reached/written, 2 bad usage, invalid settings or
invalid input (one clear message per problem, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from pydantic import ValidationError

from policies.model.measured_profile import MeasuredProfile, ProfileError, check_age
from policies.offline.schedule import MAX_NUM_SEQS_LIMIT
from policies.offline.whatif import WhatIfInputError, whatif_schedule_plan
from policies.types import DataState
from service.app import Sidecar, build_sidecar, package_version
from service.cli.backtest_command import add_backtest_command, run_backtest_command
from service.cli.profile_command import add_profile_command, run_profile_command
from service.cli.view import run_view
from service.http.whatif import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_NUM_SEQS,
    SchedulesOut,
    WhatIfRequest,
    run_whatif,
    schedule_out,
    schedule_text,
)
from service.logs import configure_logging, fields, get_logger
from service.profile import read_profile
from service.settings import Settings, SettingsError, load_settings, target_name_for_url
from service.sim.scenario import Scenario, ScenarioError, default_scenario, load_scenario
from service.sim.server import SimServer
from service.sim.world import World
from service.tasks import cancel_and_wait

EXIT_UNREACHABLE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# The demo compresses time so that the simulated load rises and falls within minutes, and shortens the dwell
# (production default 120 s) so a change of recommendation is visible soon after the load changes.
DEMO_TIME_SCALE = 2.0
DEMO_DWELL_S = 10.0
DEMO_WINDOW_S = 10.0
DEMO_INTERVAL_S = 1.0

_log = get_logger("cli")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-advisor",
        description="Tells vLLM operators whether speculative decoding should be on, and with how many draft tokens.",
    )
    parser.add_argument("--version", action="version", version=f"spec-advisor {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the sidecar against one or more inference servers")
    serve.add_argument("--config", type=Path, metavar="FILE", help="YAML settings file (env SPEC_ADVISOR_* overrides)")
    serve.add_argument(
        "--target", action="append", default=[], metavar="URL",
        help="inference server base URL or /metrics URL; repeat for several (replaces the file's targets)",
    )
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8321; 0 = any free port)")
    serve.add_argument("--log-format", choices=("text", "json"))
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"))

    demo = commands.add_parser("demo", help="simulated vLLM server + the sidecar + a live terminal view")
    demo.add_argument("--host", default="127.0.0.1", help="listen address of the API and the simulator")
    demo.add_argument("--port", type=int, default=8321, help="sidecar API port (0 = any free port)")
    demo.add_argument("--sim-port", type=int, default=0, help="simulated server port (default: any free port)")
    demo.add_argument(
        "--time-scale", type=_positive_float, default=DEMO_TIME_SCALE,
        help=f"simulated seconds per wall second (default {DEMO_TIME_SCALE:g}: the 240 s demo load cycle takes 2 min)",
    )
    demo.add_argument("--scenario", type=Path, metavar="FILE", help="scenario YAML/JSON (default: the packaged demo)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--duration-s", type=_positive_float, help="stop by itself after this many seconds")
    demo.add_argument("--no-view", action="store_true", help="no live view; log decision changes instead")
    demo.add_argument(
        "--model-profile", default="llama-3.1-8b", help="advisor's model profile for the simulated model (catalog name)"
    )
    demo.add_argument("--hardware", default="h100-sxm", help="advisor's hardware profile for the simulated GPU")
    demo.add_argument("--scrape-interval-s", type=float, default=DEMO_INTERVAL_S, help="advisor tick (default 1 s)")
    demo.add_argument(
        "--window-s", type=float, default=DEMO_WINDOW_S, help=f"estimator window (default {DEMO_WINDOW_S:g} s)"
    )
    demo.add_argument(
        "--dwell-s", type=float, default=DEMO_DWELL_S,
        help=f"decision dwell (default {DEMO_DWELL_S:g} s; production default 120 s)",
    )

    simulate = commands.add_parser("simulate", help="run only the simulated vLLM server (vLLM-format /metrics)")
    simulate.add_argument("--host", default="127.0.0.1")
    simulate.add_argument("--port", type=int, default=8000, help="listen port (default 8000, like vLLM)")
    simulate.add_argument("--scenario", type=Path, metavar="FILE")
    simulate.add_argument("--time-scale", type=_positive_float, default=1.0)
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--duration-s", type=_positive_float, help="stop by itself after this many seconds")
    _add_whatif_commands(commands)
    _add_bench_command(commands)
    add_profile_command(commands)
    add_backtest_command(commands)
    return parser


def _add_bench_command(commands: Any) -> None:
    bench = commands.add_parser(
        "bench", help="decision-quality benchmark: the advisor vs an oracle and static policies (docs/bench.md)"
    )
    bench.add_argument(
        "files", nargs="*", type=Path, metavar="FILE",
        help="scenario YAML/JSON files (default: the packaged service/sim/scenarios/bench/*.yaml)",
    )
    bench.add_argument(
        "--duration-s", type=_positive_float,
        help="simulated seconds per run (default: each scenario's bench.duration_s)",
    )
    bench.add_argument("--out", type=Path, default=Path("bench-out"), metavar="DIR",
                       help="where the table and the plots go (default ./bench-out)")
    bench.add_argument("--no-plots", action="store_true", help="skip the per-scenario PNGs")
    bench.add_argument("--schema", action="store_true",
                       help="print the JSON Schema of a scenario file (docs/scenario.schema.json) and exit")


def _add_whatif_commands(commands: Any) -> None:
    whatif = commands.add_parser(
        "whatif", help="price a hypothetical workload: JSON in (file or stdin), JSON out (docs/whatif.md)"
    )
    whatif.add_argument("input", nargs="?", default="-", metavar="FILE|-", help="what-if JSON (default: stdin)")
    whatif.add_argument("--plot", type=Path, metavar="FILE", help="also draw speedup vs batch per gamma as a PNG")
    whatif.add_argument("--compact", action="store_true", help="one-line JSON")
    _add_profile_arguments(whatif)

    schedule = commands.add_parser(
        "schedule", help="per-batch-size speculation schedules for vLLM and TensorRT-LLM, ready to paste"
    )
    schedule.add_argument(
        "input", nargs="?", metavar="FILE|-", help="what-if JSON describing the deployment (default: stdin)"
    )
    schedule.add_argument("--url", help="instead of a file: a running sidecar's base URL (its live schedules)")
    schedule.add_argument("--target", help="with --url: only this target")
    schedule.add_argument(
        "--max-num-seqs", type=_bounded_int(1, MAX_NUM_SEQS_LIMIT),
        help=f"the engine's --max-num-seqs (default {DEFAULT_MAX_NUM_SEQS}; with --url, the target's "
        "targets[].max_num_seqs where set)",
    )
    schedule.add_argument(
        "--context-tokens", type=_non_negative_float,
        help="context per sequence (default: the file's first context length, or the sidecar's observed one)",
    )
    schedule.add_argument(
        "--margin", type=_non_negative_float, default=0.0, help="gain K>=1 must show over K=0 (default 0)"
    )
    schedule.add_argument("--format", choices=("text", "json"), default="text")
    _add_profile_arguments(schedule)


def _add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", type=Path, metavar="FILE",
        help="price with the calibration fitted to this measured profile of the deployment (spec-advisor profile)",
    )
    parser.add_argument(
        "--max-profile-age-days", type=_positive_float, default=30.0,
        help="refuse a --profile older than this (default 30)",
    )


def _bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}..{high}, got {value}")
        return value

    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = _COMMANDS[args.command]  # argparse accepts only the commands it was given, the keys of _COMMANDS
    try:
        return command(args)
    except InputError as exc:
        print(f"spec-advisor {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours; silence the flush at exit (Python docs' recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_UNREACHABLE
    except (SettingsError, ScenarioError) as exc:
        print(f"spec-advisor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _serve_command(args: argparse.Namespace) -> int:
    settings = _serve_settings(args)
    configure_logging(log_format=settings.log_format, level=settings.log_level)
    sidecar = build_sidecar(settings)
    return asyncio.run(_serve(sidecar, duration_s=None))


def _serve_settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.target:
        overrides["targets"] = [{"name": target_name_for_url(url), "url": url} for url in args.target]
    for flag in ("host", "port", "log_format", "log_level"):
        value = getattr(args, flag)
        if value is not None:
            overrides[flag] = value
    return load_settings(args.config, overrides=overrides)


async def _serve(sidecar: Sidecar, *, duration_s: float | None) -> int:
    """Run uvicorn until SIGTERM/SIGINT (handled by uvicorn: graceful, runs the lifespan exit) or `duration_s`."""
    server, task, url = await _start_api(sidecar)
    if url is None:
        return 1
    print(f"spec-advisor API on {url} (recommendation: {url}/v1/recommendation, docs: {url}/docs)", flush=True)
    await _run_api(server, task, duration_s=duration_s)
    return 0


KEEP_ALIVE_S = 75


async def _start_api(sidecar: Sidecar) -> tuple[uvicorn.Server, asyncio.Task[None], str | None]:
    settings = sidecar.settings
    config = uvicorn.Config(
        sidecar.app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # h11 with the connection cap and the request read timeout (service/http/connection_guard.py). Pinned:
        # "auto" picks httptools when it is installed, and that protocol has neither.
        http=sidecar.connection_guard.protocol(),
        # No limit_concurrency: uvicorn answers 503 to a request once `limit_concurrency` connections are open,
        # idle kept-alive ones included, and never refuses a connection. An HTTP/1.1 connection runs one request
        # at a time, so the cap above already bounds requests in flight; a limit at or below it would answer 503
        # to Prometheus or a probe whenever that many clients keep connections alive.
        # Longer than the idle timeout of the clients and proxies in front of it (Prometheus, load balancers at
        # 60 s): with uvicorn's 5 s default, a client reusing an idle connection races the server closing it and
        # gets "server disconnected without a response" (seen under load in the real-vLLM test).
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            return server, task, None  # uvicorn failed to start (port in use...): it logged why
        await asyncio.sleep(0.05)
    host, port = settings.host, settings.port
    for listener in server.servers:
        for sock in listener.sockets:
            host, port = sock.getsockname()[:2]
    return server, task, f"http://{host}:{port}"


async def _run_api(server: uvicorn.Server, task: asyncio.Task[None], *, duration_s: float | None) -> None:
    if duration_s is not None:
        await asyncio.wait({task}, timeout=duration_s)
        server.should_exit = True
    await task


# ----------------------------------------------------------------------------------------------------------------
# demo and simulate
# ----------------------------------------------------------------------------------------------------------------


def _scenario(path: Path | None) -> Scenario:
    return load_scenario(path) if path is not None else default_scenario()


def demo_settings(*, sim_url: str, scenario: Scenario, args: argparse.Namespace) -> Settings:
    """The sidecar's settings for the demo: one target (the simulator) and its dcgm-exporter page, fast ticks,
    short window and dwell."""
    target: dict[str, Any] = {
        "name": "sim",
        "url": sim_url,
        "model": scenario.model_name,
        "model_profile": args.model_profile,
        "hardware": args.hardware,
        "drafter": {"method": scenario.drafter.method},
    }
    return load_settings(
        None,
        overrides={
            "targets": [target],
            "host": args.host,
            "port": args.port,
            "scrape_interval_s": args.scrape_interval_s,
            "scrape_timeout_s": args.scrape_interval_s,
            # The simulator serves a dcgm-exporter page beside the engine: the demo reads it, as a deployment
            # with dcgm-exporter would, so the calibration measures the device's bandwidth
            # (policies/model/calibrate.py).
            "gpu": {"telemetry": "dcgm", "dcgm_url": f"{sim_url}/dcgm/metrics"},
            "estimator": {"window_s": args.window_s, "stale_after_s": 5 * args.scrape_interval_s},
            "decide": {"dwell_s": args.dwell_s},
        },
    )


async def _demo(args: argparse.Namespace) -> int:
    scenario = _scenario(args.scenario)
    configure_logging(log_format="text", level="warning" if not args.no_view else "info")
    world = World(scenario, seed=args.seed, start_s=time.time())
    sim = SimServer(world, host=args.host, port=args.sim_port, time_scale=args.time_scale)
    await sim.start()
    view: asyncio.Task[None] | None = None
    try:
        settings = demo_settings(sim_url=sim.url, scenario=scenario, args=args)
        sidecar = build_sidecar(settings)
        server, task, url = await _start_api(sidecar)
        if url is None:
            return 1
        if args.no_view:
            print(f"simulated vLLM server on {sim.url}/metrics", flush=True)
            print(f"spec-advisor API on {url} (recommendation: {url}/v1/recommendation)", flush=True)
        else:
            lines = _demo_header(sim_url=sim.url, api_url=url, settings=settings, args=args, scenario=scenario)
            view = asyncio.create_task(
                run_view(sidecar.board, clock=time.time, header=lambda: [*lines, _world_line(world)], stream=sys.stdout)
            )
        await _run_api(server, task, duration_s=args.duration_s)
        return 0
    finally:
        if view is not None and (failed := await cancel_and_wait(view)) is not None:
            print(f"spec-advisor: the live view failed: {failed!r}", file=sys.stderr)
        await sim.stop()


def _demo_header(
    *, sim_url: str, api_url: str, settings: Settings, args: argparse.Namespace, scenario: Scenario
) -> list[str]:
    return [
        "spec-advisor demo  (Ctrl-C to stop)",
        f"simulated vLLM: {sim_url}/metrics   model {scenario.model_name} on '{scenario.hardware.name}'   "
        f"simulated time runs x{args.time_scale:g}",
        f"API: {api_url}/v1/recommendation   {api_url}/v1/evidence   {api_url}/metrics   {api_url}/docs",
        f"demo settings: dwell {settings.decide.dwell_s:g} s (production default 120 s), window "
        f"{settings.estimator.window_s:g} s, scrape every {settings.scrape_interval_s:g} s; advisor profiles "
        f"{args.model_profile} on {args.hardware}",
    ]


def _world_line(world: World) -> str:
    # The simulator's ground truth, for comparison with what the advisor measured below.
    return (
        f"simulated load now: {world.arrival_rate_per_s:.1f} requests/s arriving, {world.num_running} running, "
        f"{world.num_waiting} waiting; engine runs k={world.num_speculative_tokens}"
    )


async def _simulate(args: argparse.Namespace) -> int:
    scenario = _scenario(args.scenario)
    configure_logging(log_format="text", level="info")
    world = World(scenario, seed=args.seed, start_s=time.time())
    sim = SimServer(world, host=args.host, port=args.port, time_scale=args.time_scale)
    await sim.start()
    print(f"simulated vLLM server for '{scenario.model_name}' on {sim.url}/metrics (Ctrl-C to stop)", flush=True)
    _log.info("simulator started", extra=fields(url=sim.url, time_scale=args.time_scale))
    try:
        if args.duration_s is not None:
            await asyncio.sleep(args.duration_s)
        else:
            await asyncio.Event().wait()
    finally:
        await sim.stop()
    return 0


# ----------------------------------------------------------------------------------------------------------------
# whatif and schedule
# ----------------------------------------------------------------------------------------------------------------


class InputError(Exception):
    """A what-if input that cannot be read or priced; the message names the fields (one line per problem)."""


def _read_request(source: str) -> WhatIfRequest:
    # The same bound as the HTTP body: a what-if is a few KB even with an inline config.json.
    limit = DEFAULT_MAX_BODY_BYTES
    try:
        if source == "-":
            text = sys.stdin.read(limit + 1)
        else:
            with Path(source).open(encoding="utf-8") as handle:
                text = handle.read(limit + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {source}: {exc}") from None
    if len(text) > limit:
        raise InputError(f"input larger than {limit} bytes (the what-if limit)")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, or an integer past Python's digit limit
        raise InputError(f"input is not JSON: {exc}") from None
    try:
        return WhatIfRequest.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc']) or 'input'}: {error['msg']}" for error in exc.errors()
        ]
        raise InputError("invalid input\n  " + "\n  ".join(problems)) from None


def _profile_arg(args: argparse.Namespace) -> MeasuredProfile | None:
    """The --profile file, read and checked for age (InputError naming the problem); None without one."""
    if args.profile is None:
        return None
    try:
        profile = read_profile(args.profile)
        check_age(profile, now_s=time.time(), max_age_s=args.max_profile_age_days * 86400.0)
    except ProfileError as exc:
        raise InputError(f"--profile: {exc}") from None
    return profile


def _whatif(args: argparse.Namespace) -> int:
    request = _read_request(args.input)
    profile = _profile_arg(args)
    try:
        response = run_whatif(request, profile)
    except WhatIfInputError as exc:
        raise InputError(str(exc)) from None
    if args.plot is not None:
        from service.cli.plot import PlotUnavailableError, plot_whatif  # noqa: PLC0415  (matplotlib is optional)

        try:
            plot_whatif(response, args.plot)
        except PlotUnavailableError as exc:
            raise InputError(str(exc)) from None
        except OSError as exc:
            print(f"spec-advisor whatif: cannot write {args.plot}: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
    print(response.model_dump_json(indent=None if args.compact else 2))
    return 0


def _schedule(args: argparse.Namespace) -> int:
    if args.url is not None:
        if args.input is not None:
            raise InputError("give either a what-if FILE or --url, not both")
        if args.profile is not None:
            raise InputError("--profile applies to a what-if FILE; a sidecar's target loads its own (settings)")
        return _schedule_from_sidecar(args)
    if args.target is not None:
        raise InputError("--target only applies with --url")
    request = _read_request(args.input or "-")
    profile = _profile_arg(args)
    try:
        plan = whatif_schedule_plan(
            request.to_input(), max_num_seqs=args.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            context_tokens=args.context_tokens,
            margin=args.margin, profile=profile,
        )
    except WhatIfInputError as exc:
        raise InputError(str(exc)) from None
    reason = (
        "from the what-if input (uncalibrated profiles; a live sidecar calibrates to the server)" if profile is None
        else f"from the what-if input, calibrated on the measured profile {args.profile}"
    )
    out = schedule_out(target="what-if", model=plan.ctx.model.name, state=DataState.OK, reason=reason, plan=plan)
    print(out.model_dump_json(indent=2) if args.format == "json" else schedule_text(out), end="")
    if args.format == "json":
        print()
    return 0


def _schedule_from_sidecar(args: argparse.Namespace) -> int:
    params: dict[str, str | int | float] = {"margin": args.margin}
    if args.max_num_seqs is not None:
        params["max_num_seqs"] = args.max_num_seqs
    if args.target is not None:
        params["target"] = args.target
    if args.context_tokens is not None:
        params["context_tokens"] = args.context_tokens
    url = args.url.rstrip("/") + "/v1/schedule"
    try:
        reply = httpx.get(url, params=params, timeout=30.0)
    except httpx.HTTPError as exc:
        print(f"spec-advisor schedule: cannot reach {url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if reply.status_code != 200:
        print(f"spec-advisor schedule: {url} answered {reply.status_code}: {reply.text[:500]}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        schedules = SchedulesOut.model_validate_json(reply.content)
    except ValidationError as exc:
        print(f"spec-advisor schedule: {url} did not answer a schedule: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.format == "json":
        print(schedules.model_dump_json(indent=2))
    else:
        print("\n".join(schedule_text(out) for out in schedules.targets), end="")
    return 0


# ----------------------------------------------------------------------------------------------------------------
# bench
# ----------------------------------------------------------------------------------------------------------------


def _bench_command(args: argparse.Namespace) -> int:
    from service.bench.command import run_bench  # noqa: PLC0415  (only `bench` needs the bench package)
    from service.bench.spec import bench_scenario_json_schema  # noqa: PLC0415

    if args.schema:
        print(json.dumps(bench_scenario_json_schema(), indent=2))
        return 0
    return run_bench(args.files, duration_s=args.duration_s, out_dir=args.out, plots=not args.no_plots)


# What each COMMAND of `build_parser` runs; the exit code is what it returns.
_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve_command,
    "demo": lambda args: asyncio.run(_demo(args)),
    "simulate": lambda args: asyncio.run(_simulate(args)),
    "whatif": _whatif,
    "schedule": _schedule,
    "profile": run_profile_command,
    "backtest": run_backtest_command,
    "bench": _bench_command,
}


if __name__ == "__main__":
    sys.exit(main())
