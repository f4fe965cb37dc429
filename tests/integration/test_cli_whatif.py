"""`spec-advisor whatif` and `spec-advisor schedule` as subprocesses: JSON in/out, errors, the plot, a live sidecar."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sidecar_http import serving

from policies.types import AcceptanceEvidence, DataState, Decision, Evidence
from service.board import Board, Pricing
from service.cli.plot import plot_whatif
from service.exporter import MetricsPage
from service.http.api import ApiExtensions, create_api
from service.http.whatif import WhatIfRequest, create_whatif_router, live_targets_from_board, run_whatif

SCRIPT = Path(sys.executable).parent / "spec-advisor"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "service.cli.command"]
DEADLINE_S = 60.0
REQUEST: dict[str, Any] = {
    "hardware": "h100-sxm",
    "target_model": "meta-llama/Llama-3.1-8B-Instruct",
    "drafter": {"method": "eagle3"},
    "acceptance": {"mean_acceptance_length": 2.79, "measured_at_k": 3},
    "batch_sizes": [1, 4, 16, 64, 256, 1024],
    "context_lengths": [512, 4096],
    "gammas": [0, 1, 2, 3, 5],
}


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ADVISOR_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cli(*args: str, stdin: str | None = None, command: list[str] = COMMAND) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=DEADLINE_S, env=clean_env(), check=False,
        input=stdin,
    )


def write(tmp_path: Path, body: Any, name: str = "whatif.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def test_whatif_reads_a_file_or_stdin_and_prints_json(tmp_path: Path) -> None:
    from_file = cli("whatif", str(write(tmp_path, REQUEST)))
    assert from_file.returncode == 0, from_file.stderr
    answer = json.loads(from_file.stdout)
    assert len(answer["points"]) == 6 * 2 * 5  # batches x contexts x gammas
    assert answer["acceptance"]["measured_positions"] == 3
    from_stdin = cli("whatif", "-", "--compact", stdin=json.dumps(REQUEST))
    assert from_stdin.returncode == 0 and len(from_stdin.stdout.strip().splitlines()) == 1
    assert json.loads(from_stdin.stdout) == answer


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**REQUEST, "hardware": "h900"}, "hardware: unknown hardware 'h900' (did you mean h200 or h100?)"),
        ({**REQUEST, "acceptance": {"per_position": [1.5]}}, "acceptance.per_position.0: Input should be less"),
        ({**REQUEST, "gammas": [0, 40]}, "gammas.1: Input should be less than or equal to 16"),
        ({**REQUEST, "batch_sizes": [-1]}, "batch_sizes.0: Input should be greater than or equal to 1"),
        ({**REQUEST, "target_model": {"hidden_size": 1}}, "target_model: config.json cannot be read"),
    ],
)
def test_whatif_bad_input_exits_2_naming_the_field(tmp_path: Path, body: dict[str, Any], message: str) -> None:
    result = cli("whatif", str(write(tmp_path, body)))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_whatif_unreadable_input_exits_2(tmp_path: Path) -> None:
    missing = cli("whatif", str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    not_json = cli("whatif", "-", stdin="{hardware: h100")
    assert not_json.returncode == 2 and "input is not JSON" in not_json.stderr
    endless = cli("whatif", "-", stdin='{"batch_sizes": [' + "9" * 5000 + "]}")  # past Python's int digit limit
    assert endless.returncode == 2 and "input is not JSON" in endless.stderr and "Traceback" not in endless.stderr


def test_whatif_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "speedup.png"
    result = cli("whatif", str(write(tmp_path, REQUEST)), "--plot", str(picture))
    assert result.returncode == 0, result.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(result.stdout)["points"]  # the JSON still goes to stdout


def test_whatif_plot_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    # A None entry in sys.modules makes `import matplotlib` raise ImportError, as on a machine without it.
    blocked = [sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
               "from service.cli.command import main; sys.exit(main(sys.argv[1:]))"]
    picture = tmp_path / "speedup.png"
    result = cli("whatif", str(write(tmp_path, REQUEST)), "--plot", str(picture), command=blocked)
    assert result.returncode == 2
    assert "--plot needs matplotlib" in result.stderr and "spec-advisor[plot]" in result.stderr
    assert "Traceback" not in result.stderr and not picture.exists()


def test_schedule_from_a_whatif_file(tmp_path: Path) -> None:
    path = write(tmp_path, REQUEST)
    text = cli("schedule", str(path), "--max-num-seqs", "512")
    assert text.returncode == 0, text.stderr
    assert "--speculative-config '{\"method\": \"eagle3\"" in text.stdout
    assert "speculative_config:\n    max_draft_len:" in text.stdout  # the TensorRT-LLM YAML, indented
    as_json = cli("schedule", str(path), "--max-num-seqs", "512", "--context-tokens", "4096", "--format", "json")
    out = json.loads(as_json.stdout)
    bands = out["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert bands[0][0] == 1 and bands[-1][1] == 512 and out["context_tokens"] == 4096.0
    assert max(k for _, _, k in bands) <= 5  # max(gammas) bounds K
    default = json.loads(cli("schedule", str(path), "--format", "json").stdout)  # no flag: vLLM's usual 256
    assert default["max_num_seqs"] == 256
    assert default["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"][-1][1] == 256


def test_schedule_usage_errors_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, REQUEST)
    both = cli("schedule", str(path), "--url", "http://127.0.0.1:9")
    assert both.returncode == 2 and "not both" in both.stderr
    no_gamma = cli("schedule", str(write(tmp_path, {**REQUEST, "gammas": [0]})))
    assert no_gamma.returncode == 2 and "gammas: a schedule needs at least one gamma >= 1" in no_gamma.stderr
    bad_seqs = cli("schedule", str(path), "--max-num-seqs", "0")
    assert bad_seqs.returncode == 2 and "must be 1..16384" in bad_seqs.stderr


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_schedule_from_a_running_sidecar() -> None:
    board = Board([("llama", None)], started_at_s=1_000.0)
    per_position = (0.78, 0.58, 0.43)
    evidence = Evidence(
        target="llama", model="meta-llama/Llama-3.1-8B-Instruct", at_s=1_000.0, state=DataState.OK,
        speculation_on=True, deployed_k=3,
        acceptance=AcceptanceEvidence(
            per_position=per_position, per_position_low=per_position, per_position_high=per_position,
            drafts=1000.0, draft_tokens=3000.0, accepted_tokens=1000.0 * sum(per_position),
            mean_acceptance_length=1.0 + sum(per_position), acceptance_rate=sum(per_position) / 3,
            mean_proposed_length=3.0, window_s=60.0,
        ),
        batch=8.0, waiting=0.0, context_tokens_per_seq=600.0,
    )
    decision = Decision(
        target="llama", model=evidence.model, state=DataState.OK, enabled=True, num_speculative_tokens=3,
        expected_speedup=1.5, expected_speedup_low=1.4, expected_speedup_high=1.6, reason="on", evaluated_at_s=1_000.0,
    )
    profiles = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "drafter": "eagle3", "tensor_parallel": "1"}
    board.publish("llama", evidence=evidence, decision=decision, good_scrape_s=1_000.0,
                  pricing=Pricing(profiles=profiles))
    app = create_api(
        board, metrics=MetricsPage(board, clock=lambda: 1_000.0, version="t"), clock=lambda: 1_000.0,
        stall_after_s=15.0, version="t",
        extensions=ApiExtensions(routers=[create_whatif_router(live_targets=live_targets_from_board(board))]),
    )

    async def scenario(*flags: str) -> tuple[int, str, str]:
        async with serving(app) as url:
            process = await asyncio.create_subprocess_exec(
                *COMMAND, "schedule", "--url", url, "--target", "llama", *flags,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env(),
            )
            out, err = await asyncio.wait_for(process.communicate(), timeout=DEADLINE_S)
            return process.returncode or 0, out.decode(), err.decode()

    code, out, err = asyncio.run(scenario("--max-num-seqs", "64"))
    assert code == 0, err
    assert out.startswith("target llama (meta-llama/Llama-3.1-8B-Instruct): state ok")
    assert "context 600 tokens/seq, batch 1..64" in out and "--speculative-config '" in out
    # Without the flag the sidecar's own default range (the target sets no max_num_seqs here).
    code, out, err = asyncio.run(scenario())
    assert code == 0, err
    assert "context 600 tokens/seq, batch 1..256" in out

    unreachable = cli("schedule", "--url", f"http://127.0.0.1:{closed_port()}")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


def test_the_plot_draws_what_any_valid_request_asks(tmp_path: Path) -> None:
    # Speculation off only (gammas [0]) and a batch the memory cannot hold: an empty panel with the grey span,
    # not a crash.
    pytest.importorskip("matplotlib")
    for gammas in ([0], [3, 5]):
        response = run_whatif(WhatIfRequest.model_validate({**REQUEST, "gammas": gammas}))
        picture = tmp_path / f"plot-{len(gammas)}.png"
        plot_whatif(response, picture)
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
