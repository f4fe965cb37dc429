"""`spec-advisor bench` end to end on two tiny scenarios: the real advisor pipeline, the static policies and the
oracle over a few simulated minutes (seconds of wall time). Behaviour only, no timing assertions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from service.bench.report import yardstick_defects
from service.bench.spec import load_bench_scenario
from service.bench.suite import ALWAYS_OFF, ORACLE, ORACLE_DEPLOYED, POLICIES, STATIC_POLICIES, run_scenario
from service.cli.command import main

SCENARIOS = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios"
BENCH = SCENARIOS / "bench"
# Short run, small grids: 60 ticks of 5 s.
SMALL = {"duration_s": 300, "gamma_max": 3, "batch_thresholds": [8, 64]}


def _tiny(tmp_path: Path, source: str) -> Path:
    data = yaml.safe_load((BENCH / f"{source}.yaml").read_text(encoding="utf-8"))
    data["bench"] = {**data["bench"], **SMALL}
    path = tmp_path / f"tiny-{source}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_oracle_bounds_every_static_policy_and_off_never_changes(tmp_path: Path) -> None:
    bench = load_bench_scenario(_tiny(tmp_path, "always-worth-it"))
    result = asyncio.run(run_scenario(bench))
    assert result.error is None
    assert set(result.outcomes) == set(POLICIES)
    assert result.quality is not None
    # Steady load and acceptance: the oracle starts configured as the best static run and has nothing to chase,
    # so there is no crossing to lag behind.
    assert result.quality.crossings == ()
    assert result.outcomes[ALWAYS_OFF].run.config_changes == 0
    assert all(t.k == 0 for t in result.outcomes[ALWAYS_OFF].run.ticks)
    # An upper bound on every static run by construction (same world seed, service.bench.hindsight), exactly.
    oracle = result.headline(ORACLE)
    assert all(oracle >= result.headline(policy) for policy in STATIC_POLICIES)
    assert yardstick_defects(result) == []
    # With an SLO only speculation meets (8 ms; off runs at ~11 ms here), off delivers nothing under it.
    off = result.outcomes[ALWAYS_OFF].run.metrics
    assert off.slo_goodput_tokens_per_s is not None
    assert off.slo_goodput_tokens_per_s < 0.1 * result.headline(ORACLE)


def test_the_oracle_from_a_deployment_that_is_off_starts_off_and_says_so(tmp_path: Path) -> None:
    # deployed-off-h100pcie: speculation deployed off (k=0) with a good EAGLE head loaded. The run from the
    # deployed k starts off, is labelled so, and ends at or above always-off (holding what runs is its first
    # boundary's first candidate).
    data = yaml.safe_load((SCENARIOS / "unseen2" / "deployed-off-h100pcie.yaml").read_text(encoding="utf-8"))
    assert data["drafter"]["num_speculative_tokens"] == 0
    data["bench"] = {**data["bench"], **SMALL, "duration_s": 120}
    path = tmp_path / "tiny-deployed-off.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = asyncio.run(run_scenario(load_bench_scenario(path)))
    assert result.error is None
    outcome = result.outcomes[ORACLE_DEPLOYED]
    assert outcome.setting == "from k=0"
    assert outcome.run.config_changes >= 1 or all(t.k == 0 for t in outcome.run.ticks)  # no change: it stayed off
    assert result.headline(ORACLE_DEPLOYED) >= result.headline(ALWAYS_OFF)


def test_cli_runs_valid_files_reports_the_invalid_one_and_writes_table_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [_tiny(tmp_path, "low-load"), _tiny(tmp_path, "rolling-update")]
    bad = tmp_path / "broken.yaml"
    data = yaml.safe_load(good[0].read_text(encoding="utf-8"))
    data["drafter"]["conditional_acceptance"] = [1.5]
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = tmp_path / "out"

    status = main(["bench", str(good[0]), str(bad), str(good[1]), "--duration-s", "120", "--out", str(out)])

    captured = capsys.readouterr()
    assert status == 2  # an invalid file; the valid ones still ran
    assert str(bad) in captured.err and "drafter.conditional_acceptance" in captured.err
    table = captured.out
    policy_table = table[:table.index("goodput:")]
    for name in ("tiny-low-load", "tiny-rolling-update"):
        rows = [line for line in policy_table.splitlines() if line.startswith(name + " ")]
        assert {row.split()[1] for row in rows} == set(POLICIES), name
        assert (out / f"{name}.png").stat().st_size > 0
    assert "broken" in table and "FAILED" in table
    assert "worst advisor/best known" in table and "oracle beaten (yardstick defects):" in table
    # The quality table: one row per valid scenario, ending in its targets verdict.
    quality = table[table.index("targets"):].splitlines()
    for name in ("tiny-low-load", "tiny-rolling-update"):
        [row] = [line for line in quality if line.startswith(name + " ")]
        assert row.rstrip().endswith("ok") or "MISS" in row
    assert (out / "bench.txt").read_text(encoding="utf-8").strip() == table.strip()


def test_an_unknown_advisor_profile_is_a_file_error_and_same_named_files_stay_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _tiny(tmp_path, "low-load")
    other = tmp_path / "elsewhere"
    other.mkdir()
    twin = other / good.name  # the same stem from another folder, another load
    data = yaml.safe_load(good.read_text(encoding="utf-8"))
    data["workload"]["arrival_rate"] = [{"t_s": 0, "requests_per_s": 3.0}]
    twin.write_text(yaml.safe_dump(data), encoding="utf-8")
    bad = tmp_path / "no-such-gpu.yaml"
    data["bench"]["advisor"]["hardware"] = "no-such-gpu"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = tmp_path / "out"

    status = main(["bench", str(good), str(twin), str(bad), "--duration-s", "60", "--out", str(out), "--no-plots"])

    captured = capsys.readouterr()
    assert status == 2  # a file error, found before anything ran
    assert f"{bad}: invalid bench.advisor" in captured.err and "no-such-gpu" in captured.err
    policy_table = captured.out[:captured.out.index("goodput:")]
    for name in ("tiny-low-load", "tiny-low-load-2"):
        assert {line.split()[1] for line in policy_table.splitlines() if line.startswith(name + " ")} == set(POLICIES)


def test_the_documented_schema_is_the_one_the_files_are_validated_against(
    capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    documented = json.loads((Path(__file__).resolve().parents[2] / "docs" / "scenario.schema.json").read_text())
    assert printed == documented, "regenerate: spec-advisor bench --schema > docs/scenario.schema.json"
    drafter = printed["$defs"]["DrafterTruth"]["properties"]
    assert "request_acceptance_spread" in drafter and "description" in drafter["request_acceptance_spread"]
    assert printed["$defs"]["BenchSection"]["properties"]["itl_slo_s"]["description"]
