"""One advisor iteration (parse + estimate + decide) on real vLLM pages: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.bench_iteration [--repeat N]

Reports the median and p99 time of each stage on the 52 KB real vLLM 0.32 capture, then the whole iteration on
pages made 2x, 4x and 8x larger by replicating the engine series (what a data-parallel server does to the page), so
linear growth can be read off the table.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from policies.advise import advise
from policies.costmodel import ModelContext
from policies.decide import DecideConfig, DecideState
from policies.estimate import EstimatorConfig, EstimatorState, estimate, observe
from policies.profiles import DrafterProfile, hardware_by_name, model_by_name
from policies.types import DraftMethod
from service.sources.vllm import parse_vllm_metrics

CAPTURE = (
    Path(__file__).resolve().parent.parent
    / "tests/fixtures/vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt"
)


def _timed(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()

    text = CAPTURE.read_text()
    est_config = EstimatorConfig(min_drafts=100)
    ctx = ModelContext(
        hardware=hardware_by_name("cpu"),
        model=model_by_name("tiny-llama"),
        drafter=DrafterProfile(method=DraftMethod.NGRAM),
    )
    decide_config = DecideConfig()
    base = parse_vllm_metrics(text, taken_at_s=1000.0)["tiny"]
    state = observe(EstimatorState(), base, est_config)
    evidence = estimate(state, target="bench", config=est_config, now_s=1000.0)

    def iteration(page: str) -> None:
        snaps = parse_vllm_metrics(page, taken_at_s=1001.0)
        st = observe(state, snaps["tiny"], est_config)
        ev = estimate(st, target="bench", config=est_config, now_s=1001.0)
        advise(ev, ctx, decide_config, DecideState(), 1001.0)

    print(f"page: {CAPTURE.name} ({len(text.encode()) / 1024:.1f} KiB, {text.count(chr(10))} lines)")
    print(f"  parse                 {_fmt(_timed(lambda: parse_vllm_metrics(text, taken_at_s=1001.0), args.repeat))}")
    print(f"  observe+estimate      {_fmt(_timed(lambda: estimate(observe(state, base, est_config), target='b', config=est_config, now_s=1001.0), args.repeat))}")  # noqa: E501
    print(f"  advise (model+decide) {_fmt(_timed(lambda: advise(evidence, ctx, decide_config, DecideState(), 1001.0), args.repeat))}")  # noqa: E501
    print(f"  whole iteration       {_fmt(_timed(lambda: iteration(text), args.repeat))}")
    print("scaling with page size (engines replicated):")
    for copies in (1, 2, 4, 8):
        page = _replicate_engines(text, copies)
        samples = _timed(lambda page=page: iteration(page), max(50, args.repeat // copies))  # type: ignore[misc]
        print(f"  {copies} engine(s) {len(page.encode()) / 1024:7.1f} KiB   {_fmt(samples)}")


if __name__ == "__main__":
    main()
