"""The `spec-advisor profile` command: the plan of service/profile.py against a server over HTTP, written to a file.

Reads the server's `/metrics` (the sidecar's own scraper and parser), `/v1/models` (the served model, when not
given) and `/version` (vLLM's OpenAI server; recorded in the profile, "" when the server has none), and loads it
through `/v1/completions` (service/loadgen.py). Progress goes to stderr, one line per level; the profile JSON to
`--out`, written atomically. An existing `--out` is never overwritten: `--append` adds to it (the same deployment
measured again, e.g. with speculation off), otherwise the command refuses.

Exit codes: 0 the plan ran to its end (a level skipped for too few steps or no drafts is reported on its line, and
the others are written); 1 the server could not be reached, or died mid-plan (the levels measured so far are
written, marked incomplete), or no level gave a point; 2 bad usage, a refusal (a busy server without --force, an
existing --out without --append), or an `--append` to a profile of another deployment or engine version; 130
Ctrl-C (the levels measured before it are written, marked incomplete).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from policies.model.costmodel import ModelContext
from policies.model.measured_profile import (
    MAX_PROFILE_POINTS,
    MeasuredProfile,
    ProfileError,
    ProfileIdentity,
    drafter_degree,
    merged,
)
from policies.types import EngineSnapshot, GpuSnapshot
from service.app import context_resolver
from service.loadgen import ClosedLoop, run_closed_loop
from service.profile import (
    INTERRUPTED,
    LevelLoad,
    ProfileOutcome,
    ProfilePlan,
    ProfileRefusedError,
    Timebase,
    describe,
    parse_levels,
    progress_line,
    read_profile,
    run_profile,
)
from service.settings import SettingsError, TargetSettings
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.scraper import EngineScraper

EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's convention for a run ended by SIGINT
_HTTP_TIMEOUT_S = 10.0

# Prompts of everyday requests (code, prose, lists): what an n-gram drafter meets in chat traffic. The engine's
# steps, not the answers, are measured; the acceptance they reach is recorded beside each level.
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and two tests.",
    "Summarise the causes of the French Revolution in five bullet points.",
    "List the planets of the solar system with one fact about each.",
    "Explain what a hash map is to a new programmer, with a short example in Python.",
    "Translate to French: The quick brown fox jumps over the lazy dog. The dog does not move.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Describe a morning routine for a productive workday, step by step.",
    "Continue the sequence and explain the rule: 2, 4, 8, 16, 32,",
)


class ProfileCommandError(Exception):
    """Bad usage or a refused plan: exit 2 with this message."""


def add_profile_command(commands: Any) -> None:
    profile = commands.add_parser(
        "profile",
        help="measure a server's step times at closed-loop concurrency levels: the calibration serve and whatif "
        "load (docs/profile.md)",
    )
    profile.add_argument("--url", required=True, help="the inference server's base URL (http://host:8000)")
    profile.add_argument("--out", type=Path, required=True, metavar="FILE", help="where the profile JSON goes")
    profile.add_argument("--hardware", required=True, help="the server's hardware profile (catalog name)")
    profile.add_argument("--model-profile", required=True, help="the served model's profile (catalog name)")
    profile.add_argument(
        "--drafter-method", default="ngram", help="the drafting method the server is configured with (default ngram)"
    )
    profile.add_argument("--draft-model-profile", help="with --drafter-method draft_model: the drafter's catalog name")
    profile.add_argument("--tensor-parallel", type=int, default=1, help="the server's --tensor-parallel-size")
    profile.add_argument(
        "--draft-tensor-parallel", type=int,
        help="with --drafter-method draft_model: the GPUs the draft model runs on (speculative_config's "
        "draft_tensor_parallel_size: 1 or --tensor-parallel; default --tensor-parallel)",
    )
    profile.add_argument("--model", help="served model name (default: the only one /v1/models lists)")
    profile.add_argument(
        "--concurrency", default="1,2,4,8,16,32", metavar="C1,C2,...",
        help="closed-loop client counts, ascending (default 1,2,4,8,16,32)",
    )
    profile.add_argument("--level-s", type=float, default=20.0, help="seconds measured per level (default 20)")
    profile.add_argument("--warmup-s", type=float, default=5.0, help="unmeasured seconds before each (default 5)")
    profile.add_argument("--max-tokens", type=int, default=128, help="completion tokens per request (default 128)")
    profile.add_argument(
        "--append", action="store_true", help="add to --out's profile (the same deployment, e.g. speculation off)"
    )
    profile.add_argument("--force", action="store_true", help="load the server even if it is serving traffic")


def run_profile_command(args: argparse.Namespace) -> int:
    """The command (module docstring); messages on stderr."""
    try:
        plan = _plan(args)
        ctx = _context(args)
        previous = _previous(args.out) if args.append else None
        if previous is None and args.out.exists():
            raise ProfileCommandError(f"{args.out} exists: pass --append to add to it, or choose another --out")
        if previous is not None and len(previous.points) + len(plan.levels) > MAX_PROFILE_POINTS:
            raise ProfileCommandError(
                f"{args.out} holds {len(previous.points)} points; {len(plan.levels)} more would pass the "
                f"{MAX_PROFILE_POINTS} a profile holds: write a new profile"
            )
        return asyncio.run(_run(args, plan, ctx, previous))
    except KeyboardInterrupt:  # before the first level started: nothing was measured, nothing is written
        print("spec-advisor profile: interrupted before any level was measured; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ProfileCommandError, ProfileRefusedError, ProfileError) as exc:
        print(f"spec-advisor profile: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _plan(args: argparse.Namespace) -> ProfilePlan:
    try:
        levels = parse_levels(args.concurrency)
    except ValueError as exc:
        raise ProfileCommandError(f"--concurrency: {exc}") from None
    if not 1 <= args.max_tokens <= 4096:
        raise ProfileCommandError(f"--max-tokens must be 1..4096, got {args.max_tokens}")
    return ProfilePlan(levels=levels, level_s=args.level_s, warmup_s=args.warmup_s, force=args.force)


def _context(args: argparse.Namespace) -> ModelContext:
    drafter: dict[str, str | int] = {"method": args.drafter_method}
    if args.draft_model_profile:
        drafter["draft_model_profile"] = args.draft_model_profile
    if args.draft_tensor_parallel is not None:
        drafter["tensor_parallel"] = args.draft_tensor_parallel
    try:
        target = TargetSettings.model_validate({
            "name": "profile", "url": args.url, "hardware": args.hardware, "model_profile": args.model_profile,
            "drafter": drafter, "tensor_parallel": args.tensor_parallel,
        })
        resolve = context_resolver(target, fallback_hardware=args.hardware)
        return resolve(args.model or "", GpuSnapshot(taken_at_s=0.0, source="absent"))
    except ValidationError as exc:
        problems = "; ".join(_problem(".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors())
        raise ProfileCommandError(problems) from None
    except SettingsError as exc:
        raise ProfileCommandError(str(exc)) from None


def _problem(path: str, message: str) -> str:
    # A model-level error (the target's own validator) has no field path.
    return f"{path}: {message}" if path else message


def _previous(path: Path) -> MeasuredProfile | None:
    return read_profile(path) if path.exists() else None


class _HttpEngine:
    """The Engine of service/profile.py over HTTP: one model's /metrics snapshot, and the closed-loop load."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str, max_tokens: int) -> None:
        self._client = client
        self._base_url = base_url
        self._model = model
        self._max_tokens = max_tokens
        self._scraper = EngineScraper(client, f"{base_url}/metrics", timeout_s=_HTTP_TIMEOUT_S)

    async def scrape(self, now_s: float) -> EngineSnapshot:
        snapshots = await self._scraper.scrape(now_s)
        if self._model in snapshots:
            return snapshots[self._model]
        raise ScrapeError(
            ScrapeErrorReason.MODEL_MISSING, f"/metrics has no model {self._model!r} (it serves {sorted(snapshots)})"
        )

    async def drive(self, concurrency: int, duration_s: float) -> LevelLoad:
        load = ClosedLoop(
            model=self._model, concurrency=concurrency, duration_s=duration_s, max_tokens=self._max_tokens,
            prompts=PROMPTS,
        )
        result = await run_closed_loop(self._client, self._base_url, load)
        return LevelLoad(
            requests=result.requests, errors=result.errors, completion_tokens=result.completion_tokens,
            stopped_early=result.stopped_early,
        )


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    reply = await client.get(url, timeout=_HTTP_TIMEOUT_S)
    reply.raise_for_status()
    return reply.json()


async def _served_model(client: httpx.AsyncClient, base_url: str, wanted: str | None) -> str:
    if wanted:
        return str(wanted)
    try:
        data = await _get_json(client, f"{base_url}/v1/models")
        names = [str(item["id"]) for item in data["data"]]
    except (KeyError, TypeError, ValueError, httpx.HTTPStatusError) as exc:
        raise ProfileCommandError(f"{base_url}/v1/models did not list the served models: {exc}") from None
    if len(names) != 1:
        raise ProfileCommandError(f"the server serves {names}: name one with --model")
    return names[0]


async def _engine_version(client: httpx.AsyncClient, base_url: str) -> str:
    try:
        data = await _get_json(client, f"{base_url}/version")
        return str(data.get("version", "")) if isinstance(data, dict) else ""
    except (httpx.HTTPStatusError, ValueError):
        return ""  # engines without a /version endpoint: recorded as unknown


async def _run(
    args: argparse.Namespace, plan: ProfilePlan, ctx: ModelContext, previous: MeasuredProfile | None
) -> int:
    base_url = args.url.rstrip("/").removesuffix("/metrics")
    limits = httpx.Limits(max_connections=max(plan.levels) + 8, max_keepalive_connections=max(plan.levels) + 8)
    async with httpx.AsyncClient(limits=limits, timeout=_HTTP_TIMEOUT_S) as client:
        try:
            model = await _served_model(client, base_url, args.model)
            version = await _engine_version(client, base_url)
        except httpx.HTTPError as exc:
            print(f"spec-advisor profile: cannot reach {base_url}: {exc}", file=sys.stderr)
            return EXIT_SERVER
        identity = ProfileIdentity(
            hardware=ctx.hardware.name, model_profile=ctx.model.name, tensor_parallel=ctx.tensor_parallel,
            drafter_method=str(ctx.drafter.method), drafter_params=float(ctx.drafter.params),
            drafter_tensor_parallel=drafter_degree(ctx), engine="vllm",
            engine_version=version, served_model=model,
        )
        if previous is not None:
            merged(previous, MeasuredProfile(identity=identity, created_at_s=time.time(), points=()))
        engine = _HttpEngine(client, base_url, model, args.max_tokens)
        print(describe(plan.levels, plan), file=sys.stderr, flush=True)
        try:
            outcome = await run_profile(
                plan, engine, ctx, identity, timebase=Timebase(clock=time.time),
                on_level=lambda r: print(progress_line(r, total=len(plan.levels)), file=sys.stderr, flush=True),
            )
        except ScrapeError as exc:
            print(f"spec-advisor profile: cannot read {base_url}/metrics: {exc}", file=sys.stderr)
            return EXIT_SERVER
    return _write(args.out, outcome, previous)


def _write(path: Path, outcome: ProfileOutcome, previous: MeasuredProfile | None) -> int:
    interrupted = outcome.stopped is not None and outcome.stopped.startswith(INTERRUPTED)
    if outcome.profile is None:
        print(f"spec-advisor profile: no level was measured; {outcome.stopped or 'see the lines above'}",
              file=sys.stderr)
        return EXIT_INTERRUPTED if interrupted else EXIT_SERVER
    profile = outcome.profile if previous is None else merged(previous, outcome.profile)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(profile.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        print(f"spec-advisor profile: cannot write {path}: {exc}", file=sys.stderr)
        return EXIT_SERVER
    measured = len(outcome.profile.points)
    if interrupted:
        print(f"spec-advisor profile: {outcome.stopped}; wrote the {measured} measured levels to {path} "
              "(marked incomplete)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome.stopped is not None:
        print(f"spec-advisor profile: stopped: {outcome.stopped}; wrote the {measured} measured levels to {path} "
              "(marked incomplete)", file=sys.stderr)
        return EXIT_SERVER
    print(f"wrote {measured} levels to {path} ({len(profile.points)} in the profile)", file=sys.stderr)
    return 0
