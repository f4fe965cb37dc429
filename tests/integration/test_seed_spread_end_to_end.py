"""benchmarks/seed_spread.py end to end: each seed's static runs and the advisor, the bench's own /static."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks.seed_spread import main, run_one
from service.bench.report import advisor_ratios
from service.bench.spec import load_bench_scenario
from service.bench.suite import run_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios"


def test_on_the_files_own_seed_the_ratio_is_the_benchs_static_column() -> None:
    # never-worth-it: the advisor turns k=3 off at 40 s, so it is not one of the static runs and the ratio is not 1.
    path = SCENARIOS / "bench" / "never-worth-it.yaml"
    bench = load_bench_scenario(path)
    _, static = advisor_ratios(asyncio.run(run_scenario(bench, duration_s=120.0)))
    mine = run_one(str(path), bench.bench.seed, 120.0)
    assert static is not None and static < 0.99
    assert mine.ratio == pytest.approx(static, rel=1e-9)


def test_each_seed_gives_one_ratio_and_the_table_its_spread(capsys: pytest.CaptureFixture[str]) -> None:
    low_load = SCENARIOS / "bench" / "low-load.yaml"
    assert main([str(low_load), "--seeds", "2", "--duration-s", "60", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    # The file's own seed (0) and the next one, each reported in turn.
    assert "low-load seed 0:" in err and "low-load seed 1:" in err
    [row] = [line for line in out.splitlines() if line.startswith("low-load")]
    first, second, low, high, spread = (float(x) for x in row.split()[1:])
    assert min(first, second) > 0.5 and max(first, second) < 1.1  # a light load: the advisor keeps k=3, near the best
    assert (low, high) == (min(first, second), max(first, second))
    assert spread == pytest.approx(high - low, abs=1e-3)
    assert out.splitlines()[-1].startswith("1 scenarios x 2 seeds:")


def test_an_invalid_scenario_file_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name: x\nbench: {duration_s: -1}\n", encoding="utf-8")
    assert main([str(bad), "--seeds", "1", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("invalid scenario: ") and str(bad) in err
