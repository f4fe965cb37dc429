"""Prometheus exposition of the Board: collectors that build fresh families at scrape time on the sidecar's own
`CollectorRegistry` (never the global one, so tests build a fresh registry and nothing leaks between them).

Naming: one prefix `specadvisor_`, base units in the name, `_ratio` for 0..1 values, `_total` only on counters.
Speedups are plain dimensionless multipliers (they exceed 1), so they carry no unit suffix. Per-target families are
labelled `target` and `model`; the build info and loop timings are the sidecar's own.

The /metrics page is served by `MetricsPage`: everything that is a function of the Board alone is rendered once
per board write (the loop writes about once per interval, Prometheus and dashboards may read far more often), and
only `last_good_scrape_age_seconds`, the one family that moves with the clock, is rendered per request. The age
stays a live gauge (not just a timestamp left to PromQL's `time() - ts`) because alerts and humans read it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from policies.act.deployment import ActuatorError
from policies.act.gate import SkipReason
from policies.decide.audit import AuditVerdict
from policies.types import DataState, WhyCode
from service.actuators.runner import RESULTS, ActuationRunner
from service.actuators.shadow import ShadowActuator
from service.board import SCRAPE_ERROR_REASONS, Board, BoardEntry
from service.http.connection_guard import CLOSE_REASONS

PREFIX = "specadvisor"
_TARGET_LABELS = ("target", "model")


class BoardCollector(Collector):
    """Every family that is a function of the Board alone (all but the scrape age); holds no metric state."""

    def __init__(self, board: Board, *, version: str) -> None:
        self._board = board
        self._version = version

    def describe(self) -> Iterable[Metric]:
        # Nothing to pre-declare: families are built at scrape time, and an empty describe keeps registration
        # from running a collection.
        return ()

    def collect(self) -> Iterator[Metric]:
        statuses = self._board.statuses()
        yield from _build_info(self._version)
        yield from _recommendation(statuses)
        yield from _cost_model(statuses)
        yield from _acceptance(statuses)
        yield from _engine(statuses)
        yield from _controller_audit(statuses)
        yield from _gpu(statuses)
        yield from _freshness(statuses)
        yield from _gpu_errors(self._board)
        yield from _listener_errors(self._board)
        yield from _loop(self._board)


class ScrapeAgeCollector(Collector):
    """`last_good_scrape_age_seconds`: seconds since each target's last good scrape, read off `clock` per scrape."""

    def __init__(self, board: Board, *, clock: Callable[[], float]) -> None:
        self._board = board
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        now_s = self._clock()
        age = _gauge("last_good_scrape_age_seconds", "Seconds since the target's last good scrape.")
        for status in self._board.statuses():
            if status.last_good_scrape_s is not None:
                age.add_metric(_ids(status), max(0.0, now_s - status.last_good_scrape_s))
        yield age


class ActuationCollector(Collector):
    """The actuation runner's families (actions, skips, actuator errors, pause, cooldown), read per scrape: the
    cooldown moves with the clock, and the runner changes outside the board's writes."""

    def __init__(self, runner: ActuationRunner, *, clock: Callable[[], float]) -> None:
        self._runner = runner
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        yield from _actuation(self._runner, self._clock())


class ApiConnectionsCollector(Collector):
    """`api_connections_closed_total`: API connections the server closed before a whole request arrived, by reason
    (service/http/connection_guard.py), read off `closed()` per scrape."""

    def __init__(self, closed: Callable[[], Mapping[str, int]]) -> None:
        self._closed = closed

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        yield from _api_connections(self._closed())


class ShadowCollector(Collector):
    """Shadow mode's scores (policies/act/shadow.py), per target, of the last action evaluated against the load that
    came: `shadow_predicted_gain_ratio` (S(to) / S(from) when it was taken), `shadow_realised_gain_ratio` (the same
    ratio's geometric mean over the payback horizon that followed; absent when no ok tick followed) and
    `shadow_evaluated_actions_total`. Example: predicted 1.40, realised 1.08: it paid, less than promised."""

    def __init__(self, actuators: Mapping[str, ShadowActuator]) -> None:
        self._actuators = actuators

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        predicted = _gauge("shadow_predicted_gain_ratio", "Shadow mode: the last evaluated action's predicted gain, "
                           "S(new) / S(old) when the gate took it.", labels=["target"])
        realised = _gauge("shadow_realised_gain_ratio", "Shadow mode: the last evaluated action's realised gain, "
                          "S(new) / S(old) over the payback horizon that followed, priced at the load that came.",
                          labels=["target"])
        evaluated = CounterMetricFamily(f"{PREFIX}_shadow_evaluated_actions", "Shadow mode: actions evaluated "
                                        "against the load that followed them.", labels=["target"])
        for target, actuator in sorted(self._actuators.items()):
            ledger = actuator.ledger
            evaluated.add_metric([target], float(ledger.evaluated))
            last = ledger.last
            if last is None:
                continue
            if last.action.predicted_gain is not None:
                predicted.add_metric([target], last.action.predicted_gain)
            if last.realised_gain is not None:
                realised.add_metric([target], last.realised_gain)
        yield from (predicted, realised, evaluated)


def build_registry(
    board: Board, *, clock: Callable[[], float], version: str, actuation: ActuationRunner | None = None
) -> CollectorRegistry:
    """A new registry holding the advisor's collectors (no process/platform collectors: the pod has those);
    `actuation` adds the runner's families when acting is enabled."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(board, version=version))
    registry.register(ScrapeAgeCollector(board, clock=clock))
    if actuation is not None:
        registry.register(ActuationCollector(actuation, clock=clock))
    return registry


class MetricsPage:
    """The /metrics body in the Prometheus text format: the board's families rendered once per board write (keyed
    by `Board.version` and `StepTimings.observations`), the scrape age, the actuation and the `live` collectors
    (families that move without a board write) rendered per call.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        board: Board,
        *,
        clock: Callable[[], float],
        version: str,
        actuation: ActuationRunner | None = None,
        live: Iterable[Collector] = (),
    ) -> None:
        self._board = board
        self._board_registry = CollectorRegistry(auto_describe=False)
        self._board_registry.register(BoardCollector(board, version=version))
        self._age_registry = CollectorRegistry(auto_describe=False)
        self._age_registry.register(ScrapeAgeCollector(board, clock=clock))
        if actuation is not None:  # per request, like the age: small, and it moves with the clock
            self._age_registry.register(ActuationCollector(actuation, clock=clock))
        for collector in live:  # families that move without a board write (the API's connections, the lease)
            self._age_registry.register(collector)
        self._key: tuple[int, int] | None = None
        self._board_text = b""

    def render(self) -> bytes:
        key = (self._board.version, self._board.timings.observations)
        if key != self._key:
            self._board_text = generate_latest(self._board_registry)
            self._key = key
        return self._board_text + generate_latest(self._age_registry)


def _gauge(name: str, documentation: str, labels: Iterable[str] = _TARGET_LABELS) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=list(labels))


def _ids(status: BoardEntry) -> list[str]:
    return [status.target, status.model or ""]


def _build_info(version: str) -> Iterator[Metric]:
    info = _gauge("build_info", "Always 1; the sidecar's version as a label.", labels=("version",))
    info.add_metric([version], 1.0)
    yield info


def _recommendation(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    enabled = _gauge("recommended_enabled", "1 when speculative decoding is recommended on, else 0.")
    gamma = _gauge(
        "recommended_num_speculative_tokens", "Recommended number of draft tokens per step (0 when off)."
    )
    speedup = _gauge("expected_speedup", "Predicted throughput multiplier of the recommendation vs plain decoding.")
    speedup_low = _gauge("expected_speedup_low", "Low end of the predicted speedup band.")
    speedup_high = _gauge("expected_speedup_high", "High end of the predicted speedup band.")
    curve = _gauge(
        "predicted_speedup",
        "Predicted speedup vs plain decoding at each gamma (the curve the decision was made on).",
        labels=(*_TARGET_LABELS, "gamma"),
    )
    state = _gauge(
        "decision_state",
        "1 for the recommendation's current state, 0 for the others.",
        labels=(*_TARGET_LABELS, "state"),
    )
    cause = _gauge(
        "decision_cause",
        "1 for each cause the recommendation names (the API's why codes), 0 for the others.",
        labels=(*_TARGET_LABELS, "code"),
    )
    for status in statuses:
        ids = _ids(status)
        decision = status.decision
        current = decision.state if decision is not None else None
        for candidate in DataState:
            state.add_metric([*ids, candidate.value], 1.0 if candidate == current else 0.0)
        named = {why.code for why in decision.why} if decision is not None else set()
        for code in WhyCode:
            cause.add_metric([*ids, code.value], 1.0 if code in named else 0.0)
        if decision is None or status.last_good_scrape_s is None:
            # Before the first good scrape a decision only echoes defaults (off, gamma 0, speedup 1.0): a reader
            # that ignores decision_state would take them for "turn it off". Absent beats a misleading 0.
            continue
        enabled.add_metric(ids, 1.0 if decision.enabled else 0.0)
        gamma.add_metric(ids, float(decision.num_speculative_tokens if decision.enabled else 0))
        speedup.add_metric(ids, decision.expected_speedup)
        speedup_low.add_metric(ids, decision.expected_speedup_low)
        speedup_high.add_metric(ids, decision.expected_speedup_high)
        for point in decision.curve:
            curve.add_metric([*ids, str(point.gamma)], point.speedup)
    yield from (enabled, gamma, speedup, speedup_low, speedup_high, curve, state, cause)


def _cost_model(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    calibration = _gauge(
        "calibration_relative_error_ratio",
        "The cost model's calibration error: median |predicted / observed step time - 1| over recent windows.",
    )
    objective = _gauge(
        "objective_info",
        "Always 1; the objective the predicted speedups measure (latency, capacity, goodput_slo) as a label.",
        labels=(*_TARGET_LABELS, "objective"),
    )
    for status in statuses:
        decision = status.decision
        if decision is None or status.last_good_scrape_s is None:
            continue  # nothing measured yet (see _recommendation)
        ids = _ids(status)
        if decision.calibration_error_ratio is not None:
            calibration.add_metric(ids, decision.calibration_error_ratio)
        if decision.objective:  # "" = no curve evaluated this tick (evidence not ok): no objective applied
            objective.add_metric([*ids, decision.objective], 1.0)
    yield from (calibration, objective)


def _acceptance(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    per_position = _gauge(
        "acceptance_per_position_ratio",
        "P(at least position+1 drafts accepted) per verification over the window; position is 0-based as in vLLM. "
        "Only where the engine counts each position (vLLM, TensorRT-LLM, llama.cpp; SGLang gives the mean alone).",
        labels=(*_TARGET_LABELS, "position"),
    )
    mean_length = _gauge(
        "mean_acceptance_length_tokens", "Tokens emitted per verification (1 + accepted drafts), over the window."
    )
    rate = _gauge("acceptance_rate_ratio", "Accepted draft tokens / proposed draft tokens over the window.")
    for status in statuses:
        acceptance = status.evidence.acceptance if status.evidence is not None else None
        if acceptance is None:
            continue
        ids = _ids(status)
        if acceptance.positions_measured:  # otherwise a fit to the mean, not a measurement
            for position, value in enumerate(acceptance.per_position):
                per_position.add_metric([*ids, str(position)], value)
        mean_length.add_metric(ids, acceptance.mean_acceptance_length)
        rate.add_metric(ids, acceptance.acceptance_rate)
    yield from (per_position, mean_length, rate)


def _controller_audit(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    labels = (*_TARGET_LABELS, "controller")
    gain = _gauge(
        "engine_controller_gain_ratio",
        "Best static k's predicted service over the engine's own speculation controller's (policies/decide/audit.py); "
        "> 1: a static k would serve more.",
        labels=labels,
    )
    gain_low = _gauge("engine_controller_gain_low_ratio", "Low end of the gain's 90% band.", labels=labels)
    worse = _gauge(
        "engine_controller_worse",
        "1 when a static k is measurably better than the engine's speculation controller (the gain's low end clears "
        "1 + the audit's min_gain), 0 when not; absent without a controller or a verdict.",
        labels=labels,
    )
    for status in statuses:
        audit = status.audit
        if audit is None or audit.verdict not in (AuditVerdict.WORSE, AuditVerdict.NOT_WORSE):
            continue
        ids = [*_ids(status), audit.controller]
        if audit.gain_ratio is not None and audit.gain_low_ratio is not None:
            gain.add_metric(ids, audit.gain_ratio)
            gain_low.add_metric(ids, audit.gain_low_ratio)
        worse.add_metric(ids, 1.0 if audit.verdict is AuditVerdict.WORSE else 0.0)
    yield from (gain, gain_low, worse)


def _engine(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    batch = _gauge("batch_requests", "Running requests (continuous batch size), mean over the window.")
    waiting = _gauge("waiting_requests", "Queued requests, mean over the window.")
    deployed_enabled = _gauge("deployed_speculation_enabled", "1 when the engine runs speculative decoding now.")
    deployed_k = _gauge("deployed_num_speculative_tokens", "Draft tokens per step the engine runs now (0 when off).")
    step_time = _gauge("step_time_seconds", "Engine step time (mean inter-token latency) over the window.")
    for status in statuses:
        evidence = status.evidence
        if evidence is None or not evidence.model:
            continue  # nothing measured yet: absent beats a misleading 0
        ids = _ids(status)
        batch.add_metric(ids, evidence.batch)
        waiting.add_metric(ids, evidence.waiting)
        deployed_enabled.add_metric(ids, 1.0 if evidence.speculation_on else 0.0)
        deployed_k.add_metric(ids, float(evidence.deployed_k if evidence.speculation_on else 0))
        if evidence.step_time_s is not None:
            step_time.add_metric(ids, evidence.step_time_s)
    yield from (batch, waiting, deployed_enabled, deployed_k, step_time)


def _gpu(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    utilization = _gauge(
        "gpu_utilization_ratio",
        "GPU activity 0..1 by signal; gpu_util only says a kernel ran, tensor/dram/sm_active measure saturation.",
        labels=(*_TARGET_LABELS, "signal", "source"),
    )
    for status in statuses:
        gpu = status.evidence.gpu if status.evidence is not None else None
        if gpu is None or gpu.source == "absent":
            continue  # the engine's own estimate below still applies
        ids = _ids(status)
        if gpu.gpu_util_ratio is not None:
            utilization.add_metric([*ids, "gpu_util", gpu.source], gpu.gpu_util_ratio)
        activity_source = gpu.activity_source or gpu.source
        for signal, value in (
            ("tensor_active", gpu.tensor_active_ratio),
            ("dram_active", gpu.dram_active_ratio),
            ("sm_active", gpu.sm_active_ratio),
        ):
            if value is not None:
                utilization.add_metric([*ids, signal, activity_source], value)
    for status in statuses:
        for signal, value in sorted(status.engine_activity.items()):
            utilization.add_metric([*_ids(status), signal, "engine"], value)
    yield utilization


def _freshness(statuses: Iterable[BoardEntry]) -> Iterator[Metric]:
    last_good = _gauge("last_good_scrape_timestamp_seconds", "Unix time of the target's last good scrape.")
    errors = CounterMetricFamily(
        f"{PREFIX}_scrape_errors",
        "Failed scrapes by reason (internal = a bug of ours).",
        labels=[*_TARGET_LABELS, "reason"],
    )
    for status in statuses:
        ids = _ids(status)
        if status.last_good_scrape_s is not None:
            last_good.add_metric(ids, status.last_good_scrape_s)
        # Every known reason from 0, so the first error of a kind is an increase(), not a series born at 1.
        counts = {reason: 0 for reason in SCRAPE_ERROR_REASONS} | dict(status.scrape_errors)
        for reason, count in sorted(counts.items()):
            errors.add_metric([*ids, reason], float(count))
    yield from (last_good, errors)


def _gpu_errors(board: Board) -> Iterator[Metric]:
    errors = CounterMetricFamily(
        f"{PREFIX}_gpu_telemetry_errors",
        "Failed GPU telemetry reads by source (nvml, dcgm) and reason (nvml_error, unexpected, or the DCGM scrape "
        "reason); the advisor keeps working from the engine's metrics meanwhile.",
        labels=["source", "reason"],
    )
    for (source, reason), count in sorted(board.gpu_errors.items()):
        errors.add_metric([source, reason], float(count))
    yield errors


def _loop(board: Board) -> Iterator[Metric]:
    iterations = CounterMetricFamily(f"{PREFIX}_loop_iterations", "Finished loop iterations.", labels=[])
    iterations.add_metric([], float(board.iterations))
    yield iterations
    if board.last_iteration_s is not None:
        last = _gauge("last_iteration_timestamp_seconds", "Unix time the last loop iteration finished.", labels=())
        last.add_metric([], board.last_iteration_s)
        yield last
    steps = HistogramMetricFamily(
        f"{PREFIX}_loop_step_duration_seconds", "Duration of each loop step.", labels=["step"]
    )
    timings = board.timings
    for step in sorted(timings.counts):
        steps.add_metric([step], buckets=timings.cumulative(step), sum_value=timings.sums_s.get(step, 0.0))
    yield steps


def _listener_errors(board: Board) -> Iterator[Metric]:
    errors = CounterMetricFamily(
        f"{PREFIX}_listener_errors",
        "Exceptions that escaped an iteration listener (e.g. the actuation runner), by listener: a bug of ours; "
        "the advisor kept advising.",
        labels=["listener"],
    )
    for listener, count in sorted(board.listener_errors.items()):
        errors.add_metric([listener], float(count))
    yield errors


def _actuation(runner: ActuationRunner, now_s: float) -> Iterator[Metric]:
    actions = CounterMetricFamily(
        f"{PREFIX}_actions", "Actions taken on a deployment by result (applied, dry_run, failed).",
        labels=["target", "mode", "result"],
    )
    skipped = CounterMetricFamily(
        f"{PREFIX}_actions_skipped", "Ticks on which the safety gate held an action back, by reason.",
        labels=["target", "reason"],
    )
    errors = CounterMetricFamily(
        f"{PREFIX}_actuator_errors", "Failed reads or patches of the managed object, by reason.",
        labels=["target", "reason"],
    )
    paused = _gauge("actuation_paused", "1 while acting on the target is paused by an operator.", labels=("target",))
    override = _gauge(
        "actuation_override_active", "1 while a manual override is in force on the target.", labels=("target",)
    )
    cooldown = _gauge(
        "actuation_cooldown_remaining_seconds", "Seconds until the cooldown allows the next action.",
        labels=("target",),
    )
    dry_run = _gauge("actuation_dry_run", "1 when actions are computed and logged but not sent.", labels=("target",))
    for status in runner.statuses(now_s):
        target = status.target
        for result in RESULTS:  # every label from 0: the first failure is an increase(), not a new series
            actions.add_metric([target, status.mode, result], float(status.actions.get(result, 0)))
        for reason in SkipReason:
            skipped.add_metric([target, reason.value], float(status.skipped.get(reason.value, 0)))
        for error in ActuatorError:
            errors.add_metric([target, error.value], float(status.errors.get(error.value, 0)))
        paused.add_metric([target], 1.0 if status.paused else 0.0)
        override.add_metric([target], 1.0 if status.override is not None else 0.0)
        cooldown.add_metric([target], status.cooldown_remaining_s)
        dry_run.add_metric([target], 1.0 if status.dry_run else 0.0)
    audit_errors = CounterMetricFamily(
        f"{PREFIX}_audit_write_errors", "Audit log records that could not be written (disk full, I/O error).",
        labels=[],
    )
    audit_errors.add_metric([], float(runner.audit_errors))
    yield from (actions, skipped, errors, paused, override, cooldown, dry_run, audit_errors)


def _api_connections(closed: Mapping[str, int]) -> Iterator[Metric]:
    family = CounterMetricFamily(
        f"{PREFIX}_api_connections_closed",
        "API connections the server closed before a whole request arrived, by reason: read_timeout (the request "
        "was not in within api_request_read_timeout_s), over_limit (api_max_connections were open already).",
        labels=["reason"],
    )
    # Every reason from 0, so the first close of a kind is an increase(), not a series born at 1.
    counts: dict[str, int] = dict.fromkeys(CLOSE_REASONS, 0)
    counts.update(closed)
    for reason, count in sorted(counts.items()):
        family.add_metric([reason], float(count))
    yield family
