"""Physics of the simulated world's truth: pure functions of the scenario, apart from the batching state machine.

`world.py` owns who is running, queued or preempted and when; this module owns what things cost and how the
random processes behave, given the scenario (see `scenario.HardwareTruth`, `ModelTruth`, `DrafterTruth`,
`Workload`):

- time: a target forward pass (roofline: memory and compute blended by a p-norm, plus overheads), the drafter's
  cost per step, multiplicative step jitter, and the steady-decode step time an oracle would optimise against;
- work: the FLOPs and bytes one forward pass moves (also what the engine's estimated-work counters add up);
- speculation: how many tokens a drafter proposes, the true conditional acceptance over time (with drift), the
  expected tokens per verification, and the acceptance process itself (drawing the spec-decode counters of many
  verifications at once);
- load: the periodic piecewise-linear arrival rate and the request-length distributions.

Everything random takes the caller's `random.Random`, so the world decides which stream each draw comes from and
in which order (its determinism depends on that order). Like the world, this imports nothing of the advisor's:
it is the ground truth the advisor is graded against.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

from service.sim.scenario import (
    LOOKUP_METHODS,
    DrafterTruth,
    FixedLength,
    LengthDistribution,
    LogNormalLength,
    Scenario,
)

# ----------------------------------------------------------------------------------------------------------------
# Time and work of one engine step
# ----------------------------------------------------------------------------------------------------------------


def _blend(a: float, b: float, p: float) -> float:
    """p-norm of two non-negative times: a smooth max that lets memory and compute partly overlap."""
    hi, lo = (a, b) if a >= b else (b, a)
    if hi <= 0.0:
        return 0.0
    return float(hi * (1.0 + (lo / hi) ** p) ** (1.0 / p))


def _flops_ratio(scenario: Scenario, tokens: float) -> float:
    # Small steps use the tensor cores poorly; the achieved ratio rises towards its large-step value.
    hw = scenario.hardware
    small = hw.achieved_flops_ratio if hw.small_step_flops_ratio is None else hw.small_step_flops_ratio
    return small + (hw.achieved_flops_ratio - small) * tokens / (tokens + hw.flops_ratio_half_tokens)


def forward_flops(scenario: Scenario, *, tokens: float, attention_pairs: float) -> float:
    """FLOPs of one target forward over `tokens` tokens whose attention spans `attention_pairs` (query, key) pairs."""
    model = scenario.model
    return 2.0 * model.active_params * tokens + model.attention_flops_per_token_ctx * attention_pairs


def forward_read_bytes(scenario: Scenario, *, kv_tokens_read: float, tokens: float = 1.0) -> float:
    """Bytes one target forward over `tokens` tokens streams: the weights it uses plus the cached KV it attends to.

    A dense model reads all its weights whatever `tokens` is; a mixture of experts reads its always-used weights
    plus the routed experts these tokens touch (`MixtureOfExperts.experts_touched`).
    """
    model = scenario.model
    weights = model.weight_bytes
    if model.moe is not None:
        weights += model.moe.expert_bytes * model.moe.experts_touched(tokens)
    return weights + model.kv_bytes_per_token * kv_tokens_read


def target_step_time_s(scenario: Scenario, *, tokens: int, kv_tokens_read: float, attention_pairs: float) -> float:
    """Jitter-free time of one target-model forward over `tokens` tokens reading `kv_tokens_read` cached tokens.

    `attention_pairs` is the sum over query tokens of the context each attends to.
    """
    hw = scenario.hardware
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.achieved_bandwidth_ratio
    flops_rate = hw.dense_flops_per_s * _flops_ratio(scenario, tokens)
    memory_s = forward_read_bytes(scenario, kv_tokens_read=kv_tokens_read, tokens=tokens) / bandwidth
    # Compute runs in whole tiles: a 3-token step costs as much matrix work as a full tile.
    padded = math.ceil(tokens / hw.compute_tile_tokens) * hw.compute_tile_tokens
    compute_s = forward_flops(scenario, tokens=padded, attention_pairs=attention_pairs) / flops_rate
    return hw.step_overhead_s + hw.overhead_per_token_s * tokens + _blend(memory_s, compute_s, hw.overlap_exponent)


def mixed_step_time_s(
    scenario: Scenario,
    *,
    decode_tokens: float,
    decode_ctx: float,
    prefill_tokens: int,
    prefill_ctx: float,
    kv_tokens_read: float,
) -> float:
    """Jitter-free target time of a step that verifies `decode_tokens` (expected) and prefills `prefill_tokens`.

    `decode_ctx` is the mean context of a decoding request, `prefill_ctx` the mean context a prefill token attends
    to; the drafter's time is not included (see `draft_time_s`).
    """
    tokens = round(decode_tokens) + prefill_tokens
    pairs = decode_tokens * decode_ctx + prefill_tokens * prefill_ctx
    return target_step_time_s(scenario, tokens=tokens, kv_tokens_read=kv_tokens_read, attention_pairs=pairs)


def draft_time_s(scenario: Scenario, *, num_seqs: int, num_speculative_tokens: int) -> float:
    """Jitter-free drafting cost of one step: host work per request plus k sequential draft passes."""
    if num_speculative_tokens == 0 or num_seqs == 0:
        return 0.0
    hw, d = scenario.hardware, scenario.drafter
    per_pass = d.draft_step_overhead_s
    if d.draft_weight_bytes > 0 or d.draft_active_params > 0:
        memory_s = d.draft_weight_bytes / (hw.memory_bandwidth_bytes_per_s * hw.achieved_bandwidth_ratio)
        compute_s = 2.0 * d.draft_active_params * num_seqs / (hw.dense_flops_per_s * _flops_ratio(scenario, num_seqs))
        per_pass += _blend(memory_s, compute_s, hw.overlap_exponent)
    return d.host_s_per_request * num_seqs + num_speculative_tokens * per_pass


def step_jitter(rng: random.Random, sigma: float) -> float:
    """A multiplicative step-time factor: log-normal with mean 1 (1.0 exactly when `sigma` is 0, drawing nothing)."""
    return math.exp(rng.gauss(-0.5 * sigma * sigma, sigma)) if sigma > 0 else 1.0


def expected_step_time_s(
    scenario: Scenario, *, num_seqs: int, num_speculative_tokens: int, mean_context_tokens: float
) -> float:
    """Jitter-free step time of a steady decode batch (no prefill): the truth an oracle would optimise against."""
    q = verified_tokens_per_request(scenario.drafter, num_speculative_tokens)
    tokens = round(num_seqs * q)
    kv = num_seqs * mean_context_tokens
    return target_step_time_s(
        scenario, tokens=tokens, kv_tokens_read=kv, attention_pairs=tokens * mean_context_tokens
    ) + draft_time_s(scenario, num_seqs=num_seqs, num_speculative_tokens=num_speculative_tokens)


# ----------------------------------------------------------------------------------------------------------------
# Speculation: proposals and acceptance
# ----------------------------------------------------------------------------------------------------------------


def _reach_ratios(drafter: DrafterTruth, k: int) -> list[float]:
    """P(a verification proposes at least i+1 tokens), i = 0..k-1."""
    if drafter.method not in LOOKUP_METHODS:
        return [1.0] * k
    match, full = drafter.lookup_match_ratio, drafter.lookup_full_length_ratio
    # Short proposals are uniform over 1..k-1, so P(L >= i+1 | short) = (k-1-i)/(k-1) for i >= 1.
    return [match * (1.0 if i == 0 else full + (1.0 - full) * (k - 1 - i) / (k - 1)) for i in range(k)]


def expected_tokens_per_verification(drafter: DrafterTruth, k: int, acceptance: tuple[float, ...]) -> float:
    """Mean tokens a decoding request emits per step: 1 + E[accepted drafts] (1.0 when k = 0)."""
    total, alive = 1.0, 1.0
    reach = _reach_ratios(drafter, k)
    for i in range(k):
        alive *= acceptance[i]
        total += reach[i] * alive
    return total


# Conditional means of the four quartiles of a standard normal: a request class per quartile (a quarter each).
_QUARTILE_MEANS = (-1.2711, -0.3246, 0.3246, 1.2711)
_MAX_REQUEST_ACCEPTANCE = 0.98


def request_classes(drafter: DrafterTruth) -> int:
    """How many kinds of request the drafter sees: 1 when every request is alike, 4 (quartiles) otherwise."""
    return len(_QUARTILE_MEANS) if drafter.request_acceptance_spread > 0 else 1


def class_acceptance(drafter: DrafterTruth, acceptance: tuple[float, ...], request_class: int) -> tuple[float, ...]:
    """The conditional acceptance of one request class: the profile x exp(spread x z_class), capped at 0.98."""
    if request_classes(drafter) == 1:
        return acceptance
    scale = math.exp(drafter.request_acceptance_spread * _QUARTILE_MEANS[request_class])
    return tuple(min(_MAX_REQUEST_ACCEPTANCE, a * scale) for a in acceptance)


def mean_tokens_per_verification(drafter: DrafterTruth, k: int, acceptance: tuple[float, ...]) -> float:
    """Tokens a decoding request emits per step on average over the request classes (each equally common)."""
    n = request_classes(drafter)
    return sum(
        expected_tokens_per_verification(drafter, k, class_acceptance(drafter, acceptance, c)) for c in range(n)
    ) / n


def expected_proposed_tokens(drafter: DrafterTruth, k: int) -> float:
    """Mean draft tokens proposed per decoding request per step."""
    return sum(_reach_ratios(drafter, k))


def verified_tokens_per_request(drafter: DrafterTruth, k: int) -> float:
    """Mean tokens the target model runs per decoding request per step: its last token plus the proposed drafts."""
    return 1.0 + expected_proposed_tokens(drafter, k)


def acceptance_at(scenario: Scenario, elapsed_s: float, k: int) -> tuple[float, ...]:
    """The true conditional acceptance of positions 0..k-1 at `elapsed_s` seconds since the world's start."""
    d = scenario.drafter

    def pad(profile: tuple[float, ...]) -> list[float]:
        return [profile[min(i, len(profile) - 1)] for i in range(k)]

    start = pad(d.conditional_acceptance)
    if d.conditional_acceptance_drift_to is None:
        return tuple(start)
    end = pad(d.conditional_acceptance_drift_to)
    if elapsed_s <= d.drift_start_s:
        w = 0.0
    elif elapsed_s >= d.drift_end_s:
        w = 1.0
    else:
        w = (elapsed_s - d.drift_start_s) / (d.drift_end_s - d.drift_start_s)
    return tuple(a + (b - a) * w for a, b in zip(start, end, strict=True))


@dataclass(frozen=True, slots=True)
class VerificationDraw:
    """The spec-decode counter increments of a batch of verifications, as vLLM counts them.

    `accepted_per_pos[i]` counts drafts with at least i+1 accepted tokens (length k), so its sum is the accepted
    total.
    """

    drafts: int
    draft_tokens: int
    accepted_per_pos: tuple[int, ...]

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_pos)


def draw_verifications(
    rng: random.Random,
    drafter: DrafterTruth,
    *,
    k: int,
    verifications: int,
    acceptance: tuple[float, ...],
) -> VerificationDraw:
    """Draw the outcome of `verifications` request-verifications with k drafts, in aggregate (a chain of binomials).

    `acceptance` is the conditional acceptance of positions 0..k-1. Lookup drafters (n-gram, suffix) propose
    nothing on a miss, which vLLM does not count as a draft, and otherwise either all k tokens or a uniform 1..k-1.
    """
    if k == 0 or verifications == 0:
        return VerificationDraw(drafts=0, draft_tokens=0, accepted_per_pos=(0,) * k)
    lookup = drafter.method in LOOKUP_METHODS
    drafts = binomial(rng, verifications, drafter.lookup_match_ratio) if lookup else verifications
    reach = [drafts] * k  # reach[i] = drafts proposing at least i+1 tokens
    if lookup and k > 1:
        full = binomial(rng, drafts, drafter.lookup_full_length_ratio)
        short = drafts - full
        by_length = [0] * (k + 1)
        for length in range(1, k):  # short proposals: uniform over lengths 1..k-1
            take = short if length == k - 1 else binomial(rng, short, 1.0 / (k - length))
            by_length[length] = take
            short -= take
        by_length[k] = full
        tail = 0
        for i in range(k - 1, -1, -1):
            tail += by_length[i + 1]
            reach[i] = tail
    per_pos = [0] * k
    alive = drafts  # drafts whose positions 0..i-1 were all accepted
    for i in range(k):
        if alive == 0:
            break
        # Of the drafts still alive, those that proposed a token at position i (lengths are independent of
        # acceptance); each of those accepts it with the conditional probability.
        eligible = alive if i == 0 or reach[i - 1] == 0 else binomial(rng, alive, reach[i] / reach[i - 1])
        alive = binomial(rng, eligible, acceptance[i])
        per_pos[i] = alive
    return VerificationDraw(drafts=drafts, draft_tokens=sum(reach), accepted_per_pos=tuple(per_pos))


# ----------------------------------------------------------------------------------------------------------------
# Load: arrivals and request lengths
# ----------------------------------------------------------------------------------------------------------------


def arrival_rate_at(scenario: Scenario, elapsed_s: float) -> float:
    """Arrival rate (requests/s) at `elapsed_s` seconds since the world's start (periodic, piecewise linear)."""
    w = scenario.workload
    phase = elapsed_s % w.period_s
    points = w.arrival_rate
    times = [p.t_s for p in points]
    i = bisect.bisect_right(times, phase) - 1
    t0, r0 = points[i].t_s, points[i].requests_per_s
    if i + 1 < len(points):
        t1, r1 = points[i + 1].t_s, points[i + 1].requests_per_s
    else:  # after the last knot the rate heads back to the first knot's, reached at period_s
        t1, r1 = w.period_s, points[0].requests_per_s
    return r0 + (r1 - r0) * (phase - t0) / (t1 - t0)


def peak_arrival_rate(scenario: Scenario) -> float:
    """The highest arrival rate (requests/s) of the profile: piecewise linear, so the highest knot."""
    return max(p.requests_per_s for p in scenario.workload.arrival_rate)


def draw_length(rng: random.Random, dist: LengthDistribution) -> int:
    """A token count drawn from a prompt or output length distribution."""
    if isinstance(dist, FixedLength):
        return dist.tokens
    if isinstance(dist, LogNormalLength):
        value = round(dist.median_tokens * math.exp(rng.gauss(0.0, dist.sigma)))
        return min(dist.max_tokens, max(dist.min_tokens, value))
    return rng.randint(dist.min_tokens, dist.max_tokens)


# ----------------------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------------------


def binomial(rng: random.Random, n: int, p: float) -> int:
    """A Binomial(n, p) draw: exact for small means (geometric skips), normal approximation otherwise."""
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    if p > 0.5:
        return n - binomial(rng, n, 1.0 - p)
    mean = n * p
    if mean < 12.0:
        # Count successes by jumping over runs of failures: O(successes) draws instead of O(n).
        log_q = math.log1p(-p)
        successes, position = 0, 0
        while True:
            position += int(math.log(1.0 - rng.random()) / log_q) + 1
            if position > n:
                return successes
            successes += 1
    draw = round(rng.gauss(mean, math.sqrt(mean * (1.0 - p))))
    return min(n, max(0, draw))
