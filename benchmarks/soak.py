"""Soak: the real sidecar against the simulated vLLM server for an hour of simulated time at ~1000 requests/s.

    .venv/bin/python -m benchmarks.soak [--duration-s 3600] [--time-scale 20] [--interval-s 5] [--out soak.json]

Prints figures; asserts nothing (the exit status is 0 whatever the verdicts, 1 when the run itself failed).

Two processes, started the way users start them: `spec-advisor simulate` (the simulated vLLM server, its own process
so the sidecar's memory is the sidecar's alone) on `benchmarks/soak_1k_rps.yaml` (about 1000 requests/s arriving:
900 -> 1100 -> 900 every 10 simulated minutes, 500 to 900 running), with simulated time running `--time-scale`
times faster than the wall clock; and `spec-advisor serve --config FILE` scraping it (and its dcgm-exporter page)
every `--interval-s` seconds of WALL time, its normal interval. The simulator advances lazily on each request, so
this script asks it for `/sim/state` every half second: no scrape of the sidecar has to wait for the simulator to
catch up on many simulated seconds at once, and that reply gives the simulated clock the run is measured on.

Every `--sample-s` wall seconds it samples, in this order: the sidecar's RSS (`VmRSS` of /proc/PID/status), its
threads, its CPU time (/proc/PID/stat), its open file descriptors (entries of /proc/PID/fd); its `/metrics` (kept-
alive connection, as Prometheus scrapes): `specadvisor_last_good_scrape_age_seconds`, the last good scrape's
timestamp, `specadvisor_loop_iterations_total`, the scrape errors and the decision state; then `GET /healthz` on a
fresh connection each time (as a kubelet probes), timed.

At the end: a table per tenth of the simulated run, and one verdict line per series. RSS and fds: a least-squares
line over the samples of the second half of the run (the first half holds the warm-up), its slope per simulated
hour (and per wall hour at this interval), and the rise it fits across that half, also per sidecar iteration,
compared with the samples' own noise: "flat" when the fitted rise is at most max(2 x the residuals' standard
deviation, a floor of 1 MiB / 1 fd), "RISING" otherwise; a rise within that noise whose slope is still more than two
standard errors above zero is flagged as a steady rise to settle with a longer run. The sidecar's warm-up runs on
the WALL clock: the calibration keeps up to 64 points at least 20 s apart (policies/model/calibrate.py), about 21
minutes to fill, so at x20 the whole run is inside it, and only a lower --time-scale (1: an hour) shows the steady
state. Scrape lag: the largest `last_good_scrape_age_seconds` seen and the longest gap between successive good
scrapes, against the interval ("OK" up to 2 intervals); iterations: finished loop iterations against wall time /
interval. The host's load average is sampled too: on a busy box the lag and /healthz latency are the box's.

Both subprocesses are stopped (SIGTERM, then SIGKILL after 10 s) on every exit: the end of the run, a failure,
Ctrl-C or SIGTERM; they also get SIGTERM if this process dies (PR_SET_PDEATHSIG), and the simulator stops by itself
a few minutes after the run's wall-time budget. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import itertools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from service.sim.scenario import Scenario, load_scenario

SCENARIO = Path(__file__).resolve().with_name("soak_1k_rps.yaml")
TICK_S = 0.5  # how often the simulator is asked for its state (keeps its lazy advance in small steps)
HTTP_TIMEOUT_S = 5.0
START_TIMEOUT_S = 60.0  # for each process to listen, and for the sidecar's first good scrape
STOP_GRACE_S = 10.0
SIM_SILENT_S = 60.0
RSS_FLOOR_MIB = 1.0  # below this a fitted rise is not called a leak, whatever the residuals
FD_FLOOR = 1.0
BINS = 10
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1


class SoakError(RuntimeError):
    """The run could not go on (a process died or did not start, the simulated clock fell behind)."""


@dataclass(slots=True)
class Sample:
    """One sample; times are seconds since the soak started (the sidecar's first good scrape)."""

    wall_s: float
    sim_s: float
    rss_kib: int
    fds: int
    threads: int
    cpu_s: float
    iterations: float | None = None
    scrape_age_s: float | None = None
    last_good_scrape_s: float | None = None  # Unix time of the last good scrape (the sidecar's gauge)
    scrape_errors: float | None = None
    decision_state: str | None = None
    healthz_s: float | None = None  # latency of GET /healthz; None when it failed
    healthz_status: int | None = None
    arrival_rate_per_s: float = 0.0  # the simulator's truth at this time
    running: int = 0
    waiting: int = 0
    host_load_1m: float = field(default_factory=lambda: os.getloadavg()[0])  # other work on the box skews latency


@dataclass(frozen=True, slots=True)
class Trend:
    """Least-squares line y = a + slope x over (x in simulated hours) and how it compares with the noise."""

    n: int
    slope_per_sim_h: float
    slope_stderr: float
    rise: float  # slope x the x-span: what the line climbs across the samples
    resid_sd: float
    noise: float  # max(2 x resid_sd, floor): the rise above which the series is called rising
    first: float
    last: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """flat: the fitted rise is within the noise; RISING: above it. A rise within the noise whose slope is
        still more than 2 standard errors above zero is flagged: too small to call here, steady enough that a run
        with more sidecar iterations (a lower --time-scale) should look again."""
        if self.rise > self.noise:
            return "RISING"
        if self.slope_per_sim_h > 2 * self.slope_stderr and self.rise > 0:
            return "flat (within the noise, but a steady rise: run longer in wall time to settle it)"
        return "flat"


@dataclass(slots=True)
class Run:
    """What one soak saw; `samples` grows while it runs, so an interrupted run still has its figures."""

    args: dict[str, Any]
    scenario: str
    samples: list[Sample] = field(default_factory=list)
    sim_requests_completed: int = 0
    simulator_misses: int = 0  # /sim/state requests of this script that failed (timed out on a busy host)
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    interrupted: bool = False
    error: str | None = None
    sidecar_exit: int | None = None
    simulator_exit: int | None = None
    sidecar_log_warnings: int = 0
    sidecar_log_tail: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------------
# processes
# ----------------------------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGTERM when this (parent) process dies, even by SIGKILL.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _spec_advisor() -> list[str]:
    """The `spec-advisor` command beside this interpreter (what users run), else the same module through it."""
    script = Path(sys.executable).with_name("spec-advisor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "service.cli.command"]


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(  # the child keeps its own copy of the log's descriptor
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # a Ctrl-C reaches this script only; it stops the children in order
            preexec_fn=_die_with_parent,  # noqa: PLW1509  (no threads here when it forks)
        )


def _stop(proc: subprocess.Popen[bytes] | None) -> int | None:
    """SIGTERM, up to STOP_GRACE_S for a graceful exit, then SIGKILL; the exit status (None if not started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
    return proc.returncode


def _tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _wait_for_url(log: Path, pattern: str, proc: subprocess.Popen[bytes], what: str) -> str:
    """The base URL a process printed on start-up (it may have picked its own port); bounded."""
    deadline = time.monotonic() + START_TIMEOUT_S
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        match = regex.search(log.read_text(encoding="utf-8", errors="replace"))
        if match:
            return match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = "\n    ".join(_tail(log))
    raise SoakError(f"{what} did not start (exit {proc.poll()}); its output ends:\n    {tail}")


def _wait_ready(client: httpx.Client, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if client.get(f"{url}/readyz").status_code == 200:
                return
        time.sleep(0.2)
    tail = "\n    ".join(_tail(log))
    raise SoakError(f"the sidecar was not ready within {START_TIMEOUT_S:g} s (exit {proc.poll()}):\n    {tail}")


def _sidecar_config(path: Path, *, sim_url: str, scenario: Scenario, interval_s: float) -> None:
    config = {
        "targets": [{
            "name": "sim", "url": sim_url, "model": scenario.model_name,
            # The soak world is a 1B model on a B200-like GPU with an EAGLE head: the advisor's matching profiles.
            "hardware": "b200", "model_profile": "llama-3.2-1b", "drafter": {"method": "eagle"},
        }],
        "scrape_interval_s": interval_s,
        "scrape_timeout_s": min(4.0, 0.8 * interval_s),  # the defaults at the default 5 s
        "host": "127.0.0.1",
        "port": 0,
        "log_format": "text",
        "log_level": "info",
        # The simulator serves a dcgm-exporter page beside the engine, read as a deployment with dcgm-exporter would.
        "gpu": {"telemetry": "dcgm", "dcgm_url": f"{sim_url}/dcgm/metrics"},
        # The defaults (60 s, 30 s) at intervals up to 25 s; scaled with longer ones so the settings stay valid.
        "estimator": {"window_s": max(60.0, 12 * interval_s), "stale_after_s": max(30.0, 6 * interval_s)},
    }
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML


# ----------------------------------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------------------------------


def _proc_figures(pid: int) -> tuple[int, int, int, float]:
    """(RSS KiB, threads, open fds, CPU seconds) of a live process, from /proc."""
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    after_name = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces; fields resume after ")"
    cpu_s = (int(after_name[11]) + int(after_name[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    return rss, threads, fds, cpu_s


def _read_metrics(sample: Sample, text: str) -> None:
    errors = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "specadvisor_loop_iterations_total":
                sample.iterations = s.value
            elif s.name == "specadvisor_last_good_scrape_age_seconds":
                sample.scrape_age_s = max(s.value, sample.scrape_age_s or 0.0)
            elif s.name == "specadvisor_last_good_scrape_timestamp_seconds":
                sample.last_good_scrape_s = s.value
            elif s.name == "specadvisor_scrape_errors_total":
                errors += s.value
            elif s.name == "specadvisor_decision_state" and s.value == 1.0:
                sample.decision_state = s.labels.get("state")
    sample.scrape_errors = errors


def _sample(
    *, pid: int, client: httpx.Client, url: str, clocks: tuple[float, float], state: dict[str, Any]
) -> Sample:
    rss, threads, fds, cpu_s = _proc_figures(pid)
    sample = Sample(
        wall_s=clocks[0], sim_s=clocks[1], rss_kib=rss, fds=fds, threads=threads, cpu_s=cpu_s,
        arrival_rate_per_s=float(state.get("arrival_rate_per_s", 0.0)),
        running=int(state.get("num_requests_running", 0)), waiting=int(state.get("num_requests_waiting", 0)),
    )
    with contextlib.suppress(httpx.HTTPError, ValueError):
        reply = client.get(f"{url}/metrics")
        if reply.status_code == 200:
            _read_metrics(sample, reply.text)
    # A fresh connection each time, as a kubelet probes; http.client, so the time is the request's, not a client's
    # set-up (an httpx client builds an SSL context even for http).
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=HTTP_TIMEOUT_S)
    try:
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        health = connection.getresponse()
        health.read()
        sample.healthz_s = time.perf_counter() - started
        sample.healthz_status = health.status
    except (OSError, http.client.HTTPException):
        pass
    finally:
        connection.close()
    return sample


def _check_alive(procs: Sequence[tuple[str, subprocess.Popen[bytes]]]) -> None:
    for name, proc in procs:
        if proc.poll() is not None:
            raise SoakError(f"the {name} exited during the run (status {proc.returncode})")


def _progress(run: Run, duration_s: float) -> None:
    s = run.samples[-1]
    print(
        f"  {100 * s.sim_s / duration_s:5.1f}%  sim {s.sim_s / 60:5.1f} min  wall {s.wall_s:6.1f} s  "
        f"RSS {s.rss_kib / 1024:6.1f} MiB  fds {s.fds:3d}  age {_fmt(s.scrape_age_s, '.1f')} s  "
        f"iterations {_fmt(s.iterations, '.0f')}  load {s.arrival_rate_per_s:6.0f} req/s  running {s.running}",
        flush=True,
    )


def _soak_loop(run: Run, *, sim_url: str, api_url: str, sidecar: subprocess.Popen[bytes],
               procs: Sequence[tuple[str, subprocess.Popen[bytes]]]) -> None:
    args = run.args
    duration_s, time_scale = float(args["duration_s"]), float(args["time_scale"])
    wall_budget_s = 1.5 * duration_s / time_scale + 60.0
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as sim, httpx.Client(timeout=HTTP_TIMEOUT_S) as api:
        state = sim.get(f"{sim_url}/sim/state").json()
        sim0, wall0 = float(state["sim_time_s"]), time.monotonic()
        completed0 = int(state.get("completed_requests", 0))
        next_sample, next_report = wall0, 0.0
        sim_s = 0.0
        last_answer = wall0
        while sim_s < duration_s:
            now = time.monotonic()
            if now - wall0 > wall_budget_s:
                raise SoakError(f"simulated time fell behind: {sim_s:.0f} of {duration_s:.0f} s after "
                                f"{wall_budget_s:.0f} s of wall time")
            _check_alive(procs)
            try:
                state = sim.get(f"{sim_url}/sim/state").json()
                last_answer = now
            except (httpx.HTTPError, ValueError):
                # A busy host can starve the simulator for a moment (seen: a real-vLLM test beside the soak);
                # the sample goes on with the last state, and only a simulator silent for long ends the run.
                run.simulator_misses += 1
                if now - last_answer > SIM_SILENT_S:
                    raise SoakError(f"the simulator has not answered for {SIM_SILENT_S:g} s") from None
            sim_s = float(state["sim_time_s"]) - sim0
            run.sim_requests_completed = int(state.get("completed_requests", 0)) - completed0
            if now >= next_sample:
                clocks = (now - wall0, sim_s)
                run.samples.append(_sample(pid=sidecar.pid, client=api, url=api_url, clocks=clocks, state=state))
                next_sample = max(next_sample + float(args["sample_s"]), now)
                if sim_s >= next_report:
                    _progress(run, duration_s)
                    next_report += duration_s / BINS
            time.sleep(TICK_S)


# ----------------------------------------------------------------------------------------------------------------
# analysis
# ----------------------------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def trend(xs: Sequence[float], ys: Sequence[float], *, floor: float) -> Trend | None:
    """Least-squares line through (x, y); None with fewer than 3 points or no spread in x."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    resid_sd = math.sqrt(sum(r * r for r in resid) / (n - 2))
    return Trend(
        n=n, slope_per_sim_h=slope, slope_stderr=resid_sd / math.sqrt(sxx), rise=slope * (max(xs) - min(xs)),
        resid_sd=resid_sd, noise=max(2 * resid_sd, floor), first=ys[0], last=ys[-1], low=min(ys), high=max(ys),
    )


def _bins(samples: Sequence[Sample], duration_s: float) -> Iterator[tuple[int, list[Sample], Sample | None]]:
    """(bin index, its samples, the sample just before the bin) per tenth of the simulated run."""
    previous: Sample | None = None
    for i in range(BINS):
        low, high = i * duration_s / BINS, (i + 1) * duration_s / BINS
        inside = [s for s in samples if low <= s.sim_s < high or (i == BINS - 1 and s.sim_s >= high)]
        if inside:
            yield i, inside, previous
            previous = inside[-1]


def _rate(last: Sample, first: Sample, value: str) -> float | None:
    a, b = getattr(first, value), getattr(last, value)
    dt = last.wall_s - first.wall_s
    return None if a is None or b is None or dt <= 0 else (b - a) / dt


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(samples: Sequence[Sample], *, duration_s: float, interval_s: float) -> list[dict[str, Any]]:
    """One row per tenth of the simulated run (rates over the bin, from the sample before it when there is one)."""
    rows = []
    for i, inside, before in _bins(samples, duration_s):
        first, last = before or inside[0], inside[-1]
        iterations = None if last.iterations is None or first.iterations is None else last.iterations - first.iterations
        cpu_per_s = _rate(last, first, "cpu_s")
        healthz = [s.healthz_s for s in inside if s.healthz_s is not None]
        ages = [s.scrape_age_s for s in inside if s.scrape_age_s is not None]
        states = sorted({s.decision_state for s in inside if s.decision_state})
        rows.append({
            "tenth": i + 1, "sim_min_end": inside[-1].sim_s / 60, "wall_s_end": inside[-1].wall_s,
            "samples": len(inside),
            "rss_mib_median": statistics.median(s.rss_kib for s in inside) / 1024,
            "rss_mib_max": max(s.rss_kib for s in inside) / 1024,
            "fds_median": statistics.median(s.fds for s in inside), "fds_max": max(s.fds for s in inside),
            "threads_max": max(s.threads for s in inside),
            "cpu_percent": None if cpu_per_s is None else 100 * cpu_per_s,
            "scrape_age_max_s": max(ages) if ages else None,
            # Whole iterations against the intervals the bin spans: one more or fewer is the bin edge, not a stall.
            "iterations": iterations, "iterations_expected": (last.wall_s - first.wall_s) / interval_s,
            "healthz_ms_median": None if not healthz else 1e3 * statistics.median(healthz),
            "healthz_ms_max": None if not healthz else 1e3 * max(healthz),
            "healthz_not_200": sum(1 for s in inside if s.healthz_status != 200),
            "scrape_errors": None if inside[-1].scrape_errors is None else inside[-1].scrape_errors,
            "load_req_per_s": statistics.fmean(s.arrival_rate_per_s for s in inside),
            "running_mean": statistics.fmean(s.running for s in inside),
            "states": states,
        })
    return rows


def _print_table(rows: Sequence[dict[str, Any]]) -> None:
    header = (
        "tenth  sim min  wall s  RSS MiB (med/max)  fds (med/max)  thr  CPU %  age max s  iter/expected  "
        "healthz ms (med/max)  errors  load req/s  running  state"
    )
    print(header)
    for r in rows:
        print(
            f"{r['tenth']:5d}  {r['sim_min_end']:7.1f}  {r['wall_s_end']:6.1f}  "
            f"{r['rss_mib_median']:8.1f} /{r['rss_mib_max']:6.1f}   {r['fds_median']:6.1f} /{r['fds_max']:4d}  "
            f"{r['threads_max']:3d}  {_fmt(r['cpu_percent'], '5.1f')}  {_fmt(r['scrape_age_max_s'], '9.2f')}  "
            f"{_fmt(r['iterations'], '5.0f')} /{r['iterations_expected']:6.1f}  "
            f"{_fmt(r['healthz_ms_median'], '9.2f')} /{_fmt(r['healthz_ms_max'], '8.2f')}  "
            f"{_fmt(r['scrape_errors'], '6.0f')}  {r['load_req_per_s']:10.0f}  {r['running_mean']:7.0f}  "
            f"{','.join(r['states']) or '-'}"
        )


def _good_scrape_gaps(samples: Sequence[Sample]) -> list[float]:
    """Gaps between successive distinct last-good-scrape timestamps (a lower bound on the worst gap between scrapes:
    a scrape between two samples that was superseded before the next one is not seen)."""
    stamps = sorted({s.last_good_scrape_s for s in samples if s.last_good_scrape_s is not None})
    return [b - a for a, b in itertools.pairwise(stamps)]


def verdicts(run: Run) -> dict[str, Any]:
    """The figures and verdicts the report ends with (also in the JSON)."""
    args, samples = run.args, run.samples
    duration_s, interval_s, time_scale = float(args["duration_s"]), float(args["interval_s"]), float(args["time_scale"])
    half = [s for s in samples if s.sim_s >= duration_s / 2] if samples else []
    xs = [s.sim_s / 3600 for s in half]
    rss = trend(xs, [s.rss_kib / 1024 for s in half], floor=RSS_FLOOR_MIB)
    fds = trend(xs, [float(s.fds) for s in half], floor=FD_FLOOR)
    half_iterations = [s.iterations for s in half if s.iterations is not None]
    half_done = half_iterations[-1] - half_iterations[0] if len(half_iterations) > 1 else 0.0
    ages = [s.scrape_age_s for s in samples if s.scrape_age_s is not None]
    gaps = _good_scrape_gaps(samples)
    iterations = [s.iterations for s in samples if s.iterations is not None]
    healthz = [s.healthz_s for s in samples if s.healthz_s is not None]
    wall_s = samples[-1].wall_s - samples[0].wall_s if len(samples) > 1 else 0.0
    done = iterations[-1] - iterations[0] if len(iterations) > 1 else 0.0
    return {
        "samples": len(samples), "second_half_samples": len(half),
        "wall_s": wall_s, "sim_s": samples[-1].sim_s if samples else 0.0, "time_scale": time_scale,
        "rss_mib_start": samples[0].rss_kib / 1024 if samples else None,
        "rss_mib_end": samples[-1].rss_kib / 1024 if samples else None,
        "second_half_iterations": half_done,
        "rss_trend": None if rss is None else {**asdict(rss), "verdict": rss.verdict},
        "fds_start": samples[0].fds if samples else None, "fds_end": samples[-1].fds if samples else None,
        "fds_trend": None if fds is None else {**asdict(fds), "verdict": fds.verdict},
        "scrape_age_max_s": max(ages) if ages else None,
        "good_scrape_gap_max_s": max(gaps) if gaps else None,
        "scrape_lag_ok": bool(ages) and max(ages) <= 2 * interval_s,
        "iterations": done, "iterations_expected": wall_s / interval_s,
        "healthz_ms_median": 1e3 * statistics.median(healthz) if healthz else None,
        "healthz_ms_p99": 1e3 * (_quantile(healthz, 0.99) or 0.0) if healthz else None,
        "healthz_ms_max": 1e3 * max(healthz) if healthz else None,
        "healthz_not_200": sum(1 for s in samples if s.healthz_status != 200),
        "scrape_errors": samples[-1].scrape_errors if samples else None,
        "sim_requests_completed": run.sim_requests_completed,
        "host_load_1m_max": max((s.host_load_1m for s in samples), default=None),
    }


def _trend_line(name: str, unit: str, t: dict[str, Any] | None, *, start: float, end: float, v: dict[str, Any]) -> str:
    if t is None:
        return f"{name}: too few samples in the second half for a slope"
    iterations = v["second_half_iterations"]
    per_iteration = (
        "" if not iterations else f" = {t['rise'] / iterations * (1024 if unit == 'MiB' else 1):+.2f} "
        f"{'KiB' if unit == 'MiB' else unit} per sidecar iteration over {iterations:.0f}"
    )
    return (
        f"{name}: {t['verdict']}\n    start {start:.2f} {unit}, end {end:.2f} {unit}; second half: least-squares slope "
        f"{t['slope_per_sim_h']:+.3f} {unit}/simulated h (+-{2 * t['slope_stderr']:.3f}, 2 s.e.; "
        f"{t['slope_per_sim_h'] * v['time_scale']:+.2f} {unit}/wall h at this interval), fitted rise across the half "
        f"{t['rise']:+.3f} {unit}{per_iteration}, vs noise {t['noise']:.2f} {unit} (max of 2 x residual sd "
        f"{2 * t['resid_sd']:.3f} and the floor {RSS_FLOOR_MIB if unit == 'MiB' else FD_FLOOR:g}); samples "
        f"{t['low']:.2f}..{t['high']:.2f}, n={t['n']}"
    )


def _print_verdicts(v: dict[str, Any], interval_s: float) -> None:
    print(_trend_line("RSS", "MiB", v["rss_trend"], start=v["rss_mib_start"] or 0.0, end=v["rss_mib_end"] or 0.0,
                      v=v))
    print(_trend_line("fds", "fds", v["fds_trend"], start=float(v["fds_start"] or 0), end=float(v["fds_end"] or 0),
                      v=v))
    lag = "OK" if v["scrape_lag_ok"] else "LAGGING"
    print(
        f"scrape lag: {lag}  max last_good_scrape_age {_fmt(v['scrape_age_max_s'], '.2f')} s, longest gap between "
        f"good scrapes seen {_fmt(v['good_scrape_gap_max_s'], '.2f')} s (interval {interval_s:g} s; OK = age <= "
        f"2 intervals); scrape errors {_fmt(v['scrape_errors'], '.0f')}"
    )
    ratio = v["iterations"] / v["iterations_expected"] if v["iterations_expected"] else float("nan")
    print(
        f"iterations: {v['iterations']:.0f} in {v['wall_s']:.0f} s of wall time = {ratio:.3f} per interval "
        f"(expected {v['iterations_expected']:.1f})"
    )
    print(
        f"healthz: median {_fmt(v['healthz_ms_median'], '.2f')} ms, p99 {_fmt(v['healthz_ms_p99'], '.2f')} ms, max "
        f"{_fmt(v['healthz_ms_max'], '.2f')} ms; not 200: {v['healthz_not_200']}"
    )


# ----------------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------------


def _positive(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=_positive, default=3600.0, help="simulated seconds (default 3600)")
    parser.add_argument("--time-scale", type=_positive, default=20.0,
                        help="simulated seconds per wall second (default 20: the hour takes 3 minutes)")
    parser.add_argument("--interval-s", type=_positive, default=5.0,
                        help="the sidecar's scrape_interval_s, in wall seconds (default 5, its default)")
    parser.add_argument("--sample-s", type=_positive, default=2.0, help="wall seconds between samples (default 2)")
    parser.add_argument("--scenario", type=Path, default=SCENARIO, help=f"default {SCENARIO.name}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the samples, table and verdicts as JSON")
    return parser


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # Once: a second Ctrl-C must not cut the (bounded) stopping of the children short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _run(run: Run, scenario: Scenario, workdir: Path) -> None:
    """Start the simulator and the sidecar, soak, and stop both whatever happens."""
    args = run.args
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ADVISOR_")}  # the config file alone
    wall_budget_s = 1.5 * float(args["duration_s"]) / float(args["time_scale"]) + 60.0
    sim_log, sidecar_log, config = workdir / "simulate.log", workdir / "serve.log", workdir / "config.yaml"
    procs: list[subprocess.Popen[bytes] | None] = [None, None]
    try:
        procs[0] = sim = _spawn([
            *_spec_advisor(), "simulate", "--port", "0", "--scenario", str(args["scenario"]),
            "--time-scale", str(args["time_scale"]), "--seed", str(args["seed"]),
            "--duration-s", str(wall_budget_s + 2 * START_TIMEOUT_S + 60),  # stops by itself if left behind
        ], sim_log, env)
        sim_url = _wait_for_url(sim_log, r"on (http://\S+?)/metrics", sim, "the simulator")
        _sidecar_config(config, sim_url=sim_url, scenario=scenario, interval_s=float(args["interval_s"]))
        procs[1] = sidecar = _spawn([*_spec_advisor(), "serve", "--config", str(config)], sidecar_log, env)
        api_url = _wait_for_url(sidecar_log, r"spec-advisor API on (http://\S+?) ", sidecar, "the sidecar")
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            _wait_ready(client, api_url, sidecar, sidecar_log)
        print(f"simulator {sim_url} (pid {sim.pid}), sidecar {api_url} (pid {sidecar.pid}); soaking", flush=True)
        _soak_loop(run, sim_url=sim_url, api_url=api_url, sidecar=sidecar,
                   procs=(("simulator", sim), ("sidecar", sidecar)))
    finally:
        run.sidecar_exit = _stop(procs[1])
        run.simulator_exit = _stop(procs[0])
        lines = _tail(sidecar_log, 100_000)
        warnings = [line for line in lines if re.match(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) ", line)]
        run.sidecar_log_warnings = len(warnings)
        run.sidecar_log_tail = warnings[-10:]


def _report(run: Run, out: Path | None) -> None:
    args = run.args
    duration_s, interval_s = float(args["duration_s"]), float(args["interval_s"])
    rows = table(run.samples, duration_s=duration_s, interval_s=interval_s)
    v = verdicts(run)
    print()
    _print_table(rows)
    print()
    _print_verdicts(v, interval_s)
    print(
        f"simulator: {run.sim_requests_completed} requests completed in {v['sim_s'] / 60:.1f} simulated min "
        f"({run.sim_requests_completed / max(v['sim_s'], 1e-9):.0f}/s); sidecar exit {run.sidecar_exit}, simulator "
        f"exit {run.simulator_exit}; sidecar log: {run.sidecar_log_warnings} warning/error lines"
    )
    load = v["host_load_1m_max"]
    busy = " (above the CPU count: other work competed with the soak)" if load is not None and load > run.cpus else ""
    print(
        f"host: {run.cpus} CPUs, 1-min load average up to {_fmt(load, '.1f')}{busy}; simulator requests of this "
        f"script that failed: {run.simulator_misses}"
    )
    for line in run.sidecar_log_tail:
        print(f"    {line}")
    if out is not None:
        payload = {**asdict(run), "table": rows, "verdicts": v}
        out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    scenario = load_scenario(args.scenario)  # fails here, with the field named, before anything starts
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    run = Run(args=settings, scenario=str(args.scenario))
    print(
        f"soak: {args.duration_s:g} simulated s of {args.scenario.name} at x{args.time_scale:g} "
        f"(~{args.duration_s / args.time_scale:.0f} s of wall time), sidecar interval {args.interval_s:g} s, "
        f"a sample every {args.sample_s:g} s",
        flush=True,
    )
    # Both, explicitly: a shell starts a background job with SIGINT ignored, which Python would keep.
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    status = 0
    with tempfile.TemporaryDirectory(prefix="spec-advisor-soak-") as workdir:
        try:
            _run(run, scenario, Path(workdir))
        except KeyboardInterrupt:
            run.interrupted, status = True, 130
            print("interrupted: both processes stopped; the figures so far follow", flush=True)
        except (SoakError, httpx.HTTPError, OSError, ValueError) as exc:
            run.error, status = str(exc), 1
            print(f"soak failed: {exc}", file=sys.stderr, flush=True)
    if run.samples:
        _report(run, args.out)
    return status


if __name__ == "__main__":
    sys.exit(main())
