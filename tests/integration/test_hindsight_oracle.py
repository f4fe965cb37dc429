"""The hindsight oracle over a load rise under an ITL SLO: starting from the best static run it stays at or above
every static run (exactly: same seed, deterministic world), and it moves when the rest of the run pays for it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from service.bench.accounting import Objective
from service.bench.runner import PolicySpec, RunResult, run_policy
from service.bench.spec import load_bench_scenario
from service.bench.suite import headline_of, hindsight_spec, scenario_objective

BENCH = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios" / "bench"
DURATION_S = 480.0
SLO_S = 0.010


def test_the_oracle_bounds_the_static_runs_and_moves_when_the_load_rises(tmp_path: Path) -> None:
    # slo-load-rise's world with a 10 ms SLO: 4 requests/s until 150 s, 22/s from 180 s. Light, gamma 2 meets the
    # SLO for the most requests; heavy, gamma 1 does (restart: 20 s).
    data = yaml.safe_load((BENCH / "slo-load-rise.yaml").read_text(encoding="utf-8"))
    data["workload"]["arrival_rate"] = [
        {"t_s": 0, "requests_per_s": 4.0}, {"t_s": 150, "requests_per_s": 4.0}, {"t_s": 180, "requests_per_s": 22.0},
    ]
    data["bench"] = {**data["bench"], "duration_s": DURATION_S, "oracle_segment_s": 60, "itl_slo_s": SLO_S}
    path = tmp_path / "slo-rise.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    bench = load_bench_scenario(path)

    async def run(spec: PolicySpec) -> RunResult:
        return await run_policy(bench, spec, duration_s=DURATION_S)

    statics = [(spec, asyncio.run(run(spec))) for spec in (PolicySpec(name=f"g{g}", initial_k=g) for g in range(4))]
    objective = scenario_objective(bench, [result for _, result in statics])
    assert objective == Objective("slo_goodput", itl_slo_s=SLO_S)
    oracle_spec = hindsight_spec(bench, DURATION_S, statics, objective)
    oracle = asyncio.run(run(oracle_spec))

    values = {spec.initial_k: headline_of(result, objective) for spec, result in statics}
    assert oracle_spec.initial_k == max(values, key=lambda g: values[g]) == 2  # starts as the best static run
    ks = [t.k for t in oracle.ticks]
    assert ks[0] == 2 and ks[-1] == 1  # moved to gamma 1 for the heavy phase
    assert ks.count(1) >= 6  # ... at least one 60 s segment before the end
    # Above every static run by more than the bench's tie margin: the move paid for its restart.
    assert headline_of(oracle, objective) > 1.005 * max(values.values())
