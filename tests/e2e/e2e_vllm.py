"""The real vLLM (CPU) server of the e2e tests: where it comes from, how it is configured, what a test sees of it.

The tests run only when SPEC_ADVISOR_E2E=1 (CI sets it); otherwise they are skipped with that reason. Once enabled,
anything that keeps vLLM from starting (no venv, a build error, a crash, no /health within the deadline) FAILS the
test with the server's log tail: a broken e2e environment must never look like a pass.

Paths (all overridable for CI and developers):
- SPEC_ADVISOR_VLLM_VENV: the vLLM venv built by scripts/setup-vllm-cpu.sh (default ~/.cache/spec-advisor/vllm-venv).
- SPEC_ADVISOR_E2E_CACHE: the test-owned cache (default ~/.cache/spec-advisor/e2e) holding the tiny model, keyed by
  the hash of build_tiny_model.py, and vLLM/torch compile caches (a warm cache halves vLLM's start-up).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_processes import Started, log_tail

E2E_ENV_VAR = "SPEC_ADVISOR_E2E"
SKIP_REASON = f"e2e tests need a real vLLM on this CPU: set {E2E_ENV_VAR}=1 (and run scripts/setup-vllm-cpu.sh)"

SERVED_MODEL = "tiny"
DEPLOYED_K = 3
# vLLM logs its SpecDecoding line once per interval (default 10 s); 1 s keeps the test's settle waits short.
LOG_STATS_INTERVAL_S = 1.0
HEALTH_TIMEOUT_S = 240.0
BUILD_TIMEOUT_S = 300.0

BUILD_SCRIPT = Path(__file__).with_name("build_tiny_model.py")
_TIMINGS = pytest.StashKey[dict[str, float]]()


def e2e_enabled() -> bool:
    return os.environ.get(E2E_ENV_VAR) == "1"


def _default_cache() -> Path:
    return Path.home() / ".cache" / "spec-advisor"


def vllm_venv() -> Path:
    return Path(os.environ.get("SPEC_ADVISOR_VLLM_VENV") or _default_cache() / "vllm-venv")


def e2e_cache() -> Path:
    return Path(os.environ.get("SPEC_ADVISOR_E2E_CACHE") or _default_cache() / "e2e")


@dataclass(frozen=True, slots=True)
class VllmServer:
    """A running vLLM OpenAI server: where it listens, what it serves, where its output goes."""

    base_url: str
    model: str
    deployed_k: int
    log_path: Path
    log_interval_s: float
    started: Started

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_between(self, start: int, end: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(start)
            return log.read(end - start).decode("utf-8", errors="replace")

    def wait_stats_flushed(self, since_offset: int) -> None:
        """Block until vLLM has logged every spec-decode stat recorded before `since_offset` was read.

        vLLM's periodic log call (every `log_interval_s`) writes an `Engine 000: ...` line and then the SpecDecoding
        line for everything since its previous call. After activity, the next call is at INFO, so its Engine line
        shows up; when the server was already idle for two intervals the line is DEBUG (not printed) and nothing is
        pending, so waiting three intervals is enough. The short sleep lets the SpecDecoding line follow its
        Engine line.
        """
        deadline = time.monotonic() + 3 * self.log_interval_s
        while time.monotonic() < deadline:
            if "Engine 000:" in self.log_between(since_offset, self.log_size()):
                break
            time.sleep(0.05)
        time.sleep(0.25)

    def assert_alive(self) -> None:
        code = self.started.process.poll()
        if code is not None:
            pytest.fail(f"vLLM exited with code {code}; log {self.log_path}:\n{log_tail(self.log_path)}", pytrace=False)


def record_timing(config: pytest.Config, name: str, seconds: float) -> None:
    config.stash.setdefault(_TIMINGS, {})[name] = seconds


def timings(config: pytest.Config) -> dict[str, float]:
    return config.stash.get(_TIMINGS, {})


def require_enabled() -> None:
    if not e2e_enabled():
        pytest.skip(SKIP_REASON)


def vllm_python() -> Path:
    python = vllm_venv() / "bin" / "python"
    if not python.is_file():
        pytest.fail(
            f"{E2E_ENV_VAR}=1 but there is no vLLM venv at {vllm_venv()} (no bin/python): "
            "run scripts/setup-vllm-cpu.sh first",
            pytrace=False,
        )
    return python


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env
