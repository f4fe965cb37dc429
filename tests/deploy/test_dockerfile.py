"""The container image: the Dockerfile is hadolint-clean, and what its build stage installs really runs.

There is no Docker engine on the developers' machines or in CI, so the build stage is replayed here: its ENV, WORKDIR,
COPY and RUN lines, in order, with every absolute path moved under a temp dir, into a fresh venv (same lock file,
same commands). The installed entry point then answers `--version` and serves /healthz and /readyz against a real
vLLM /metrics capture, without writing into the installed tree (the image runs on a read-only root filesystem).

hadolint comes from scripts/setup-deploy-tools.sh. Missing, the lint test skips; with SPEC_ADVISOR_DEPLOY_TOOLS=1
(CI) it fails instead.
"""

from __future__ import annotations

import http.server
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest
from deploy_tools import require_tool

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
CAPTURE = ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32.0-cpu-ngram-k3-idle.txt"

# Generous bounds for a 2-core machine that other jobs share; they stop a hung step, nothing asserts on them.
INSTALL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


# ----------------------------------------------------------------------------------------------------------------
# Reading the Dockerfile
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)


def read_instructions(text: str) -> list[Instruction]:
    """Logical instructions: comments dropped, backslash continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    return instructions


def read_stages(text: str) -> list[Stage]:
    stages: list[Stage] = []
    for instruction in read_instructions(text):
        if instruction.keyword == "FROM":
            words = instruction.arguments.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(instruction)
    return stages


def global_args(text: str) -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults."""
    values: dict[str, str] = {}
    for instruction in read_instructions(text):
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            key, _, value = instruction.arguments.partition("=")
            values[key] = value
    return values


def key_values(arguments: str) -> dict[str, str]:
    """`ENV A=1 B="x y"` -> {"A": "1", "B": "x y"} (the KEY=VALUE form, the only one this Dockerfile uses)."""
    pairs = {}
    for word in shlex.split(arguments):
        key, sep, value = word.partition("=")
        assert sep, f"ENV/ARG in KEY=VALUE form only, got {word!r}"
        pairs[key] = value
    return pairs


def dockerfile_text() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


def build_stage() -> Stage:
    (stage,) = [s for s in read_stages(dockerfile_text()) if s.name == "build"]
    return stage


def final_stage() -> Stage:
    return read_stages(dockerfile_text())[-1]


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        version = tomllib.load(handle)["project"]["version"]
    assert isinstance(version, str)
    return version


# ----------------------------------------------------------------------------------------------------------------
# Static checks
# ----------------------------------------------------------------------------------------------------------------


def test_hadolint_finds_nothing() -> None:
    hadolint = require_tool("hadolint")
    # .hadolint.yaml fails on every finding down to "info" and requires the image's OCI labels.
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(HADOLINT_CONFIG), str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_config_catches_a_misspelt_label(tmp_path: Path) -> None:
    # Proves the lint above is not vacuous: strict-labels rejects a label outside the schema.
    hadolint = require_tool("hadolint")
    broken = tmp_path / "Dockerfile"
    broken.write_text(dockerfile_text().replace("org.opencontainers.image.title=", "org.opencontainers.image.titel="))
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(HADOLINT_CONFIG), str(broken)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DL3049" in result.stdout  # "Label `org.opencontainers.image.title` is missing"


def test_final_stage_runs_as_a_non_root_user_with_a_healthcheck_on_healthz() -> None:
    stage = final_stage()
    keywords = [i.keyword for i in stage.instructions]
    (user,) = [i.arguments for i in stage.instructions if i.keyword == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it without /etc/passwd
    (healthcheck,) = [i.arguments for i in stage.instructions if i.keyword == "HEALTHCHECK"]
    assert "/healthz" in healthcheck
    (expose,) = [i.arguments for i in stage.instructions if i.keyword == "EXPOSE"]
    # The image listens where the settings' default port is, and the health check asks that port.
    default_port = Settings.model_fields["port"].default
    assert expose == str(default_port)
    assert f"127.0.0.1:{default_port}/healthz" in healthcheck
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")


def test_final_stage_only_copies_the_built_venv_and_sets_what_python_needs_on_a_read_only_root() -> None:
    stage = final_stage()
    copies = [i.arguments for i in stage.instructions if i.keyword == "COPY"]
    # Nothing from the build context: no sources, compilers or pip caches reach the runtime image.
    assert copies == ["--from=build /opt/venv /opt/venv"]
    env: dict[str, str] = {}
    for instruction in stage.instructions:
        if instruction.keyword == "ENV":
            env |= key_values(instruction.arguments)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == "/tmp"
    assert env["TMPDIR"] == "/tmp"
    assert env["SPEC_ADVISOR_HOST"] == "0.0.0.0"  # a pod's probes and Prometheus come from outside loopback


def test_the_base_image_is_pinned_by_tag_and_digest() -> None:
    # Tag and digest: the tag says which Python and Debian, the digest fixes the exact image pulled, so a rebuild
    # cannot silently pick up a different base. Both stages build from it.
    base = global_args(dockerfile_text())["PYTHON_IMAGE"]
    match = re.fullmatch(r"python:(\d+)\.(\d+)-slim-trixie@sha256:[0-9a-f]{64}", base)
    assert match, base
    assert [s.base for s in read_stages(dockerfile_text())] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    # The replay below runs this interpreter in place of the image's: it stands for the image only at the same
    # minor version (and requirements.lock is for that one too).
    assert (int(match[1]), int(match[2])) == sys.version_info[:2]


def test_image_version_label_matches_the_package_version() -> None:
    declared = [i.arguments for i in final_stage().instructions if i.keyword == "ARG"]
    defaults = dict(arg.split("=", 1) for arg in declared if "=" in arg)
    assert defaults["VERSION"] == project_version()


def test_lock_pins_every_requirement_with_hashes() -> None:
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    requirements = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert requirements
    for requirement in requirements:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+ \\", requirement), requirement
    assert text.count("--hash=sha256:") >= len(requirements)


# ----------------------------------------------------------------------------------------------------------------
# Replaying the build stage
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    venv: Path
    root: Path


def _moved(path: str, root: Path) -> Path:
    assert path.startswith("/"), path
    return root / path.lstrip("/")


def _copy_into(sources: list[str], destination: str, *, workdir: Path, root: Path) -> None:
    """Docker's COPY: a directory source copies its contents; a destination ending in '/' (or several sources)
    is a directory."""
    target = _moved(destination, root) if destination.startswith("/") else workdir / destination
    into_directory = destination.endswith("/") or len(sources) > 1
    for source in sources:
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
        else:
            file_target = target / origin.name if into_directory else target
            file_target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, file_target)


def replay_build_stage(root: Path) -> Replay:
    """Run the build stage's ENV/WORKDIR/COPY/RUN lines in order, absolute paths moved under `root`."""
    stage = build_stage()
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    # `python` in the RUN lines is the image's interpreter; here, the base interpreter of this Python.
    base_python = Path(getattr(sys, "_base_executable", sys.executable))
    (bin_dir / "python").symlink_to(base_python.resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env = {k: v for k, v in env.items() if not k.startswith("SPEC_ADVISOR_")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    env["HOME"] = str(root / "home")
    workdir = root
    for instruction in stage.instructions:
        if instruction.keyword == "ENV":
            for key, value in key_values(instruction.arguments).items():
                env[key] = str(_moved(value, root)) if value.startswith("/") else value
        elif instruction.keyword == "WORKDIR":
            workdir = _moved(instruction.arguments, root)
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            *sources, destination = instruction.arguments.split()
            assert not any(s.startswith("--") for s in sources), "the build stage copies from the context only"
            _copy_into(sources, destination, workdir=workdir, root=root)
        elif instruction.keyword == "RUN":
            # Every path must come from an ENV variable, or the replay would write outside the temp dir.
            assert not re.search(r"(?:^|[\s=])[\"']?/\w", instruction.arguments), instruction.arguments
            result = subprocess.run(
                ["/bin/sh", "-c", instruction.arguments],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=INSTALL_TIMEOUT_S,
            )
            output = result.stdout[-4000:] + result.stderr[-4000:]
            assert result.returncode == 0, f"RUN {instruction.arguments}\n{output}"
        else:
            assert instruction.keyword in ("ARG", "LABEL"), f"replay does not know {instruction.keyword}"
    return Replay(venv=Path(env["VENV"]), root=root)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Replay:
    return replay_build_stage(tmp_path_factory.mktemp("image"))


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.fixture
def capture_server() -> Iterator[str]:
    """A real vLLM 0.32 /metrics capture served on 127.0.0.1 (an ephemeral port)."""
    body = CAPTURE.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_installed_entry_point_reports_the_package_version(replayed: Replay) -> None:
    result = subprocess.run(
        [str(replayed.venv / "bin" / "spec-advisor"), "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"spec-advisor {project_version()}"


def test_the_installed_venv_has_no_pip_or_build_tools(replayed: Replay) -> None:
    site = next((replayed.venv / "lib").glob("python3.*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert "spec_advisor" in installed
    assert not installed & {"pip", "setuptools", "wheel"}


def _wait_for_url(lines: queue.Queue[str], process: subprocess.Popen[str], deadline: float) -> str:
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            assert process.poll() is None, f"serve exited with {process.returncode}"
            continue
        match = re.search(r"API on (http://\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("serve did not print its URL in time")


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def _wait_for_status(client: httpx.Client, url: str, deadline: float) -> httpx.Response:
    response = client.get(url)
    while response.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        response = client.get(url)
    return response


def test_the_installed_sidecar_serves_health_and_readiness_without_writing_to_its_install(
    replayed: Replay, capture_server: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    # Fast ticks so readiness (first good scrape) comes within a second; window >= 2 x interval and
    # stale_after > interval as the settings require.
    config.write_text(
        f"targets:\n  - name: vllm\n    url: {capture_server}\n"
        "scrape_interval_s: 1\nscrape_timeout_s: 1\nport: 0\ngpu: {telemetry: none}\n"
        "estimator: {window_s: 2, stale_after_s: 5}\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    before = _tree(replayed.venv)
    # The image's runtime ENV, except the listen address: tests listen on loopback only.
    env = {
        "PATH": f"{replayed.venv / 'bin'}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "HOME": str(home),
        "TMPDIR": str(home),
        "SPEC_ADVISOR_HOST": "127.0.0.1",
    }
    stderr_log = tmp_path / "serve.stderr"
    with stderr_log.open("w") as stderr:
        process = subprocess.Popen(
            ["spec-advisor", "serve", "--config", str(config)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert process.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True)
        reader.start()
        try:
            url = _wait_for_url(lines, process, time.monotonic() + START_TIMEOUT_S)
            with httpx.Client(timeout=5.0) as client:
                healthz = client.get(f"{url}/healthz")
                readyz = _wait_for_status(client, f"{url}/readyz", time.monotonic() + READY_TIMEOUT_S)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                reader.join(timeout=STOP_TIMEOUT_S)
                process.stdout.close()
    log = stderr_log.read_text()
    assert healthz.status_code == 200, log
    assert healthz.json()["status"] == "ok"
    assert readyz.status_code == 200, log  # it scraped the capture: httpx and the parser work as installed
    # SIGTERM (what the kubelet and `docker stop` send) runs the graceful shutdown; uvicorn then re-raises the
    # signal, so the status is "killed by SIGTERM" (143 in a shell) rather than 0.
    assert process.returncode in (0, -signal.SIGTERM), log
    assert "advisor stopped" in log
    assert _tree(replayed.venv) == before  # nothing written next to the code: fine on a read-only root
