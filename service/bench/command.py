"""`spec-advisor bench`: load the scenario files (each error names file and field), run the suite with progress on
stderr, print the table, write it and one plot per scenario under the output folder.

Exit status: 0 all scenarios ran; 1 a scenario failed while running or an output could not be written; 2 a scenario
file was invalid (the valid ones still run).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path

from service.app import context_resolver
from service.bench.pipeline import bench_advisor_settings
from service.bench.report import format_table
from service.bench.spec import BenchScenario, load_bench_scenario
from service.bench.suite import ScenarioResult, run_suite
from service.logs import configure_logging
from service.settings import SettingsError
from service.sim.scenario import ScenarioError

EXIT_FAILED = 1
EXIT_INVALID = 2


def packaged_scenarios() -> list[Path]:
    """The scenarios shipped in service/sim/scenarios/bench/, sorted by name."""
    folder = resources.files("service.sim").joinpath("scenarios/bench")
    return sorted(Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith((".yaml", ".yml", ".json")))


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _quiet_logs() -> None:
    # The sidecar logs scrape failures while the simulated engine restarts: expected here, not news.
    configure_logging(log_format="text", level="error")


def run_bench(files: Sequence[Path], *, duration_s: float | None, out_dir: Path, plots: bool,
              jobs: int | None = None) -> int:
    """`jobs`: scenarios run at once in worker processes; None = one per CPU core."""
    _quiet_logs()
    paths = list(files) or packaged_scenarios()
    benches: list[BenchScenario] = []
    invalid: list[ScenarioResult] = []
    names: set[str] = set()
    for path in paths:
        try:
            bench = _checked(load_bench_scenario(path))
        except ScenarioError as exc:
            _progress(f"invalid scenario: {exc}")
            invalid.append(ScenarioResult(name=path.stem, source=str(path), duration_s=0.0, itl_slo_s=None,
                                          error=str(exc)))
            continue
        benches.append(replace(bench, name=_unique(bench.name, names)))
    workers = jobs if jobs is not None else os.cpu_count() or 1
    results = [*invalid, *run_suite(benches, duration_s=duration_s, progress=_progress, jobs=workers,
                                    worker_init=_quiet_logs)]
    table = format_table(results)
    print(table, flush=True)
    status = EXIT_INVALID if invalid else EXIT_FAILED if any(r.error for r in results) else 0
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench.txt").write_text(table + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"spec-advisor bench: cannot write {out_dir}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if plots:
        status = max(status, _plots([r for r in results if r.error is None], out_dir))
    return status


def _checked(bench: BenchScenario) -> BenchScenario:
    """The scenario, once the advisor's settings it asks for load (catalog names, sidecar settings): a bad one is
    a file error, named with its file, not a failure half-way through the run."""
    try:
        settings = bench_advisor_settings(bench)
        for target in settings.targets:
            context_resolver(target, fallback_hardware=settings.fallback_hardware)  # profiles exist, as at start-up
    except SettingsError as exc:
        raise ScenarioError(f"{bench.source}: invalid bench.advisor: {exc}") from exc
    return bench


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or name-2, name-3, ... when another file of the run has that stem (tables and plot files are keyed
    by it; two low-load.yaml from two folders would otherwise share one plot)."""
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}-{n}"
    taken.add(unique)
    return unique


def _plots(results: Sequence[ScenarioResult], out_dir: Path) -> int:
    from service.bench.plot import PlotUnavailableError, plot_scenario  # noqa: PLC0415  (matplotlib is optional)

    for result in results:
        path = out_dir / f"{result.name}.png"
        try:
            plot_scenario(result, path)
        except PlotUnavailableError as exc:
            print(f"spec-advisor bench: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except OSError as exc:
            print(f"spec-advisor bench: cannot write {path}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        _progress(f"plot: {path}")
    return 0
