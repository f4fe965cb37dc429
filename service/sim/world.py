"""The simulated world: one vLLM engine doing continuous batching with speculative decoding, in simulated time.

This is the ground truth the advisor is graded against, so it imports nothing of the advisor's. This module is
the batching state machine; what things cost and how the random processes behave (step and draft times, the
acceptance process, the arrival rate, request lengths) are pure functions of the scenario in `physics.py`, which
it delegates to. What it models:

- Poisson arrivals with a periodic piecewise-linear rate (thinning), a FIFO waiting queue, admission up to
  `max_num_seqs` and the KV cache (draft tokens reserve KV slots), recompute preemption when the cache overflows,
  chunked prefill sharing each step's token budget with decode.
- Per engine step every decoding request is verified once: the drafter proposes up to k tokens (n-gram/suffix
  lookups may propose fewer, or nothing), a prefix of them is accepted position by position with the scenario's
  conditional probabilities, and the request emits accepted + 1 tokens.
- Step time from the hardware truth at the step's token count and context, plus the drafter's own cost, with jitter.

Speed: steps are simulated in groups of up to `simulation.quantum_s` during which the batch is fixed (admission
and preemption happen at group boundaries); per group the acceptance counts are drawn in aggregate (a chain of
binomials), so the cost per group is O(batch + steps + k) and a simulated hour takes seconds.

Determinism: the state depends only on the scenario, the seed and the times of `set_speculation` calls, never on
how `advance_to` calls partition time: a group is planned once at its start and committed only when the clock has
passed its end, and arrivals come from their own random stream.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass

from service.sim.dcgm_exposition import DcgmGauges, render_dcgm
from service.sim.exposition import CacheConfig, EngineGauges, EngineMetrics, render_exposition
from service.sim.physics import (
    acceptance_at,
    arrival_rate_at,
    class_acceptance,
    draft_time_s,
    draw_length,
    draw_verifications,
    expected_proposed_tokens,
    expected_step_time_s,
    expected_tokens_per_verification,
    forward_flops,
    forward_read_bytes,
    mean_tokens_per_verification,
    mixed_step_time_s,
    peak_arrival_rate,
    request_classes,
    step_jitter,
    target_step_time_s,
    verified_tokens_per_request,
)
from service.sim.scenario import MAX_SPECULATIVE_TOKENS, Scenario

DCGM_WINDOW_S = 10.0  # dcgm-exporter's ratios are averages over its collection interval; ours over this window
_GPU_LOG_S = 60.0  # how much of the GPU's history the log keeps (more than any window asked)

# The physics functions were first defined here; callers import them from either module.
__all__ = [
    "Completion",
    "EngineUnavailableError",
    "LifetimeStats",
    "World",
    "acceptance_at",
    "arrival_rate_at",
    "draft_time_s",
    "expected_proposed_tokens",
    "expected_step_time_s",
    "expected_tokens_per_verification",
    "target_step_time_s",
]


class EngineUnavailableError(RuntimeError):
    """The engine is restarting (speculation was reconfigured): it serves nothing until `serving_at_s`."""

    def __init__(self, serving_at_s: float) -> None:
        super().__init__(f"engine restarting; serving again at t={serving_at_s:.3f}s")
        self.serving_at_s = serving_at_s


@dataclass(frozen=True, slots=True)
class LifetimeStats:
    """Totals across restarts (the exposed counters reset; these do not). For benchmarks and the live view."""

    completed_requests: int
    generated_tokens: int
    lost_requests: int
    preemptions: int
    lost_tokens: int = 0  # output tokens the lost requests asked for (their max_tokens)


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished request, as its client saw it (recorded only with `World(record_completions=True)`), or with
    `complete=False` one still in flight, as far as it got (`World.in_flight`).

    Times are the world's simulated seconds; `output_tokens` counts every token the request received; for a
    request in flight `done_s` is when it was looked at and `first_token_s` is -1 before its first token.
    """

    arrival_s: float
    first_token_s: float
    done_s: float
    output_tokens: int
    complete: bool = True


@dataclass(slots=True)
class _Request:
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    prefill_left: int  # tokens still to compute before decoding (the whole context again after a preemption)
    generated: int = 0
    scheduled_s: float = -1.0
    first_token_s: float = -1.0
    preemptions: int = 0
    request_class: int = 0  # how well the drafter predicts it (physics.request_classes)


def _decodes(request: _Request) -> bool:
    """Whether `request` decodes in the next step: its prompt (after a preemption, its whole context) is computed."""
    return request.prefill_left == 0


@dataclass(frozen=True, slots=True)
class _GroupPlan:
    start_s: float
    step_s: tuple[float, ...]
    decode: tuple[_Request, ...]
    prefill: tuple[_Request, ...]
    prefill_per_step: tuple[int, ...]
    kv_tokens_read: float  # cached tokens every step reads
    decode_ctx: float  # mean context of a decoding request
    prefill_ctx: float  # mean context a prefill token attends to
    k: int  # draft tokens per decoding request in this group (0 when disabled by batch size)

    @property
    def end_s(self) -> float:
        return self.start_s + sum(self.step_s)


# ----------------------------------------------------------------------------------------------------------------
# The world
# ----------------------------------------------------------------------------------------------------------------


class World:
    """A simulated vLLM engine and its clients, advanced lazily in simulated time."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int = 0,
        start_s: float,
        disable_by_batch_size: int | None = None,
        record_completions: bool = False,
    ) -> None:
        """`disable_by_batch_size`: like vLLM's old `speculative_disable_by_batch_size`, steps with at least this
        many running requests run without drafts (an engine-native rule: no restart); None = never.
        `record_completions`: keep every finished request for `drain_completions` (benchmarks; off by default so
        a long-running demo does not grow a list)."""
        if disable_by_batch_size is not None and disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1, got {disable_by_batch_size}")
        self._disable_by_batch_size = disable_by_batch_size
        self._completions: list[Completion] | None = [] if record_completions else None
        self._scenario = scenario
        self._start_s = start_s
        self._now_s = start_s
        self._t_engine = start_s
        self._engine_rng = random.Random(f"sim-engine/{scenario.seed}/{seed}")
        self._arrival_rng = random.Random(f"sim-arrivals/{scenario.seed}/{seed}")
        self._rate_max = peak_arrival_rate(scenario)
        self._next_arrival_s = start_s
        self._draw_next_arrival()
        limits = scenario.engine
        self._num_blocks = limits.kv_capacity_tokens // limits.block_size
        self._cache = CacheConfig(
            block_size=limits.block_size,
            num_gpu_blocks=self._num_blocks,
            kv_cache_memory_bytes=round(self._num_blocks * limits.block_size * scenario.model.kv_bytes_per_token),
            max_model_len=limits.max_model_len,
        )
        self._k = scenario.drafter.num_speculative_tokens
        # The k engine steps run with: the configured k, except during a rolling update (see set_speculation).
        self._run_k = self._k
        # Share of seq slots and KV blocks in service: below 1 while a rolling update has a replica down.
        self._capacity_ratio = 1.0
        self._rollout: deque[tuple[float, str]] = deque()  # (time, event) of a rolling update under way
        self._metrics = EngineMetrics.fresh(
            created_s=start_s, num_speculative_tokens=self._k, max_model_len=limits.max_model_len
        )
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._plan: _GroupPlan | None = None
        self._last_steps = 1
        self._kv_usage = 0.0
        self._down_until_s: float | None = None
        self._completed = 0
        self._generated = 0
        self._lost = 0
        self._lost_tokens = 0
        self._preemptions = 0
        # The GPU's own view (what dcgm-exporter reports): bytes moved, FLOPs and seconds busy, target and drafter,
        # kept across engine restarts (the device stays), logged at each advance for trailing-window ratios.
        self._gpu_bytes = 0.0
        self._gpu_flops = 0.0
        self._gpu_busy_s = 0.0
        self._gpu_log: deque[tuple[float, float, float, float]] = deque([(start_s, 0.0, 0.0, 0.0)])

    # -- read-only views --------------------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._scenario.model_name

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def now_s(self) -> float:
        """The simulated time the world has been advanced to."""
        return self._now_s

    @property
    def num_speculative_tokens(self) -> int:
        """Configured k (0 = off); after set_speculation, the new k even while the restart is under way."""
        return self._k

    @property
    def serving(self) -> bool:
        return self._down_until_s is None

    @property
    def rolling_update_remaining_s(self) -> float:
        """Seconds until a rolling update under way has every replica on the configured k; 0.0 when none is."""
        return max(0.0, self._rollout[-1][0] - self._now_s) if self._rollout else 0.0

    @property
    def restart_remaining_s(self) -> float:
        return 0.0 if self._down_until_s is None else max(0.0, self._down_until_s - self._now_s)

    @property
    def arrival_rate_per_s(self) -> float:
        return arrival_rate_at(self._scenario, self._now_s - self._start_s)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_decoding(self) -> int:
        """Running requests whose prompt is computed: the sequences the next step verifies (the running count less
        those still prefilling, whose chunks the step computes instead)."""
        return sum(1 for r in self._running if _decodes(r))

    @property
    def mean_decode_context_tokens(self) -> float:
        """Mean context (prompt + generated tokens) of the decoding requests now; 0.0 when none decode."""
        contexts = [r.prompt_tokens + r.generated for r in self._running if _decodes(r)]
        return sum(contexts) / len(contexts) if contexts else 0.0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage_ratio(self) -> float:
        return self._kv_usage

    @property
    def mean_context_tokens(self) -> float:
        """Mean context (prompt + generated tokens) of the running requests now; 0.0 when none run."""
        if not self._running:
            return 0.0
        return sum(r.prompt_tokens + r.generated for r in self._running) / len(self._running)

    def drain_completions(self) -> tuple[Completion, ...]:
        """The requests finished since the last call (empty unless built with `record_completions=True`)."""
        if not self._completions:
            return ()
        done = tuple(self._completions)
        self._completions.clear()
        return done

    def undrained_completions(self) -> tuple[Completion, ...]:
        """The requests finished since the last `drain_completions`, left in place (empty unless recording)."""
        return tuple(self._completions or ())

    def in_flight(self) -> tuple[Completion, ...]:
        """The requests admitted and not finished now (running, or waiting after a preemption or in the queue), as
        far as their clients got: `complete=False`, `done_s` = now. Tokens of a step group still under way are
        not in them yet (they arrive when the group ends)."""
        requests = [*self._running, *self._waiting]
        return tuple(
            Completion(arrival_s=r.arrival_s, first_token_s=r.first_token_s, done_s=self._now_s,
                       output_tokens=r.generated, complete=False)
            for r in sorted(requests, key=lambda r: r.arrival_s)
        )

    @property
    def conditional_acceptance(self) -> tuple[float, ...]:
        """True conditional acceptance per position now, for positions 0..max(k, profile length)-1."""
        d = self._scenario.drafter
        width = max(self._k, self._run_k, len(d.conditional_acceptance), len(d.conditional_acceptance_drift_to or ()))
        return acceptance_at(self._scenario, self._now_s - self._start_s, width)

    @property
    def lifetime(self) -> LifetimeStats:
        return LifetimeStats(
            completed_requests=self._completed,
            generated_tokens=self._generated,
            lost_requests=self._lost,
            lost_tokens=self._lost_tokens,
            preemptions=self._preemptions,
        )

    def exposition(self) -> str:
        """The engine's `/metrics` page (vLLM 0.32 format) at the current time; raises while restarting."""
        if self._down_until_s is not None:
            raise EngineUnavailableError(self._down_until_s)
        gauges = EngineGauges(
            num_running=len(self._running), num_waiting=len(self._waiting), kv_cache_usage_ratio=self._kv_usage
        )
        return render_exposition(self._metrics, gauges, model_name=self.model_name, cache=self._cache)

    # -- control ----------------------------------------------------------------------------------------------

    def set_speculation(self, k: int, *, now_s: float) -> None:
        """Reconfigure to k draft tokens (0 = off) at `now_s`, paying what the scenario's `engine.reconfigure` says.

        restart: in-flight requests are dropped, nothing is served for `restart_delay_s`, then the engine starts
        with zeroed counters. rolling (replicas N >= 2): replica j restarts at now + j x restart_delay_s, j = 0..N-1;
        while one is down, seq slots and KV blocks drop by 1/N and its in-flight share (1/N of the requests) is
        dropped when it goes down. The average replica simulated here runs the new k once more than half the
        replicas do, and its counters reset then (the scraped replica restarted); `/metrics` keeps answering.
        Events apply at the first group boundary at or after their time (groups span <= `simulation.quantum_s`).
        Asking for the k already configured does nothing (no restart, and a restart under way is not prolonged);
        a new k during a rolling update starts a new rollout from `now_s`."""
        if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 0..{MAX_SPECULATIVE_TOKENS}, got {k}")
        self.advance_to(now_s)
        if k == self._k:
            return  # already running it, or a restart to it is already under way (a retried rollout)
        engine = self._scenario.engine
        if engine.reconfigure == "rolling" and self._down_until_s is None:
            n, delay = engine.replicas, engine.restart_delay_s
            self._k = k
            events = [(self._now_s + j * delay, "replica-down") for j in range(n)]
            events.append((self._now_s + (n // 2 + 1) * delay, "switch-k"))
            events.append((self._now_s + n * delay, "done"))
            self._rollout = deque(sorted(events, key=lambda e: e[0]))
            return
        self._count_lost((*self._running, *self._waiting))
        self._running.clear()
        self._waiting.clear()
        self._plan = None
        self._kv_usage = 0.0
        self._k = self._run_k = k
        self._rollout.clear()
        self._capacity_ratio = 1.0
        self._down_until_s = self._now_s + self._scenario.engine.restart_delay_s
        self.advance_to(self._now_s)

    def advance_to(self, t_s: float) -> None:
        """Run the world up to simulated time `t_s` (earlier times are ignored: time only moves forward)."""
        self._advance(t_s)
        log = self._gpu_log
        if self._now_s > log[-1][0]:
            log.append((self._now_s, self._gpu_bytes, self._gpu_flops, self._gpu_busy_s))
        while len(log) > 2 and log[1][0] <= self._now_s - _GPU_LOG_S:
            log.popleft()

    def dcgm_exposition(self) -> str:
        """What a dcgm-exporter next to this engine would serve (its `/metrics` page): the PROF activity ratios over
        the last `DCGM_WINDOW_S` seconds (DRAM: bytes moved / (peak bandwidth x window), tensor: FLOPs / (peak FLOP/s
        x window), both <= the achieved ratios of the scenario's hardware; SM and GPU_UTIL: the share of the window
        the engine was running steps), and the framebuffer (weights + the KV cache in use)."""
        log, now = self._gpu_log, self._now_s
        # From the last reading at least a window back (the world advances in jumps between requests), else the
        # oldest kept: an average over at least the window wherever the history allows.
        start = next((entry for entry in reversed(log) if entry[0] <= now - DCGM_WINDOW_S), log[0])
        end = log[-1]
        span = end[0] - start[0]
        hw = self._scenario.hardware

        def share(delta: float, per_s: float) -> float:
            return min(1.0, max(0.0, delta / (per_s * span))) if span > 0 else 0.0

        weights = self._scenario.model.weight_bytes + self._scenario.drafter.draft_weight_bytes
        kv_total = self._cache.kv_cache_memory_bytes
        return render_dcgm(
            DcgmGauges(
                dram_active=share(end[1] - start[1], hw.memory_bandwidth_bytes_per_s),
                tensor_active=share(end[2] - start[2], hw.dense_flops_per_s),
                busy=share(end[3] - start[3], 1.0),
                fb_used_bytes=weights + self._kv_usage * kv_total,
                fb_total_bytes=max(weights + kv_total, 1.0) / 0.9,  # vLLM's default gpu_memory_utilization
            ),
            model_name=hw.name,
        )

    def _advance(self, t_s: float) -> None:
        self._now_s = max(self._now_s, t_s)
        t_s = self._now_s
        while True:
            if self._down_until_s is not None:
                up_at = self._down_until_s
                self._drop_arrivals_until(min(up_at, t_s))
                if up_at > t_s:
                    return
                self._come_up(up_at)
                continue
            if self._plan is None:
                self._apply_rollout_until(self._t_engine)
                self._enqueue_arrivals_until(self._t_engine)
                if not self._running and not self._waiting:
                    idle_until = min(self._next_arrival_s, self._rollout[0][0]) if self._rollout else (
                        self._next_arrival_s
                    )
                    if idle_until > t_s:
                        return
                    self._t_engine = max(self._t_engine, idle_until)
                    if idle_until < self._next_arrival_s:
                        self._apply_rollout_until(self._t_engine)
                    continue
                self._plan = self._plan_group(self._t_engine)
            if self._plan.end_s > t_s:
                return
            self._commit(self._plan)
            self._t_engine = self._plan.end_s
            self._plan = None

    # -- arrivals ---------------------------------------------------------------------------------------------

    def _draw_next_arrival(self) -> None:
        if self._rate_max <= 0.0:
            self._next_arrival_s = math.inf
            return
        rng, t = self._arrival_rng, self._next_arrival_s
        while True:  # thinning: candidates at the peak rate, kept with probability rate(t)/peak
            t += rng.expovariate(self._rate_max)
            if rng.random() * self._rate_max < arrival_rate_at(self._scenario, t - self._start_s):
                self._next_arrival_s = t
                return

    def _pop_arrival(self) -> _Request:
        w = self._scenario.workload
        prompt = draw_length(self._arrival_rng, w.prompt_tokens)
        request = _Request(
            arrival_s=self._next_arrival_s,
            prompt_tokens=prompt,
            max_tokens=draw_length(self._arrival_rng, w.output_tokens),
            prefill_left=prompt,
        )
        classes = request_classes(self._scenario.drafter)
        if classes > 1:  # drawn only then: worlds of alike requests keep their random streams
            request.request_class = self._arrival_rng.randrange(classes)
        self._draw_next_arrival()
        return request

    def _enqueue_arrivals_until(self, t_s: float) -> None:
        while self._next_arrival_s <= t_s:
            self._waiting.append(self._pop_arrival())

    def _drop_arrivals_until(self, t_s: float) -> None:
        # Clients of a restarting server get connection errors: those requests are lost, not queued.
        while self._next_arrival_s <= t_s:
            self._count_lost((self._pop_arrival(),))

    def _count_lost(self, requests: tuple[_Request, ...]) -> None:
        """Requests whose clients got an error: counted, with the output tokens they asked for."""
        self._lost += len(requests)
        self._lost_tokens += sum(r.max_tokens for r in requests)

    def _come_up(self, up_at: float) -> None:
        self._down_until_s = None
        self._t_engine = up_at
        self._last_steps = 1
        self._metrics = EngineMetrics.fresh(
            created_s=up_at, num_speculative_tokens=self._k, max_model_len=self._scenario.engine.max_model_len
        )

    def _apply_rollout_until(self, t_s: float) -> None:
        """Apply the rolling-update events due by `t_s` (called at group boundaries only, so no planned group
        loses requests it already holds)."""
        n = self._scenario.engine.replicas
        while self._rollout and self._rollout[0][0] <= t_s:
            at, event = self._rollout.popleft()
            if event == "replica-down":
                self._capacity_ratio = (n - 1) / n
                # The restarting replica's share of the requests: every n-th one, its clients get errors.
                gone = self._running[::n]
                self._running = [r for i, r in enumerate(self._running) if i % n]
                queued = list(self._waiting)
                self._waiting = deque(r for i, r in enumerate(queued) if i % n)
                self._count_lost((*gone, *queued[::n]))
            elif event == "switch-k":
                self._run_k = self._k
                self._last_steps = 1
                self._metrics = EngineMetrics.fresh(
                    created_s=at, num_speculative_tokens=self._k, max_model_len=self._scenario.engine.max_model_len
                )
            else:
                self._capacity_ratio = 1.0

    def _blocks_in_service(self) -> int:
        return max(1, math.floor(self._num_blocks * self._capacity_ratio))

    # -- scheduling -------------------------------------------------------------------------------------------

    def _preempt(self, request: _Request) -> None:
        # vLLM V1 preempts by recompute: the KV is freed and the whole context is prefilled again later.
        request.prefill_left = request.prompt_tokens + request.generated
        request.preemptions += 1
        self._metrics.num_preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(request)

    def _schedule(self, t0: float) -> None:
        limits, k, bs = self._scenario.engine, self._run_k, self._scenario.engine.block_size
        num_blocks = self._blocks_in_service()
        max_seqs = max(1, math.floor(limits.max_num_seqs * self._capacity_ratio))
        acceptance = acceptance_at(self._scenario, t0 - self._start_s, k)
        # Like vLLM: admit on the blocks a request needs now (its context plus k lookahead slots), and preempt the
        # newest requests when the running ones would outgrow the cache during the coming group.
        growth = math.ceil(self._last_steps * mean_tokens_per_verification(self._scenario.drafter, k, acceptance))
        projected = [(r.prompt_tokens + r.generated + growth + k + bs - 1) // bs for r in self._running]
        total = sum(projected)
        while (total > num_blocks or len(self._running) > max_seqs) and len(self._running) > 1:
            total -= projected.pop()
            self._preempt(self._running.pop())
        used = sum((r.prompt_tokens + r.generated + k + bs - 1) // bs for r in self._running)
        pending = sum(r.prefill_left for r in self._running)
        budget = limits.max_num_batched_tokens * self._last_steps
        while self._waiting and len(self._running) < max_seqs and pending < budget:
            candidate = self._waiting[0]
            blocks = (candidate.prompt_tokens + candidate.generated + k + bs - 1) // bs
            if used + blocks > num_blocks:
                break
            self._waiting.popleft()
            self._running.append(candidate)
            used += blocks
            pending += candidate.prefill_left
            if candidate.scheduled_s < 0:
                candidate.scheduled_s = t0

    def _plan_group(self, t0: float) -> _GroupPlan:
        self._schedule(t0)
        s, rng = self._scenario, self._engine_rng
        k = self._run_k
        if self._disable_by_batch_size is not None and len(self._running) >= self._disable_by_batch_size:
            k = 0  # KV lookahead slots stay reserved for the configured k (as admitted in _schedule)
        decode_list: list[_Request] = []
        prefill_list: list[_Request] = []
        decode_kv = prefill_kv = prefill_full = pending = 0
        for r in self._running:
            if _decodes(r):
                decode_list.append(r)
                decode_kv += r.prompt_tokens + r.generated
            else:
                prefill_list.append(r)
                prefill_kv += r.prompt_tokens + r.generated - r.prefill_left
                prefill_full += r.prompt_tokens + r.generated
                pending += r.prefill_left
        decode, prefill = tuple(decode_list), tuple(prefill_list)
        decode_tokens = len(decode) * verified_tokens_per_request(s.drafter, k)
        kv_read = float(decode_kv + prefill_kv)
        decode_ctx = decode_kv / len(decode) if decode else 0.0
        # A prefill token attends on average to about half of its request's full context.
        prefill_ctx = prefill_full / (2 * len(prefill)) if prefill else 0.0
        spare = max(s.engine.max_num_batched_tokens - round(decode_tokens), s.engine.block_size)
        draft_s = draft_time_s(s, num_seqs=len(decode), num_speculative_tokens=k)

        def step_time(prefill_tokens: int) -> float:
            target_s = mixed_step_time_s(
                s,
                decode_tokens=decode_tokens,
                decode_ctx=decode_ctx,
                prefill_tokens=prefill_tokens,
                prefill_ctx=prefill_ctx,
                kv_tokens_read=kv_read,
            )
            return target_s + draft_s

        first = min(pending, spare)
        n = max(1, min(s.simulation.max_steps_per_group, int(s.simulation.quantum_s / step_time(first))))
        chunks: list[int] = []
        times: list[float] = []
        sigma = s.hardware.jitter_ratio
        for _ in range(n):
            chunk = min(pending, spare)
            pending -= chunk
            chunks.append(chunk)
            times.append(step_time(chunk) * step_jitter(rng, sigma))
        return _GroupPlan(
            start_s=t0,
            step_s=tuple(times),
            decode=decode,
            prefill=prefill,
            prefill_per_step=tuple(chunks),
            kv_tokens_read=kv_read,
            decode_ctx=decode_ctx,
            prefill_ctx=prefill_ctx,
            k=k,
        )

    # -- executing a group ------------------------------------------------------------------------------------

    def _commit(self, plan: _GroupPlan) -> None:
        s, k = self._scenario, plan.k
        n = len(plan.step_s)
        ends: list[float] = []
        t = plan.start_s
        for dt in plan.step_s:
            t += dt
            ends.append(t)
        acceptance = acceptance_at(s, (plan.start_s + t) / 2 - self._start_s, k)

        # Requests progress at their class's expected rate (to place their finishing step); the acceptance counters
        # are drawn in aggregate over each class's verifications and its steady requests share what its finishers
        # did not use. vLLM's counters are the sum over the classes.
        finished: list[tuple[_Request, float]] = []
        finishing_at = [0] * n
        emitted = 0
        for request_class in range(request_classes(s.drafter)):
            members = [r for r in plan.decode if r.request_class == request_class]
            if not members:
                continue
            own = class_acceptance(s.drafter, acceptance, request_class)
            rate = expected_tokens_per_verification(s.drafter, k, own)
            steady: list[_Request] = []
            verifications = used_by_finishers = 0
            for r in members:
                remaining = r.max_tokens - r.generated
                steps = max(1, math.ceil(remaining / rate))
                if steps <= n:
                    verifications += steps
                    used_by_finishers += max(0, remaining - steps)
                    finishing_at[steps - 1] += 1
                    emitted += remaining
                    r.generated = r.max_tokens
                    finished.append((r, ends[steps - 1]))
                else:
                    verifications += n
                    steady.append(r)
            accepted = self._count_verifications(verifications, own, k=k)
            emitted += self._emit_steady(steady, n, max(0, accepted - used_by_finishers))
        self._observe_steps(plan, finishing_at)
        emitted += self._run_prefill(plan, ends, finished)

        self._metrics.generation_tokens += emitted
        self._generated += emitted
        for r, done_s in finished:
            self._finish(r, done_s)
        if finished:
            gone = {id(r) for r, _ in finished}
            self._running = [r for r in self._running if id(r) not in gone]
        self._last_steps = n
        bs, reserved = s.engine.block_size, self._run_k
        held = sum(
            (r.prompt_tokens + r.generated - r.prefill_left + (reserved if r.prefill_left == 0 else 0) + bs - 1)
            // bs
            for r in self._running
        )
        self._kv_usage = min(1.0, held / self._num_blocks)

    def _count_verifications(self, verifications: int, acceptance: tuple[float, ...], *, k: int) -> int:
        """Draw the spec-decode counters for `verifications` request-verifications; return accepted drafts."""
        m = self._metrics
        if k == 0 or verifications == 0:
            return 0
        draw = draw_verifications(
            self._engine_rng, self._scenario.drafter, k=k, verifications=verifications, acceptance=acceptance
        )
        m.spec_drafts += draw.drafts
        m.spec_draft_tokens += draw.draft_tokens
        for i, count in enumerate(draw.accepted_per_pos):
            m.spec_accepted_per_pos[i] += count
        m.spec_accepted_tokens += draw.accepted
        return draw.accepted

    def _emit_steady(self, steady: list[_Request], steps: int, accepted: int) -> int:
        if not steady:
            return 0
        share, extra = divmod(accepted, len(steady))
        offset = self._engine_rng.randrange(len(steady)) if extra else 0
        total = 0
        for i, r in enumerate(steady):
            bonus = 1 if (i - offset) % len(steady) < extra else 0
            # Never finish here: a request that the expected rate says runs on stays running this group.
            tokens = min(steps + share + bonus, r.max_tokens - r.generated - 1)
            r.generated += tokens
            total += tokens
        return total

    def _observe_steps(self, plan: _GroupPlan, finishing_at: list[int]) -> None:
        s, m = self._scenario, self._metrics
        itl = m.histogram("vllm:inter_token_latency_seconds")
        iteration = m.histogram("vllm:iteration_tokens_total")
        q = verified_tokens_per_request(s.drafter, plan.k)
        kv_bytes = s.model.kv_bytes_per_token
        active = len(plan.decode)
        for j, step_s in enumerate(plan.step_s):
            # One inter-token observation per decoding request per step, as vLLM records it.
            itl.observe(step_s, active)
            chunk = plan.prefill_per_step[j]
            tokens = round(active * q) + chunk
            if tokens > 0:
                iteration.observe(tokens)
            pairs = active * q * plan.decode_ctx + chunk * plan.prefill_ctx
            flops = forward_flops(s, tokens=tokens, attention_pairs=pairs)
            read = forward_read_bytes(s, kv_tokens_read=plan.kv_tokens_read, tokens=tokens)
            m.estimated_flops += flops
            m.estimated_read_bytes += read
            m.estimated_write_bytes += kv_bytes * tokens
            # The device also runs the k draft passes (their weights once a pass, their math per request).
            self._gpu_bytes += read + plan.k * s.drafter.draft_weight_bytes
            self._gpu_flops += flops + 2.0 * s.drafter.draft_active_params * active * plan.k
            self._gpu_busy_s += step_s
            active -= finishing_at[j]

    def _run_prefill(self, plan: _GroupPlan, ends: list[float], finished: list[tuple[_Request, float]]) -> int:
        """Process prefill chunks in admission order; a completed prefill emits that request's next token."""
        capacity: list[int] = []
        total = 0
        for chunk in plan.prefill_per_step:
            total += chunk
            capacity.append(total)
        consumed = emitted = 0
        m = self._metrics
        for r in plan.prefill:
            if consumed >= total:
                break
            start = consumed
            consumed += r.prefill_left
            if consumed > total:
                r.prefill_left -= total - start
                break
            done_s = ends[bisect.bisect_left(capacity, consumed)]
            r.prefill_left = 0
            if r.first_token_s < 0:
                r.first_token_s = done_s
                m.prompt_tokens += r.prompt_tokens
                m.histogram("vllm:time_to_first_token_seconds").observe(done_s - r.arrival_s)
            r.generated += 1
            emitted += 1
            if r.generated >= r.max_tokens:
                finished.append((r, done_s))
        return emitted

    def _finish(self, r: _Request, done_s: float) -> None:
        m = self._metrics
        h = m.histogram
        m.success_by_reason["length"] += 1
        h("vllm:e2e_request_latency_seconds").observe(done_s - r.arrival_s)
        h("vllm:request_queue_time_seconds").observe(r.scheduled_s - r.arrival_s)
        h("vllm:request_inference_time_seconds").observe(done_s - r.scheduled_s)
        h("vllm:request_prefill_time_seconds").observe(r.first_token_s - r.scheduled_s)
        h("vllm:request_decode_time_seconds").observe(done_s - r.first_token_s)
        # vLLM observes 0 for a request with no token after its first (decode time / (tokens - 1) undefined).
        per_token = (done_s - r.first_token_s) / (r.generated - 1) if r.generated > 1 else 0.0
        h("vllm:request_time_per_output_token_seconds").observe(per_token)
        h("vllm:request_prompt_tokens").observe(r.prompt_tokens)
        h("vllm:request_generation_tokens").observe(r.generated)
        h("vllm:request_max_num_generation_tokens").observe(r.max_tokens)
        h("vllm:request_params_max_tokens").observe(r.max_tokens)
        h("vllm:request_params_n").observe(1)
        h("vllm:request_num_preemptions").observe(r.preemptions)
        h("vllm:request_prefill_kv_computed_tokens").observe(r.prompt_tokens)
        self._completed += 1
        if self._completions is not None:
            self._completions.append(
                Completion(
                    arrival_s=r.arrival_s, first_token_s=r.first_token_s, done_s=done_s, output_tokens=r.generated
                )
            )
