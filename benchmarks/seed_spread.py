"""How much does advisor / best static move with the world's seed? Figures per scenario, not assertions.

    .venv/bin/python -m benchmarks.seed_spread                                # the packaged bench scenarios
    .venv/bin/python -m benchmarks.seed_spread service/sim/scenarios/unseen*/*.yaml --seeds 3

`spec-advisor bench` runs every policy on one world seed (`bench.seed`), so a rerun gives the same figures to the
last digit: its `/static` column is exact for that world and says nothing of how much it would move in another
draw of the same scenario (other arrivals, prompt and output lengths, acceptance draws). This runs, for each
scenario and each of `--seeds` seeds (the file's own `bench.seed`, then +1, +2, ...), the static policies the bench
ranks (every fixed gamma 0..gamma_max, always-on at the deployed k, each batch threshold) and the advisor (the
sidecar pipeline from the deployed k), and prints the advisor's headline over the best static policy's in the
scenario's objective, ranked as the bench ranks them (service/bench/suite.py `run_statics`, `StaticRuns.headline`,
`advisor_spec`): the bench's `/static`, seed by seed; on the file's own seed it is the bench's figure. No oracle
runs, so a seed costs about a sixth of the bench's time (the 40 scenarios: 8 min a seed, the bench 46.5 min).
Exit status: 0; 1 when a run failed (the others are still reported); 2 for an invalid scenario file (nothing
runs).

Reading it: a scenario whose ratio is below 0.995 on every seed is below the best static policy beyond the
world's own variation; one whose seeds straddle it is within it, and the spread (max - min over the seeds) is the
bench's noise for that scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from service.bench.runner import PolicySpec, RunResult, run_policy
from service.bench.spec import load_bench_scenario
from service.bench.suite import TIE_RATIO, advisor_spec, headline_of, run_statics
from service.settings import SettingsError
from service.sim.scenario import ScenarioError

PACKAGED = Path(__file__).resolve().parents[1] / "service" / "sim" / "scenarios" / "bench"
# Below this share of the best static headline a run is worse than it (the bench's tie margin).
STATIC_TARGET = 1.0 - TIE_RATIO


@dataclass(frozen=True, slots=True)
class SeedResult:
    """One scenario on one seed: advisor / best static headline (`ratio`, NaN when the best static is 0)."""

    name: str
    seed: int
    ratio: float


def run_one(path: str, seed: int, duration_s: float | None) -> SeedResult:
    """The static policies and the advisor of the scenario at `path` on world seed `seed` (a worker's job)."""
    bench = load_bench_scenario(Path(path))
    bench = replace(bench, bench=bench.bench.model_copy(update={"seed": seed}))
    duration = duration_s if duration_s is not None else bench.bench.duration_s

    async def run(spec: PolicySpec) -> RunResult:
        return await run_policy(bench, spec, duration_s=duration)

    async def both() -> SeedResult:
        advisor, _ = advisor_spec(bench)
        statics = await run_statics(bench, run)
        best = statics.headline()
        mine = headline_of(await run(advisor), statics.objective)
        return SeedResult(bench.name, seed, mine / best if best > 0 else float("nan"))

    return asyncio.run(both())


def summary(results: list[SeedResult]) -> list[str]:
    """The table: one line per scenario (its ratio on each seed, min, max, spread), then the counts."""
    names = list(dict.fromkeys(r.name for r in results))
    lines = [f"{'scenario':36s} {'ratio by seed (advisor / best static)':44s} {'min':>6s} {'max':>6s} {'spread':>6s}"]
    below_all = below_some = 0
    spreads: list[float] = []
    for name in names:
        ratios = [r.ratio for r in results if r.name == name and math.isfinite(r.ratio)]
        if not ratios:
            lines.append(f"{name:36s} no static policy delivered anything: nothing to compare")
            continue
        low, high = min(ratios), max(ratios)
        spreads.append(high - low)
        below_all += high < STATIC_TARGET
        below_some += low < STATIC_TARGET <= high
        shown = " ".join(f"{x:.3f}" for x in ratios)
        lines.append(f"{name:36s} {shown:44s} {low:6.3f} {high:6.3f} {high - low:6.3f}")
    seeds = max(sum(1 for r in results if r.name == name) for name in names)
    lines.append(
        f"{len(names)} scenarios x {seeds} seeds: below {STATIC_TARGET} on every seed: "
        f"{below_all}; on some seeds only: {below_some}; spread median "
        f"{statistics.median(spreads) if spreads else math.nan:.3f}, max {max(spreads, default=math.nan):.3f}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="scenario files (default: the packaged bench scenarios)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per scenario: the file's own, +1, ... (3)")
    parser.add_argument("--duration-s", type=float, default=None, help="simulated seconds per run (the file's)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (one per CPU)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    files = [str(f) for f in (args.files or sorted(PACKAGED.glob("*.yaml")))]
    first_seeds: dict[str, int] = {}
    for f in files:
        try:
            bench = load_bench_scenario(Path(f))
            advisor_spec(bench)  # bad advisor settings are the file's error, said once here
        except (ScenarioError, SettingsError) as exc:
            print(f"invalid scenario: {exc}", file=sys.stderr)
            return 2
        first_seeds[f] = bench.bench.seed
    jobs = [(f, first_seeds[f] + i) for f in files for i in range(args.seeds)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        futures = [pool.submit(run_one, f, seed, args.duration_s) for f, seed in jobs]
        results, failed = [], 0
        for (f, seed), future in zip(jobs, futures, strict=True):
            try:
                result = future.result()
            except Exception as exc:  # one scenario's failure is reported, the rest still run
                print(f"  {Path(f).stem} seed {seed}: failed: {exc}", file=sys.stderr, flush=True)
                failed += 1
                continue
            print(f"  {Path(f).stem} seed {seed}: {result.ratio:.3f}", file=sys.stderr, flush=True)
            results.append(result)
    if results:
        print("\n".join(summary(results)))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
