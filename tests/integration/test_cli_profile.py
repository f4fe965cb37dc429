"""`spec-advisor profile`, and `whatif`/`schedule`/`serve` given a measured profile, as subprocesses: the profile
calibrates the what-if, and every bad input (another GPU or model, too old, unreadable, a busy or dead server, an
existing output) is a clear error with exit 1 or 2, never a silent answer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml
from test_cli_whatif import COMMAND, DEADLINE_S, REQUEST, clean_env, cli, closed_port, write

from policies.model.measured_profile import FORMAT
from service.sim.scenario import default_scenario
from service.sim.server import SimServer
from service.sim.world import World

DAY_S = 86400.0


def _point(batch: float, q: float, step_ms: float) -> dict[str, Any]:
    passes = 0 if q == 1.0 else 3
    return {
        "concurrency": round(batch), "deployed_k": passes, "batch": batch, "tokens_per_seq": q,
        "draft_passes": passes, "context_tokens": 512.0, "prefill_tokens": 0.0, "step_s": step_ms / 1000.0,
        "step_samples": 5000.0,
    }


# Llama-3.1-8B on one H100 with EAGLE-3 (REQUEST's deployment), measured plain and at k=3 (q = 4): verification
# that costs like compute at batch 64 (the k=3 step 2.5x the plain one), which the uncalibrated model does not know.
STEPS_MS = {1: (7.0, 8.0), 4: (7.2, 9.0), 16: (7.8, 13.0), 64: (10.5, 26.0)}
E_L = 2.79  # REQUEST's mean acceptance length at k = 3


def profile_document(*, hardware: str = "h100-sxm", age_s: float = DAY_S) -> dict[str, Any]:
    points = [_point(b, 1.0, plain) for b, (plain, _) in STEPS_MS.items()]
    points += [_point(b, 4.0, spec) for b, (_, spec) in STEPS_MS.items()]
    return {
        "format": FORMAT, "created_at_s": time.time() - age_s,
        "identity": {"hardware": hardware, "model_profile": "llama-3.1-8b", "tensor_parallel": 1,
                     "drafter_method": "eagle3", "engine": "vllm", "engine_version": "0.32.0"},
        "points": points, "complete": True,
    }


def _speedups(answer: dict[str, Any], gamma: int) -> dict[float, tuple[float, float, float]]:
    return {
        p["batch"]: (p["speedup"], p["speedup_low"], p["speedup_high"])
        for p in answer["points"] if p["gamma"] == gamma and p["context_tokens"] == 512
    }


def test_whatif_with_a_profile_prices_the_measured_steps(tmp_path: Path) -> None:
    request = write(tmp_path, {**REQUEST, "batch_sizes": [1, 4, 16, 64], "gammas": [0, 3]})
    profile = write(tmp_path, profile_document(), "profile.json")
    plain = cli("whatif", str(request))
    measured = cli("whatif", str(request), "--profile", str(profile))
    assert plain.returncode == 0 and measured.returncode == 0, plain.stderr + measured.stderr
    before, after = json.loads(plain.stdout), json.loads(measured.stdout)
    assert any(note.startswith("calibrated on a measured profile: 8 levels of plain and speculative steps")
               for note in after["notes"])
    assert not any("uncalibrated" in note for note in after["notes"])
    # The truth the profile implies at each batch: S(3) = E[L] x T(plain) / T(k=3), both steps measured.
    for batch, (plain_ms, spec_ms) in STEPS_MS.items():
        truth = E_L * plain_ms / spec_ms
        speedup, low, high = _speedups(after, 3)[float(batch)]
        assert low <= truth <= high, (batch, truth, low, high)
        assert abs(speedup / truth - 1) < 0.10, (batch, speedup, truth)
    # At 64 the measured verification costs more than the prior assumed, and the measured band is narrower.
    prior_64, measured_64 = _speedups(before, 3)[64.0], _speedups(after, 3)[64.0]
    assert measured_64[0] < prior_64[0]
    assert measured_64[2] - measured_64[1] < 0.5 * (prior_64[2] - prior_64[1])


def test_whatif_refuses_a_profile_of_another_gpu_too_old_or_unreadable(tmp_path: Path) -> None:
    request = write(tmp_path, REQUEST)
    other_gpu = write(tmp_path, profile_document(hardware="a100-sxm-80gb"), "a100.json")
    answer = cli("whatif", str(request), "--profile", str(other_gpu))
    assert answer.returncode == 2 and answer.stdout == ""
    assert "profile: profile measured hardware 'a100-sxm-80gb', but the what-if uses 'h100-sxm'" in answer.stderr

    old = write(tmp_path, profile_document(age_s=40 * DAY_S), "old.json")
    answer = cli("whatif", str(request), "--profile", str(old))
    assert answer.returncode == 2 and "40.0 days old, past the 30.0-day limit" in answer.stderr
    assert cli("whatif", str(request), "--profile", str(old), "--max-profile-age-days", "60").returncode == 0

    broken = profile_document()
    broken["points"][2]["step_s"] = -1.0
    answer = cli("whatif", str(request), "--profile", str(write(tmp_path, broken, "broken.json")))
    assert answer.returncode == 2 and "points.2.step_s: -1 is outside" in answer.stderr

    answer = cli("whatif", str(request), "--profile", str(tmp_path / "missing.json"))
    assert answer.returncode == 2 and "cannot read" in answer.stderr


def test_schedule_with_a_profile_says_it_is_calibrated(tmp_path: Path) -> None:
    request = write(tmp_path, REQUEST)
    profile = write(tmp_path, profile_document(), "profile.json")
    answer = cli("schedule", str(request), "--profile", str(profile), "--max-num-seqs", "64", "--format", "json")
    assert answer.returncode == 0, answer.stderr
    assert f"calibrated on the measured profile {profile}" in json.loads(answer.stdout)["reason"]
    refused = cli("schedule", "--url", "http://127.0.0.1:1", "--profile", str(profile))
    assert refused.returncode == 2 and "--profile applies to a what-if FILE" in refused.stderr


def test_serve_refuses_a_target_profile_it_cannot_read(tmp_path: Path) -> None:
    broken = profile_document()
    broken["format"] = "something-else"
    for path, message in (
        (tmp_path / "missing.json", "is not a readable file"),
        (write(tmp_path, broken, "broken.json"), "format: expected 'spec-advisor-profile/1'"),
    ):
        config = tmp_path / "settings.yaml"
        config.write_text(yaml.safe_dump({"targets": [{
            "name": "a", "url": "http://127.0.0.1:1", "hardware": "h100-sxm", "model_profile": "llama-3.1-8b",
            "drafter": {"method": "eagle3"}, "profile": str(path),
        }]}), encoding="utf-8")
        answer = cli("serve", "--config", str(config))
        assert answer.returncode == 2, answer.stderr
        assert message in answer.stderr


PROFILE_ARGS = ("--hardware", "h100-sxm", "--model-profile", "llama-3.1-8b", "--drafter-method", "eagle3")


def test_profile_refuses_usage_errors_before_touching_a_server(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    url = f"http://127.0.0.1:{closed_port()}"
    cases = (
        (("--concurrency", "8,4"), "ascending and distinct"),
        (("--concurrency", "1,600"), "1..512"),
        (("--level-s", "0.1"), "level 1..600"),
        (("--max-tokens", "0"), "--max-tokens must be 1..4096"),
        (("--draft-tensor-parallel", "1"), "drafter.tensor_parallel applies to method draft_model only"),
    )
    for extra, message in cases:
        answer = cli("profile", "--url", url, "--out", str(out), *PROFILE_ARGS, *extra)
        assert answer.returncode == 2 and message in answer.stderr, answer.stderr
    answer = cli("profile", "--url", url, "--out", str(out), "--hardware", "h100-sxm", "--model-profile", "nope")
    assert answer.returncode == 2 and "model_profile" in answer.stderr
    out.write_text("{}", encoding="utf-8")
    answer = cli("profile", "--url", url, "--out", str(out), *PROFILE_ARGS)
    assert answer.returncode == 2 and "exists: pass --append" in answer.stderr
    answer = cli("profile", "--url", url, "--out", str(out), *PROFILE_ARGS, "--append")
    assert answer.returncode == 2 and "format: expected" in answer.stderr  # the file to append to is no profile
    assert out.read_text(encoding="utf-8") == "{}"  # nothing lost
    # A profile with 999 points cannot take a plan of two more levels: refused before the server is touched.
    full = profile_document()  # the deployment PROFILE_ARGS name
    full["points"] = (full["points"] * 125)[:999]
    out.write_text(json.dumps(full), encoding="utf-8")
    answer = cli("profile", "--url", url, "--out", str(out), *PROFILE_ARGS, "--concurrency", "1,2", "--append")
    assert answer.returncode == 2 and "holds 999 points; 2 more would pass the 1000" in answer.stderr, answer.stderr


def test_profile_of_an_unreachable_server_exits_1(tmp_path: Path) -> None:
    answer = cli("profile", "--url", f"http://127.0.0.1:{closed_port()}", "--out", str(tmp_path / "p.json"),
                 *PROFILE_ARGS)
    assert answer.returncode == 1 and "cannot reach" in answer.stderr
    assert not (tmp_path / "p.json").exists()


async def _profile_against_the_simulator(*extra: str, out: Path) -> tuple[int, str]:
    # The simulator serves vLLM's /metrics and /v1/models for a world with traffic; it has no /v1/completions.
    sim = SimServer(World(default_scenario(), seed=1, start_s=time.time()), host="127.0.0.1", port=0)
    await sim.start()
    try:
        process = await asyncio.create_subprocess_exec(
            *COMMAND, "profile", "--url", sim.url, "--out", str(out), *PROFILE_ARGS, *extra,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env(),
        )
        _, err = await asyncio.wait_for(process.communicate(), timeout=DEADLINE_S)
        return process.returncode or 0, err.decode()
    finally:
        await sim.stop()


def test_profile_refuses_a_server_serving_traffic(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code, err = asyncio.run(_profile_against_the_simulator("--concurrency", "1", "--level-s", "1", out=out))
    assert code == 2, err
    assert "the server is serving traffic" in err and "pass --force" in err
    assert not out.exists()


def test_profile_forced_onto_a_server_that_cannot_serve_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code, err = asyncio.run(_profile_against_the_simulator(
        "--concurrency", "1", "--level-s", "1", "--warmup-s", "0", "--force", out=out
    ))
    assert code == 1, err
    assert "requests failed at 1 clients" in err and "no level was measured" in err
    assert not out.exists()
