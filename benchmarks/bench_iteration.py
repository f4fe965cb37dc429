"""One advisor iteration (parse + estimate + advise) on real vLLM pages: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.bench_iteration [--repeat N] [--profile]

Times what `service/loop.py` runs per target and tick: `parse_vllm_metrics` on the 52 KB real vLLM 0.32 capture,
`observe` + `estimate`, then `advise_target` with the estimator, decide and calibration states carried from tick
to tick as a long-running sidecar carries them. Every tick is 5 s after the previous one and the page's counters
grow (as `tests/integration/sidecar_http.CaptureServer` grows them), so each window holds fresh drafts and a fresh
step time, and the calibration keeps its full history of points (`CalibrationConfig.max_points`). The ticks that
fill that history run untimed first (the warm-up), so the figures are the steady state. calibrate's share is
`policies.model.calibrate.update` timed alone on the same inputs; in the steady state every tick brings a new window
(the newest point replaced), so each one warm-starts and runs a capped handful of LM steps, usually one or two
(a tick without a new point skips the refit altogether). Then the whole iteration on pages made 2x, 4x and 8x
larger by replicating the engine series (what a data-parallel server does to the page).
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import re
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from policies.advise import AdvisorConfig, AdvisorState, advise_target
from policies.decide.rule import DecideConfig, DecideState
from policies.estimate.window import EstimatorConfig, EstimatorState, estimate, observe
from policies.model.calibrate import CalibrationConfig, CalibrationState, update
from policies.model.costmodel import ModelContext
from policies.model.objectives import ObjectiveConfig
from policies.model.profiles import DrafterProfile, hardware_by_name, model_by_name
from policies.types import DraftMethod, EngineSnapshot, HistogramReading
from service.sources.vllm import parse_vllm_metrics

CAPTURE = (
    Path(__file__).resolve().parent.parent
    / "tests/fixtures/vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt"
)
INTERVAL_S = 5.0
MODEL = "tiny"


def _fmt(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1e3:7.3f} ms   p99 {p99 * 1e3:7.3f} ms"


def _replicate_engines(text: str, copies: int) -> str:
    """Copy every `engine="0"` sample line as engines 1..copies-1: a data-parallel server's page."""
    out: list[str] = []
    for line in text.splitlines():
        out.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            out.extend(re.sub(r'engine="0"', f'engine="{i}"', line) for i in range(1, copies))
    return "\n".join(out) + "\n"


def _grown(base: EngineSnapshot, tick: int) -> EngineSnapshot:
    """The server `tick` intervals after `base`: every counter x (1 + tick) (same ratios, fresh deltas), running
    2..16 requests (changing every 35 s) with 1% of the KV cache in use."""
    factor = 1.0 + tick

    def histogram(reading: HistogramReading | None) -> HistogramReading | None:
        if reading is None:
            return None
        buckets = tuple((le, count * factor) for le, count in reading.buckets)
        return HistogramReading(sum=reading.sum * factor, count=reading.count * factor, buckets=buckets)

    spec = base.spec
    if spec is not None:
        spec = replace(
            spec,
            drafts=spec.drafts * factor,
            draft_tokens=spec.draft_tokens * factor,
            accepted_tokens=spec.accepted_tokens * factor,
            accepted_per_position=tuple(c * factor for c in spec.accepted_per_position),
        )
    return replace(
        base,
        taken_at_s=base.taken_at_s + tick * INTERVAL_S,
        # The capture is of an idle server; a busy one with a batch that moves gives the fitter distinct points.
        num_requests_running=2.0 + 2.0 * (tick // 7 % 8),
        kv_cache_usage_ratio=0.01,
        spec=spec,
        generation_tokens=None if base.generation_tokens is None else base.generation_tokens * factor,
        prompt_tokens=None if base.prompt_tokens is None else base.prompt_tokens * factor,
        inter_token_latency=histogram(base.inter_token_latency),
        iteration_tokens=histogram(base.iteration_tokens),
    )


@dataclass(slots=True)
class Sidecar:
    """The per-target state the loop threads through the pure functions between ticks."""

    ctx: ModelContext
    estimator: EstimatorState
    decide: DecideState
    calibration: CalibrationState
    tick: int = 0


EST_CONFIG = EstimatorConfig(min_drafts=100)
CALIBRATION_CONFIG = CalibrationConfig()
ADVISOR_CONFIG = AdvisorConfig(decide=DecideConfig(), calibration=CALIBRATION_CONFIG, objective=ObjectiveConfig())


def _tick(sidecar: Sidecar, base: EngineSnapshot, page: str | None) -> None:
    """One loop tick for one target; `page` is parsed when given (the parse result's counters are then replaced
    by the grown ones, so every tick sees a fresh window whatever the page)."""
    if page is not None:
        parse_vllm_metrics(page, taken_at_s=base.taken_at_s)
    snapshot = _grown(base, sidecar.tick)
    now_s = snapshot.taken_at_s
    sidecar.estimator = observe(sidecar.estimator, snapshot, EST_CONFIG)
    evidence = estimate(sidecar.estimator, target="bench", config=EST_CONFIG, now_s=now_s)
    advice = advise_target(
        evidence, sidecar.ctx, ADVISOR_CONFIG, AdvisorState(decide=sidecar.decide, calibration=sidecar.calibration),
        now_s,
    )
    sidecar.decide, sidecar.calibration = advice.state.decide, advice.state.calibration
    sidecar.tick += 1


def _warm(ctx: ModelContext, base: EngineSnapshot) -> Sidecar:
    """A sidecar whose calibration history is full: max_points points spaced min_spacing_s apart, and more."""
    sidecar = Sidecar(ctx=ctx, estimator=EstimatorState(), decide=DecideState(), calibration=CalibrationState())
    per_point = math.ceil(CALIBRATION_CONFIG.min_spacing_s / INTERVAL_S) + 1
    for _ in range(CALIBRATION_CONFIG.max_points * per_point + 10):
        _tick(sidecar, base, None)
    return sidecar


def _stages(sidecar: Sidecar, base: EngineSnapshot, text: str, repeat: int) -> dict[str, list[float]]:
    """Per stage times of `repeat` steady-state ticks, states carried across them."""
    times: dict[str, list[float]] = {name: [] for name in ("parse", "estimate", "advise", "calibrate", "tick")}
    clock = time.perf_counter
    for _ in range(repeat):
        snapshot = _grown(base, sidecar.tick)
        now_s = snapshot.taken_at_s
        t0 = clock()
        parse_vllm_metrics(text, taken_at_s=now_s)
        t1 = clock()
        sidecar.estimator = observe(sidecar.estimator, snapshot, EST_CONFIG)
        evidence = estimate(sidecar.estimator, target="bench", config=EST_CONFIG, now_s=now_s)
        t2 = clock()
        advice = advise_target(
            evidence, sidecar.ctx, ADVISOR_CONFIG,
            AdvisorState(decide=sidecar.decide, calibration=sidecar.calibration), now_s,
        )
        t3 = clock()
        # calibrate alone, on the same inputs (pure: running it again changes nothing carried).
        update(sidecar.calibration, evidence, sidecar.ctx, now_s=now_s, config=CALIBRATION_CONFIG)
        t4 = clock()
        sidecar.decide, sidecar.calibration = advice.state.decide, advice.state.calibration
        sidecar.tick += 1
        for name, value in (("parse", t1 - t0), ("estimate", t2 - t1), ("advise", t3 - t2),
                            ("calibrate", t4 - t3), ("tick", t3 - t0)):
            times[name].append(value)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=500)
    parser.add_argument("--profile", action="store_true", help="cProfile the steady-state advise_target ticks")
    args = parser.parse_args()

    text = CAPTURE.read_text()
    ctx = ModelContext(
        hardware=hardware_by_name("cpu"),
        model=model_by_name("tiny-llama"),
        drafter=DrafterProfile(method=DraftMethod.NGRAM),
    )
    parsed = parse_vllm_metrics(text, taken_at_s=0.0)[MODEL]
    created_s = parsed.created_s if parsed.created_s is not None else 0.0
    base = replace(parsed, taken_at_s=created_s + 100.0)
    sidecar = _warm(ctx, base)
    points = len(sidecar.calibration.points)

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.repeat):
            _tick(sidecar, base, None)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        return

    times = _stages(sidecar, base, text, args.repeat)
    advise, calibrate = statistics.median(times["advise"]), statistics.median(times["calibrate"])
    print(f"page: {CAPTURE.name} ({len(text.encode()) / 1024:.1f} KiB, {text.count(chr(10))} lines); "
          f"{args.repeat} steady-state ticks, calibration history {points} points")
    print(f"  parse                      {_fmt(times['parse'])}")
    print(f"  observe+estimate           {_fmt(times['estimate'])}")
    print(f"  advise_target              {_fmt(times['advise'])}")
    print(f"    of which calibrate       {_fmt(times['calibrate'])}   ({calibrate / advise:.0%} of advise_target)")
    print(f"  whole tick (parse+est+adv) {_fmt(times['tick'])}")
    print("scaling with page size (engines replicated), whole tick:")
    for copies in (1, 2, 4, 8):
        page = _replicate_engines(text, copies)
        samples: list[float] = []
        for _ in range(max(50, args.repeat // copies)):
            start = time.perf_counter()
            _tick(sidecar, base, page)
            samples.append(time.perf_counter() - start)
        print(f"  {copies} engine(s) {len(page.encode()) / 1024:7.1f} KiB   {_fmt(samples)}")


if __name__ == "__main__":
    main()
