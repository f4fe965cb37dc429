"""The cost model against a measured step-time surface (benchmarks/gpu_step_surface.py): figures, not assertions.

    .venv/bin/python -m benchmarks.compare_surface surface.csv [--config surface.config.json] [--hardware h200]

For each measured (B, q, ctx) it prints the measured forward time, the model's physics for that forward
(`roofline.target_step_time(...).physics_s`: weights + KV vs FLOPs, no host overhead, since the measurement has
no engine around it) uncalibrated, and the model after online calibration (policies/model/calibrate.py) fitted to every
other point, judged on the points it did not see. Summary: median and worst |predicted / measured - 1| of each,
and the fitted scales. The hardware profile is `--hardware`, else the one the CSV's device name matches.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

from policies.model.calibrate import CalibrationConfig, CalibrationState, StepObservation, fit
from policies.model.costmodel import ModelContext
from policies.model.profiles import drafter_for, hardware_by_name, model_from_hf_config
from policies.model.roofline import CostScales, Shape, target_step_time
from policies.types import DraftMethod

T0 = 1_800_000_000.0


def _shape(row: dict[str, str]) -> Shape:
    """The forward one surface row measured."""
    return Shape(
        batch=float(row["batch"]), context_tokens=float(row["context_tokens"]),
        tokens_per_seq=float(row["tokens_per_seq"]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("surface", type=Path)
    parser.add_argument("--config", type=Path, default=None, help="default: <surface>.config.json")
    parser.add_argument("--hardware", default=None, help="catalog profile; default: from the CSV's device name")
    args = parser.parse_args(argv)
    with args.surface.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        print(f"{args.surface}: no measured points", file=sys.stderr)
        return 2
    config = json.loads((args.config or args.surface.with_suffix(".config.json")).read_text(encoding="utf-8"))
    try:
        hardware = hardware_by_name(args.hardware or rows[0]["gpu"])
    except ValueError as exc:
        print(f"{exc} (pass --hardware)", file=sys.stderr)
        return 2
    model = model_from_hf_config(config, name=str(config.get("_name_or_path", "surface-model")))
    ctx = ModelContext(hardware, model, drafter_for(DraftMethod.NGRAM, model))

    def physics(row: dict[str, str], scales: CostScales | None = None) -> float:
        return target_step_time(hardware, model, _shape(row), scales=scales).total_s

    # Online calibration on every other point (as a server's windows would give it), judged on the rest.
    train = rows[::2]
    observations = tuple(
        StepObservation(
            at_s=T0 + i, batch=float(r["batch"]), tokens_per_seq=float(r["tokens_per_seq"]), draft_passes=0,
            context_tokens=float(r["context_tokens"]), prefill_tokens=0.0, step_s=float(r["step_ms"]) * 1e-3,
        )
        for i, r in enumerate(train)
    )
    calibration = CalibrationConfig(max_points=max(64, len(observations)))
    _, fitted = fit(CalibrationState(points=observations), ctx, now_s=T0 + len(train), config=calibration)
    raw_errors: list[float] = []
    fitted_errors: list[float] = []
    print(f"{hardware.name}, {model.name} ({model.params / 1e9:.2f}B params), {len(rows)} points")
    print("    B   q    ctx   measured ms  physics ms   err   calibrated ms   err  (held out)")
    for i, row in enumerate(rows):
        measured = float(row["step_ms"]) * 1e-3
        raw = target_step_time(hardware, model, _shape(row)).physics_s
        calibrated = physics(row, fitted.scales)
        raw_errors.append(raw / measured - 1.0)
        held_out = i % 2 == 1
        if held_out:
            fitted_errors.append(calibrated / measured - 1.0)
        print(
            f"{int(row['batch']):5d} {int(row['tokens_per_seq']):3d} {int(row['context_tokens']):6d}"
            f"  {measured * 1e3:11.3f}  {raw * 1e3:10.3f} {raw / measured - 1:+6.1%}"
            f"  {calibrated * 1e3:13.3f} {calibrated / measured - 1:+6.1%}  {'yes' if held_out else ''}"
        )

    def summary(errors: list[float]) -> str:
        absolute = [abs(e) for e in errors]
        return f"median {statistics.median(absolute):.1%}, worst {max(absolute):.1%} over {len(errors)} points"

    print(f"physics, uncalibrated: {summary(raw_errors)}")
    if fitted_errors:
        print(f"calibrated on {len(train)} points, held-out points: {summary(fitted_errors)}")
    s = fitted.scales
    print(
        f"fitted scales: memory {s.memory:.2f}, compute {s.compute:.2f}, overhead {s.overhead:.2f}, "
        f"per_request {s.per_request:.2f}, fill {s.fill:.2f}, gemm_slope {s.gemm_slope:.2f}; "
        f"fit error {fitted.error_ratio:.1%}" if fitted.error_ratio is not None else "no fit"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
