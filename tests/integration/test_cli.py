"""`spec-advisor` as a subprocess: exit codes, error messages, a short demo, serve + SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from service.app import package_version

SCRIPT = Path(sys.executable).parent / "spec-advisor"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "service.cli.command"]
DEADLINE_S = 60.0


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ADVISOR_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, timeout=DEADLINE_S, env=clean_env(), check=False
    )


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"spec-advisor {package_version()}"


def test_invalid_config_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "advisor.yaml"
    config.write_text(
        "targets:\n  - {name: a, url: 'http://127.0.0.1:9'}\nscrape_interval_s: 10\nestimator: {window_s: 15}\n",
        encoding="utf-8",
    )
    result = cli("serve", "--config", str(config))
    assert result.returncode == 2
    # 15 s window < 2 x 10 s interval.
    assert "estimator.window_s (15) must be at least 2 x scrape_interval_s (10)" in result.stderr
    assert "Traceback" not in result.stderr


def test_other_startup_errors_exit_2(tmp_path: Path) -> None:
    missing = cli("serve", "--config", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr

    no_target = cli("serve")
    assert no_target.returncode == 2 and "targets: Field required" in no_target.stderr

    bad_url = cli("serve", "--target", "not a url")
    assert bad_url.returncode == 2 and "targets.0.url" in bad_url.stderr

    config = tmp_path / "hw.yaml"
    config.write_text("targets:\n  - {name: a, url: 'http://127.0.0.1:9', hardware: tpu-v9}\n", encoding="utf-8")
    unknown_hw = cli("serve", "--config", str(config))
    assert unknown_hw.returncode == 2 and "unknown hardware 'tpu-v9'" in unknown_hw.stderr
    for result in (missing, no_target, bad_url, unknown_hw):
        assert "Traceback" not in result.stderr

    usage = cli("serve", "--port", "eighty")
    assert usage.returncode == 2  # argparse's own usage error


async def _read_api_url(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    while True:
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=DEADLINE_S)).decode()
        if not line:
            raise AssertionError("the CLI exited before announcing its API")
        if line.startswith("spec-advisor API on "):
            return line.split()[3]


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *COMMAND, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env()
    )


def test_short_demo_serves_the_api_and_exits_by_itself() -> None:
    async def scenario() -> None:
        process = await _spawn("demo", "--no-view", "--port", "0", "--duration-s", "6")
        url = await _read_api_url(process)
        async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            response = await wait_for(
                client, "/v1/recommendation", lambda r: r.json()["targets"][0]["evaluated_at"] is not None
            )
            [rec] = response.json()["targets"]
            assert rec["target"] == "sim"
            assert rec["model"] == "demo-llama-8b"
            assert isinstance(rec["enabled"], bool)
        _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=DEADLINE_S)
        assert process.returncode == 0, stderr.decode()
        assert "Traceback" not in stderr.decode()

    asyncio.run(scenario())


def test_demo_view_draws_the_recommendation() -> None:
    result = cli("demo", "--port", "0", "--duration-s", "4")
    assert result.returncode == 0, result.stderr
    assert "spec-advisor demo" in result.stdout
    assert "dwell 10 s (production default 120 s)" in result.stdout
    assert "target sim" in result.stdout
    assert "RECOMMEND: speculation" in result.stdout


def test_serve_targets_from_flags_and_stops_on_sigterm() -> None:
    async def scenario() -> None:
        async with serving(CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")) as capture_url:
            process = await _spawn(
                "serve", "--target", capture_url, "--port", "0", "--log-format", "json", "--log-level", "info"
            )
            url = await _read_api_url(process)
            async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                await wait_for(client, "/readyz", lambda r: r.status_code == 200)
                [ev] = (await client.get("/v1/evidence")).json()["targets"]
                assert ev["target"] == capture_url.removeprefix("http://")  # host:port names a bare --target
                assert ev["model"] == "meta-llama/Llama-3.1-8B-Instruct"
            process.send_signal(signal.SIGTERM)
            _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=DEADLINE_S)
            # uvicorn shuts down gracefully, then re-raises the signal it caught: the exit says "terminated by
            # SIGTERM", as a supervisor expects.
            assert process.returncode == -signal.SIGTERM, stderr.decode()
            log = stderr.decode()
            assert '"msg":"advisor stopped"' in log  # the lifespan's exit ran: graceful shutdown
            assert "Traceback" not in log

    asyncio.run(scenario())
