"""Session fixtures for the e2e tests: a tiny local model and a real vLLM (CPU) OpenAI server serving it with n-gram
speculation (k=3). See e2e_vllm.py for when they run and where things live.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import e2e_llamacpp
import pytest
from e2e_processes import free_port, start_process, stop_process, wait_ready
from e2e_vllm import (
    BUILD_SCRIPT,
    BUILD_TIMEOUT_S,
    DEPLOYED_K,
    HEALTH_TIMEOUT_S,
    LOG_STATS_INTERVAL_S,
    SERVED_MODEL,
    VllmServer,
    child_env,
    e2e_cache,
    record_timing,
    require_enabled,
    timings,
    vllm_python,
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    measured = timings(config)
    if measured:
        terminalreporter.write_line(
            "e2e timings: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in measured.items())
        )


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest) -> Path:
    """The tiny model directory, built once per version of build_tiny_model.py (cached by its hash)."""
    require_enabled()
    python = vllm_python()
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:16]
    model_dir = e2e_cache() / f"tiny-model-{digest}"
    if (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file():
        return model_dir
    t0 = time.monotonic()
    try:
        result = subprocess.run(
            [str(python), str(BUILD_SCRIPT), str(model_dir)],
            env=child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(e2e_cache() / "hf")}),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building the tiny model took over {BUILD_TIMEOUT_S:.0f} s", pytrace=False)
    if result.returncode != 0:
        pytest.fail(
            f"building the tiny model failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-6000:]}",
            pytrace=False,
        )
    record_timing(request.config, "model build", time.monotonic() - t0)
    return model_dir


@pytest.fixture(scope="session")
def vllm_server(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """vLLM's OpenAI server on 127.0.0.1 (free port) with n-gram speculation k=3; SIGTERM at teardown."""
    require_enabled()
    python = vllm_python()
    cache = e2e_cache()
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm-server.log"
    speculative = (
        f'{{"method":"ngram","num_speculative_tokens":{DEPLOYED_K},"prompt_lookup_max":3,"prompt_lookup_min":1}}'
    )
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model),
        "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "512",
        "--dtype", "bfloat16",
        "--speculative-config", speculative,
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    env = child_env(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOG_STATS_INTERVAL": str(LOG_STATS_INTERVAL_S),
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "HF_HOME": str(cache / "hf"),
            # Log lines must reach the file as they are written: the test reads them between two instants.
            "PYTHONUNBUFFERED": "1",
        }
    )
    started = start_process("vLLM", argv, env=env, log_path=log_path)
    base_url = f"http://127.0.0.1:{port}"
    try:
        ready_s = wait_ready(started, f"{base_url}/health", timeout_s=HEALTH_TIMEOUT_S)
        record_timing(request.config, "vLLM ready", ready_s)
        yield VllmServer(
            base_url=base_url,
            model=SERVED_MODEL,
            deployed_k=DEPLOYED_K,
            log_path=log_path,
            log_interval_s=LOG_STATS_INTERVAL_S,
            started=started,
        )
    finally:
        stop_process(started)
        print(f"vLLM log: {log_path}", file=sys.stderr)


@pytest.fixture(scope="session")
def tiny_gguf(request: pytest.FixtureRequest) -> Path:
    """The tiny random llama GGUF for llama.cpp, built once per version of build_tiny_gguf.py (cached by its hash)."""
    venv = e2e_llamacpp.require_installed()
    digest = hashlib.sha256(e2e_llamacpp.BUILD_SCRIPT.read_bytes()).hexdigest()[:16]
    model = e2e_cache() / f"tiny-{digest}.gguf"
    if not model.is_file():
        t0 = time.monotonic()
        e2e_llamacpp.build_gguf(venv, model)
        record_timing(request.config, "GGUF build", time.monotonic() - t0)
    return model


@pytest.fixture(scope="session")
def llamacpp_server(
    request: pytest.FixtureRequest, tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[e2e_llamacpp.LlamaCppServer]:
    """llama.cpp's llama-server on 127.0.0.1 (free port) serving the tiny GGUF on CPU with ngram-simple speculation
    (drafts of up to 4 tokens) and /metrics on; stopped at teardown. Skipped when scripts/setup-llamacpp.sh has not
    installed it, except under SPEC_ADVISOR_E2E=1, where that fails (e2e_llamacpp.require_installed).
    """
    venv = e2e_llamacpp.require_installed()
    log_path = tmp_path_factory.mktemp("llamacpp") / "llama-server.log"
    t0 = time.monotonic()
    try:
        with e2e_llamacpp.running_server(venv, tiny_gguf, log_path) as server:
            record_timing(request.config, "llama-server ready", time.monotonic() - t0)
            yield server
    finally:
        print(f"llama-server log: {log_path}", file=sys.stderr)
