"""What one change of the speculation config destroys, in seconds of full service (the decision's cost C).

vLLM cannot change speculation without restarting the engine, and a restart loses:

- the outage: nothing is served for about the restart time, `change_cost_s` (the operator's rollout time; for a
  rolling update, N replicas x delay x 1/N of the capacity is the same number);
- the in-flight work: the B running requests are dropped with, on average, half their decode done (a request is
  caught at a uniformly random point of its life), and that work is redone: B x O/2 tokens at the server's G
  generated tokens/s (`inflight_work_s`);
- the queue: queued requests lose no computed work, but a restart errors them; W x O tokens (`queued_work_s`),
  which the caller weighs by the chance the server would have caught up with them (policies/decide/horizon.py
  `queue_cost_s`).

"Seconds of full service" is the unit a relative gain is in: a gain g (a share of the service) held for H seconds
wins back g x H of them. An engine that adapts per batch (change_cost_s = 0) loses nothing, in flight included.
"""

from __future__ import annotations

import math

from policies.types import Evidence


def change_cost_of(*, change_cost_s: float, inflight_s: float) -> float:
    """Seconds of full service one change costs: the outage plus the in-flight (and weighed queued) work.

    `change_cost_s` (s, >= 0; 0 = no restart, then nothing in flight is lost either), `inflight_s` (s; NaN or
    negative -> 0). Example: outage 20 s, in-flight 2.56 s -> 22.56 s; outage 0 -> 0.
    """
    if not (math.isfinite(change_cost_s) and change_cost_s > 0):
        return 0.0
    lost = inflight_s if math.isfinite(inflight_s) and inflight_s > 0 else 0.0
    return change_cost_s + lost


def inflight_work_s(evidence: Evidence) -> float:
    """Seconds of full service a restart throws away with the running requests: half a request's decode time.

    Each of the B running requests is caught, on average, halfway through its O output tokens, so B x O/2
    tokens are redone at the server's G generated tokens/s: O/2 x B / G seconds (B / G is one sequence's
    seconds per token). O is read from the evidence: the running context c = prompt + O/2 on average and the
    prompt/generation rate ratio rho = P / O give O = c / (rho + 1/2). The prompt's prefill is redone too but at
    prefill speed (hundreds of tokens per step), so it is left out. Returns 0.0 (s) when B, G or c is missing
    or not positive: only the outage is then counted. Units: B requests, G and the prompt rate tokens/s, c
    tokens.

    Example: B 32, G 1600 tokens/s, prompt rate 3200 tokens/s (rho 2), c 640: O = 640 / 2.5 = 256, so 128 tokens
    x 32 / 1600 = 2.56 s.
    """
    b = evidence.batch
    if not (math.isfinite(b) and b > 0):
        return 0.0
    return b * _request_output_s(evidence) / 2.0


def queued_work_s(evidence: Evidence) -> float:
    """Seconds of full service the queued requests represent: W requests x O output tokens / G tokens/s (O as in
    `inflight_work_s`). A restart errors them; how much of that is lost service is the caller's weighing
    (policies/decide/horizon.py `queue_weight`). Returns 0.0 when W, G or c is missing or not positive.

    Example: W 64, G 1600 tokens/s, prompt rate 3200 (rho 2), c 640: O = 256, 64 x 256 / 1600 = 10.24 s.
    """
    w = evidence.waiting
    if not (math.isfinite(w) and w > 0):
        return 0.0
    return w * _request_output_s(evidence)


def _request_output_s(evidence: Evidence) -> float:
    """One request's output in seconds of full service, O / G (O = c / (rho + 1/2), `inflight_work_s`); 0.0 when
    G or c is missing or not positive."""
    g, c = evidence.generation_tokens_per_s, evidence.context_tokens_per_seq
    if g is None or c is None or not (math.isfinite(g) and g > 0 and math.isfinite(c) and c > 0):
        return 0.0
    p = evidence.prompt_tokens_per_s
    rho = p / g if p is not None and math.isfinite(p) and p > 0 else 0.0
    return c / (rho + 0.5) / g
