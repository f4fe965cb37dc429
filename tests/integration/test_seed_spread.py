"""benchmarks/seed_spread.py end to end on one short scenario: each seed's static runs and the advisor."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.seed_spread import main

LOW_LOAD = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios" / "bench" / "low-load.yaml"


def test_each_seed_gives_one_ratio_of_the_advisor_to_the_best_static_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([str(LOW_LOAD), "--seeds", "2", "--duration-s", "60", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    # The file's own seed (0) and the next one, each reported as it finishes.
    assert "low-load seed 0:" in err and "low-load seed 1:" in err
    [row] = [line for line in out.splitlines() if line.startswith("low-load")]
    first, second, low, high, spread = (float(x) for x in row.split()[1:])
    assert min(first, second) > 0.5 and max(first, second) < 1.1  # a light load: the advisor keeps k=3, near the best
    assert (low, high) == (min(first, second), max(first, second))
    assert spread == pytest.approx(high - low, abs=1e-3)
    assert out.splitlines()[-1].startswith("1 scenarios x 2 seeds:")
