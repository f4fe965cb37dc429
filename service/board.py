"""The latest results per target: written by the loop, read by the REST API, the exporter and the live view.

Everything runs on one asyncio event loop, and each target's entry is an immutable `BoardEntry` replaced whole,
so a reader never sees half an update. `Board.version` (and `StepTimings.observations`) grow with every write, so
readers that serialise the board (REST bodies, the /metrics page) render once per write and serve the bytes from
then on, instead of re-rendering on every request.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from policies.decide.audit import ControllerAudit
from policies.model.calibrate import CalibrationFit
from policies.model.costmodel import ModelContext
from policies.types import Decision, Evidence
from service.sources.errors import ScrapeErrorReason

# Seconds; spans a sub-millisecond estimate to a scrape that hits its timeout.
STEP_DURATION_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                              2.5, 5.0, 10.0)

# The reason the loop records when evaluating a target raised (a bug of ours), counted beside the scrape reasons.
INTERNAL_ERROR_REASON = "internal"
# Every reason a target's scrape-error count can carry: the exporter starts each at 0 so that the first error is
# an increase Prometheus can see (a series born at 1 has no earlier sample to increase from).
SCRAPE_ERROR_REASONS: tuple[str, ...] = (*(r.value for r in ScrapeErrorReason), INTERNAL_ERROR_REASON)

_EMPTY_COUNTS: Mapping[str, int] = MappingProxyType({})
_EMPTY_COUNTS_F: Mapping[str, float] = MappingProxyType({})
_EMPTY_PROFILES: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class BoardEntry:
    """One target's latest state. `decision` is the latest published one (a stale/error decision keeps the last
    recommendation's enabled/gamma visible); `last_good_decision_s` is when a decision last rested on fresh data.
    """

    target: str
    model: str | None
    evidence: Evidence | None = None
    decision: Decision | None = None
    last_good_scrape_s: float | None = None
    last_good_decision_s: float | None = None
    last_error: str | None = None
    # Saturation from the engine's own roofline counters (vLLM estimated_*_per_gpu) over the hardware peaks:
    # {"tensor_active": achieved FLOP/s / peak, "dram_active": achieved bytes/s / peak bandwidth}.
    engine_activity: Mapping[str, float] = field(default_factory=lambda: _EMPTY_COUNTS_F)
    # The cost model's profiles in use: {"hardware": ..., "model": ..., "drafter": ..., "tensor_parallel": ...}.
    profiles: Mapping[str, str] = field(default_factory=lambda: _EMPTY_PROFILES)
    # The cost model's resolved profiles themselves (what `profiles` names): exact even for a model read from a
    # config.json or a separate draft model, which the names alone cannot rebuild. None until first resolved.
    context: ModelContext | None = None
    # The online calibration the decision priced with (its scales, error and covariance): the one calibration every
    # other reader of this target prices with too (/v1/schedule, the schedule actuator). None until first fitted.
    calibration: CalibrationFit | None = None
    scrape_errors: Mapping[str, int] = field(default_factory=lambda: _EMPTY_COUNTS)
    # The engine's own speculation controller judged against the best static k (policies/decide/audit.py).
    audit: ControllerAudit | None = None


@dataclass(slots=True)
class StepTimings:
    """A cumulative histogram per loop step (gpu, scrape, estimate, advise, publish), for the exporter."""

    buckets_s: tuple[float, ...] = STEP_DURATION_BUCKETS_S
    counts: dict[str, list[int]] = field(default_factory=dict)
    sums_s: dict[str, float] = field(default_factory=dict)
    # Grows by one per observation: a cache key for whoever renders the histogram.
    observations: int = 0

    def observe(self, step: str, duration_s: float) -> None:
        self.observations += 1
        counts = self.counts.setdefault(step, [0] * (len(self.buckets_s) + 1))
        # Non-cumulative bucket counts; the last slot is +Inf. Cumulated when read.
        counts[bisect.bisect_left(self.buckets_s, duration_s)] += 1
        self.sums_s[step] = self.sums_s.get(step, 0.0) + duration_s

    def cumulative(self, step: str) -> list[tuple[str, float]]:
        counts = self.counts.get(step, [0] * (len(self.buckets_s) + 1))
        result: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.buckets_s, float("inf")), counts, strict=True):
            running += count
            result.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return result


@dataclass(frozen=True, slots=True)
class Pricing:
    """What the cost model priced one evaluation with, as published beside it: the engine's saturation ratios over
    the hardware peaks ({"tensor_active": ..., "dram_active": ...}, 0..1), the profile names in use, the resolved
    profiles themselves and the online calibration. A field left None keeps the previously published one."""

    engine_activity: Mapping[str, float] | None = None
    profiles: Mapping[str, str] | None = None
    context: ModelContext | None = None
    calibration: CalibrationFit | None = None
    audit: ControllerAudit | None = None


class Board:
    """Latest results per target, plus loop progress (for /healthz) and step timings (for the exporter)."""

    def __init__(self, targets: Iterable[tuple[str, str | None]], *, started_at_s: float) -> None:
        self._status: dict[str, BoardEntry] = {
            name: BoardEntry(target=name, model=model) for name, model in targets
        }
        self.started_at_s = started_at_s
        self.last_iteration_s: float | None = None
        self.iterations = 0
        self.timings = StepTimings()
        self._version = 0
        self._gpu_errors: dict[tuple[str, str], int] = {}
        self._listener_errors: dict[str, int] = {}

    @property
    def version(self) -> int:
        """Grows on every write to the statuses or the loop progress (not on `timings`, which has its own count).
        Two reads with the same version see the same statuses, `iterations` and `last_iteration_s`.
        """
        return self._version

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(self._status)

    def get(self, target: str) -> BoardEntry | None:
        return self._status.get(target)

    def statuses(self) -> tuple[BoardEntry, ...]:
        return tuple(self._status.values())

    def publish(
        self,
        target: str,
        *,
        evidence: Evidence,
        decision: Decision,
        good_scrape_s: float | None,
        pricing: Pricing = Pricing(),
    ) -> None:
        """Record a finished evaluation; `good_scrape_s` is the time of this tick's scrape when it succeeded.
        The fields of `pricing` left None keep the previous ones."""
        status = self._status[target]
        fresh = good_scrape_s is not None
        engine_activity, profiles = pricing.engine_activity, pricing.profiles
        activity = status.engine_activity if engine_activity is None else MappingProxyType(dict(engine_activity))
        self._status[target] = replace(
            status,
            model=decision.model or evidence.model or status.model,
            evidence=evidence,
            decision=decision,
            last_good_scrape_s=good_scrape_s if fresh else status.last_good_scrape_s,
            last_good_decision_s=decision.evaluated_at_s if fresh else status.last_good_decision_s,
            last_error=None if fresh else status.last_error,
            engine_activity=activity,
            profiles=status.profiles if profiles is None else MappingProxyType(dict(profiles)),
            context=status.context if pricing.context is None else pricing.context,
            calibration=status.calibration if pricing.calibration is None else pricing.calibration,
            audit=status.audit if pricing.audit is None else pricing.audit,
        )
        self._version += 1

    def record_error(self, target: str, reason: str, detail: str) -> None:
        status = self._status[target]
        counts = dict(status.scrape_errors)
        counts[reason] = counts.get(reason, 0) + 1
        self._status[target] = replace(
            status, scrape_errors=MappingProxyType(counts), last_error=f"{reason}: {detail}"
        )
        self._version += 1

    def record_gpu_error(self, source: str, reason: str) -> None:
        """Count one failed GPU telemetry read. `source` is the GpuSnapshot's ("nvml", "dcgm"); `reason` its short
        label (`service.sources.gpu.gpu_error_reason`), from a closed set so it can be a metric label.
        """
        key = (source, reason)
        self._gpu_errors[key] = self._gpu_errors.get(key, 0) + 1
        self._version += 1

    def record_listener_error(self, listener: str) -> None:
        """Count one exception escaping an iteration listener (`service.loop.IterationListener`), by class name."""
        self._listener_errors[listener] = self._listener_errors.get(listener, 0) + 1
        self._version += 1

    @property
    def listener_errors(self) -> Mapping[str, int]:
        """Exceptions that escaped iteration listeners so far, by listener class name (a bug in ours, not input)."""
        return MappingProxyType(self._listener_errors)

    @property
    def gpu_errors(self) -> Mapping[tuple[str, str], int]:
        """Failed GPU telemetry reads so far by (source, reason); GPU telemetry is per sidecar, not per target."""
        return MappingProxyType(self._gpu_errors)

    def finish_iteration(self, now_s: float) -> None:
        self.last_iteration_s = now_s
        self.iterations += 1
        self._version += 1

    def is_ready(self) -> bool:
        """Ready once any target had a good scrape: one dead target must not take the others' advice offline."""
        return any(status.last_good_scrape_s is not None for status in self._status.values())

    def is_live(self, now_s: float, *, stall_after_s: float) -> bool:
        """Live while an iteration finished within `stall_after_s` (counted from start-up before the first one)."""
        last = self.last_iteration_s if self.last_iteration_s is not None else self.started_at_s
        return now_s - last <= stall_after_s
