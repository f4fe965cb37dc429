"""benchmarks/compare_surface.py runs on a measured surface (a CPU smoke run of benchmarks/gpu_step_surface.py,
tests/fixtures/surface/): it prices every point, calibrates on half and reports the other half."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.compare_surface import main

SURFACE = Path(__file__).resolve().parents[1] / "fixtures" / "surface" / "cpu-tiny.csv"


def test_compare_prices_every_point_and_judges_the_held_out_half(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SURFACE), "--hardware", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert len(rows) == 12  # every measured point priced
    assert sum(line.rstrip().endswith("yes") for line in rows) == 6  # every other one held out
    assert "physics, uncalibrated: median" in out and "held-out points: median" in out


def test_an_unknown_device_asks_for_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    surface = tmp_path / "s.csv"
    surface.write_text(SURFACE.read_text().replace("cpu,", "Tesla T4,"), encoding="utf-8")
    (tmp_path / "s.config.json").write_text(SURFACE.with_suffix(".config.json").read_text(), encoding="utf-8")
    assert main([str(surface)]) == 2
    assert "pass --hardware" in capsys.readouterr().err
