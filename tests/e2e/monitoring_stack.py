"""A real monitoring stack for the e2e tests: Debian's Prometheus and Alertmanager as subprocesses on 127.0.0.1, a
webhook receiver that records what Alertmanager delivers, the simulated vLLM server in a background thread, and
the config files that wire them together (all under a test's temp dir, on ephemeral ports).

The shipped rule file is loaded as it is, except for two kinds of values that `render_rules` shortens so that a
test runs in seconds: each group's `interval` and each alert's `for` (expressions, labels and annotations are
copied untouched).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from e2e_processes import Started, log_tail, start_process, wait_ready

from service.sim.server import SimServer
from service.sim.world import World

T = TypeVar("T")

# Debian names the Alertmanager binary prometheus-alertmanager; upstream tarballs call it alertmanager.
PROMETHEUS_NAMES = ("prometheus",)
ALERTMANAGER_NAMES = ("prometheus-alertmanager", "alertmanager")
INSTALL_HINT = "run scripts/setup-observability-tools.sh (Debian packages prometheus, prometheus-alertmanager)"
READY_TIMEOUT_S = 60.0

# ----------------------------------------------------------------------------------------------------------------
# Binaries and config files
# ----------------------------------------------------------------------------------------------------------------


def find_binary(names: Sequence[str], *, env_var: str) -> Path | None:
    """The first of `names` on PATH, or the path in `env_var` when that is set (CI may pin a build)."""
    pinned = os.environ.get(env_var)
    if pinned:
        return Path(pinned)
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def require_binary(what: str, names: Sequence[str], *, env_var: str) -> Path:
    """`find_binary`, failing the test (never skipping it) when the tool is missing: the e2e switch is on."""
    binary = find_binary(names, env_var=env_var)
    if binary is not None and not binary.is_file():
        pytest.fail(f"SPEC_ADVISOR_E2E=1 but ${env_var}={binary} is not a file", pytrace=False)
    if binary is None:
        pytest.fail(
            f"SPEC_ADVISOR_E2E=1 but {what} is not installed (looked for {', '.join(names)} on PATH and ${env_var}): "
            f"{INSTALL_HINT}",
            pytrace=False,
        )
    return binary


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")


def duration_s(text: str) -> float:
    """A Prometheus duration as used in rule files ("15m", "1h30m", "90s", "500ms") in seconds."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"not a Prometheus duration this helper understands: {text!r}")
    hours, minutes, seconds, millis = (int(part) if part else 0 for part in match.groups())
    return hours * 3600.0 + minutes * 60.0 + seconds + millis / 1000.0


@dataclass(frozen=True, slots=True)
class RenderedRules:
    """A test copy of a rule file: where it is, each alert's shipped and test `for:`, the test group interval."""

    path: Path
    shipped_for: Mapping[str, str]
    test_for: Mapping[str, str]
    group_interval: str


def render_rules(source: Path, dest: Path, *, group_interval: str, for_divisor: int) -> RenderedRules:
    """Copy the rule file `source` to `dest`, changing only each group's `interval` (to `group_interval`) and each
    alert's `for:` (divided by `for_divisor`, whole seconds, at least 1 s), so the alerts keep their relative order.

    Example: for_divisor=300 turns `for: 15m` into `for: 3s` and `for: 5m` into `for: 1s`.
    """
    document = yaml.safe_load(source.read_text(encoding="utf-8"))
    shipped: dict[str, str] = {}
    shortened: dict[str, str] = {}
    for group in document["groups"]:
        group["interval"] = group_interval
        for rule in group["rules"]:
            if "alert" in rule and "for" in rule:
                shipped[rule["alert"]] = rule["for"]
                rule["for"] = f"{max(1, round(duration_s(rule['for']) / for_divisor))}s"
                shortened[rule["alert"]] = rule["for"]
    dest.write_text(yaml.safe_dump(document, sort_keys=False, width=200), encoding="utf-8")
    return RenderedRules(path=dest, shipped_for=shipped, test_for=shortened, group_interval=group_interval)


def write_prometheus_config(
    path: Path,
    *,
    scrape_targets: Mapping[str, str],
    rule_file: Path,
    alertmanager: str,
    interval: str,
) -> None:
    """prometheus.yml: one job per `scrape_targets` entry (job name -> host:port), the rule file, one Alertmanager."""
    document: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(rule_file)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [address]}]} for job, address in scrape_targets.items()
        ],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def write_alertmanager_config(path: Path, *, webhook_url: str, group_wait: str, group_interval: str) -> None:
    """alertmanager.yml: every alert to one webhook, grouped per alert and target, short waits."""
    document: dict[str, Any] = {
        "route": {
            "receiver": "test-webhook",
            "group_by": ["alertname", "target"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "test-webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


# ----------------------------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------------------------


def start_prometheus(binary: Path, *, config: Path, storage: Path, port: int, log_path: Path) -> Started:
    argv = [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={storage}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    return start_process("Prometheus", argv, env=dict(os.environ), log_path=log_path)


def start_alertmanager(binary: Path, *, config: Path, storage: Path, port: int, log_path: Path) -> Started:
    argv = [
        str(binary),
        f"--config.file={config}",
        f"--storage.path={storage}",
        f"--web.listen-address=127.0.0.1:{port}",
        # Empty = no HA gossip: otherwise it binds 0.0.0.0:9094, which parallel runs would fight over.
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    return start_process("Alertmanager", argv, env=dict(os.environ), log_path=log_path)


def wait_process_ready(started: Started, base_url: str) -> float:
    """Both Prometheus and Alertmanager answer 200 on /-/ready once their config is loaded."""
    return wait_ready(started, f"{base_url}/-/ready", timeout_s=READY_TIMEOUT_S, poll_s=0.2)


# ----------------------------------------------------------------------------------------------------------------
# Reading Prometheus
# ----------------------------------------------------------------------------------------------------------------


class PrometheusApi:
    """The few Prometheus HTTP API calls the tests make; each returns the `data` member of a success answer."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, timeout=5.0)

    def close(self) -> None:
        self._client.close()

    def _data(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        body = self._client.get(path, params=params).raise_for_status().json()
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} answered {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector samples of `expr` now: [{"metric": {...}, "value": [ts, "1.5"]}, ...]."""
        data = self._data("/api/v1/query", {"query": expr})
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr!r} is a {data['resultType']}, not an instant vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Every pending or firing alert."""
        result: list[dict[str, Any]] = self._data("/api/v1/alerts")["alerts"]
        return result

    def rule_groups(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._data("/api/v1/rules")["groups"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._data("/api/v1/targets")["activeTargets"]
        return result


def sample_value(sample: Mapping[str, Any]) -> float:
    return float(sample["value"][1])


# ----------------------------------------------------------------------------------------------------------------
# Webhook receiver
# ----------------------------------------------------------------------------------------------------------------


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 (ephemeral port) that keeps every JSON body POSTed to it, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._payloads: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"unparsable_body": body.decode("utf-8", errors="replace")}
                with receiver._lock:
                    receiver._payloads.append(payload)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest's output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/alerts"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10.0)

    def payloads(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._payloads)

    def delivered(self, alertname: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(payload, alert) for every alert called `alertname` in every payload so far."""
        return [
            (payload, alert)
            for payload in self.payloads()
            for alert in payload.get("alerts", [])
            if alert.get("labels", {}).get("alertname") == alertname
        ]


# ----------------------------------------------------------------------------------------------------------------
# The simulated vLLM server in a background thread
# ----------------------------------------------------------------------------------------------------------------


class SkippableClock:
    """Wall time plus an offset the test can push forward: lets a test end a scenario phase early."""

    def __init__(self) -> None:
        self._offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self._offset_s

    def skip(self, seconds: float) -> None:
        if seconds > 0:
            self._offset_s += seconds


class SimThread:
    """`SimServer` serving `world` on 127.0.0.1 from its own event loop in a daemon thread, so that a synchronous
    test can drive subprocesses while the simulator answers. Simulated time runs `time_scale` x the clock.
    """

    def __init__(self, world: World, *, time_scale: float) -> None:
        self.world = world
        self.time_scale = time_scale
        self._clock = SkippableClock()
        self.server = SimServer(world, time_scale=time_scale, clock=self._clock)
        self._started = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sim-server", daemon=True)
        self._start_sim_s = world.now_s

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to the test thread by start()/stop(), never lost
            self._error = exc
            self._started.set()

    async def _serve(self) -> None:
        await self.server.start()
        self._started.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await self.server.stop()

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the simulated server did not start: {self._error!r}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
        if self._error is not None:
            raise RuntimeError("the simulated server failed") from self._error

    @property
    def url(self) -> str:
        return self.server.url

    def elapsed_sim_s(self) -> float:
        """Simulated seconds since the world's start (the scenario's `t_s` axis)."""
        return self.server.sim_now_s() - self._start_sim_s

    def skip_to(self, elapsed_sim_s: float) -> None:
        """Jump simulated time forward to `elapsed_sim_s` (no-op when already past it); the world simulates the
        skipped span on its next request, so the caller should make one (GET /sim/state) before relying on it.
        """
        self._clock.skip((elapsed_sim_s - self.elapsed_sim_s()) / self.time_scale)


# ----------------------------------------------------------------------------------------------------------------
# Bounded waits
# ----------------------------------------------------------------------------------------------------------------


def poll(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.5,
    diagnostics: Callable[[], str] = lambda: "",
) -> T:
    """Call `probe` until it returns something other than None and return that; fail the test after `timeout_s`
    with `what`, the last exception `probe` raised (if any) and `diagnostics()`.
    """
    deadline = time.monotonic() + timeout_s
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (httpx.HTTPError, AssertionError, KeyError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if value is not None:
                return value
            last = "not yet"
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last})\n{diagnostics()}", pytrace=False)


def log_tails(processes: Iterator[Started] | Sequence[Started], chars: int = 3000) -> str:
    return "\n".join(f"--- {p.name} log {p.log_path}:\n{log_tail(p.log_path, chars)}" for p in processes)
