"""Leader election on a Kubernetes Lease: who of several replicas may act, decided the way client-go's
`leaderelection` package decides it (`tryAcquireOrRenew`), as pure functions of what was read and the time.

Pure: the lease record read from the API server and the times come in as arguments; the next state and the record
to write come out. Two clocks, both passed in:

- `now_s`, the replica's own monotonic clock, judges everything: whether a lease has expired and whether this
  replica may act. A lease expires `lease_duration_s` after this replica last *saw the record change* (or wrote it),
  never by comparing the `renewTime` written by another machine with our clock: clocks of different nodes disagree,
  and a skewed clock must not let two replicas act at once.
- `wall_s`, Unix seconds, is only written into the record (`acquireTime`, `renewTime`) for people and tools.

The rules, per attempt (every `retry_period_s`):
1. The lease is absent -> create it naming us (the API server answers 409 AlreadyExists to all but one creator).
2. Else observe it: a record different from the one last seen restarts its expiry on our clock.
3. Held by another holder and not expired on our clock -> wait.
4. Else write it (an update carrying the resourceVersion read, so a concurrent writer gets 409 Conflict): a renewal
   keeps `acquireTime` and `leaseTransitions`; a takeover (expired, or released: no holder) sets `acquireTime` and
   adds one to `leaseTransitions`.
A leader that still holds a lease it observed unchanged renews it without reading first (client-go's fast path).

Acting (`should_act`): this replica is the holder of the record last observed, and its last successful write was
*sent* less than `renew_deadline_s` ago. Since the deadline is shorter than the lease duration and every other
replica starts its expiry clock no earlier than that write reached the API server, a leader that cannot renew stops
acting `lease_duration_s - renew_deadline_s` before anyone else may take over. A conflict (409) on any write stops
acting at once, until a fresh read shows the lease is still ours and a renewal succeeds.

Release (`released`): on a clean shutdown the leader writes the record without a holder (lease duration 1 s, as
client-go does), so another replica takes over on its next attempt instead of waiting out the lease.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

# client-go's JitterFactor: a candidate waits retry_period_s * (1 + jitter * 1.2) between attempts, so the renew
# deadline must exceed 1.2 x the retry period for a leader to get more than one try within it.
JITTER_FACTOR = 1.2
RELEASED_LEASE_DURATION_S = 1  # what client-go writes on release: the record expires at once for every observer


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a coordination.k8s.io/v1 Lease says (its spec). `holder` "" = nobody holds it (released or new).
    Times in integer microseconds since the Unix epoch (the API's MicroTime resolution), None when unset."""

    holder: str
    lease_duration_s: int
    acquire_time_us: int | None = None
    renew_time_us: int | None = None
    transitions: int = 0


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """Who we are and the timing. Example (the defaults): a lease of 15 s, renewed every 2 s, a leader that could
    not renew for 10 s stops acting; 5 s before any other replica may take over."""

    identity: str
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("identity must not be empty")
        if self.lease_duration_s < 1:
            raise ValueError("lease_duration_s must be at least 1 (the API stores whole seconds)")
        if not self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("renew_deadline_s must be shorter than lease_duration_s")
        if not 0 < JITTER_FACTOR * self.retry_period_s < self.renew_deadline_s:
            raise ValueError(f"renew_deadline_s must exceed {JITTER_FACTOR} x retry_period_s (> 0)")


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What one replica remembers between attempts: the record last observed (read or written), when it was
    observed to change (own clock), and when our last successful write as the holder was sent (own clock)."""

    observed: LeaseRecord | None = None
    observed_at_s: float | None = None
    renewed_at_s: float | None = None


class WriteKind(StrEnum):
    CREATE = "create"  # POST: the lease does not exist yet
    UPDATE = "update"  # PUT with the resourceVersion the decision was made on


@dataclass(frozen=True, slots=True)
class LeaseWrite:
    kind: WriteKind
    record: LeaseRecord
    takeover: bool = False  # a new holder (counted in leaseTransitions), not a renewal


@dataclass(frozen=True, slots=True)
class AttemptPlan:
    """The state after observing the record read, and what to write (None: wait, `why` says for whom)."""

    state: ElectionState
    write: LeaseWrite | None
    why: str


def is_holder(state: ElectionState, config: ElectionConfig) -> bool:
    """Whether the record last observed names us (client-go's IsLeader)."""
    return state.observed is not None and state.observed.holder == config.identity


def lease_valid(state: ElectionState, now_s: float) -> bool:
    """Whether the record last observed is unexpired on our clock: observed (changed or written) less than its
    lease duration ago. Example: observed at 100.0 with a 15 s lease -> valid until 115.0 (exclusive)."""
    observed, at_s = state.observed, state.observed_at_s
    if observed is None or at_s is None:
        return False
    return at_s + observed.lease_duration_s > now_s


def should_act(state: ElectionState, config: ElectionConfig, now_s: float) -> bool:
    """Whether this replica may act now: the holder of the record last observed, renewed (write sent) less than
    `renew_deadline_s` ago. Example: renewed at 100.0, deadline 10 -> acts until 110.0 (exclusive), whereas
    another replica cannot take over before 100.0 + 15."""
    if not is_holder(state, config) or state.renewed_at_s is None:
        return False
    return now_s - state.renewed_at_s < config.renew_deadline_s


def observe(state: ElectionState, record: LeaseRecord | None, now_s: float) -> ElectionState:
    """The state after reading `record` (None: absent) at `now_s`: a record other than the last one observed
    restarts its expiry clock; the same record keeps it (so a holder that stopped renewing expires)."""
    if record == state.observed and state.observed_at_s is not None:
        return state
    return replace(state, observed=record, observed_at_s=now_s)


def plan_attempt(
    state: ElectionState, current: LeaseRecord | None, *, config: ElectionConfig, now_s: float, wall_s: float
) -> AttemptPlan:
    """What to do with the lease as just read (`current`, None when it does not exist): create it, take it over,
    renew it, or wait (module docstring, rules 1-4)."""
    now_us = _micro(wall_s)
    if current is None:
        record = LeaseRecord(config.identity, config.lease_duration_s, now_us, now_us, 0)
        return AttemptPlan(state, LeaseWrite(WriteKind.CREATE, record, takeover=True), "the lease does not exist")
    state = observe(state, current, now_s)
    holder = is_holder(state, config)
    if current.holder and not holder and lease_valid(state, now_s):
        assert state.observed_at_s is not None  # set by observe
        left_s = state.observed_at_s + current.lease_duration_s - now_s
        return AttemptPlan(state, None, f"held by {current.holder} (expires in {left_s:.1f} s unless renewed)")
    if holder:
        record = LeaseRecord(config.identity, config.lease_duration_s, current.acquire_time_us, now_us,
                             current.transitions)
        return AttemptPlan(state, LeaseWrite(WriteKind.UPDATE, record), "renew")
    record = LeaseRecord(config.identity, config.lease_duration_s, now_us, now_us, current.transitions + 1)
    why = f"take over from {current.holder} (expired)" if current.holder else "take over (released)"
    return AttemptPlan(state, LeaseWrite(WriteKind.UPDATE, record, takeover=True), why)


def renewal(state: ElectionState, config: ElectionConfig, *, now_s: float, wall_s: float) -> LeaseWrite | None:
    """The fast path: a leader whose lease is still valid on its clock renews the record it last observed without
    reading it first (None: not the holder, or expired: read first)."""
    observed = state.observed
    if observed is None or not is_holder(state, config) or not lease_valid(state, now_s):
        return None
    record = LeaseRecord(config.identity, config.lease_duration_s, observed.acquire_time_us, _micro(wall_s),
                         observed.transitions)
    return LeaseWrite(WriteKind.UPDATE, record)


def written(state: ElectionState, stored: LeaseRecord, config: ElectionConfig, *, sent_at_s: float) -> ElectionState:
    """The state after a write sent at `sent_at_s` (own clock) succeeded and the API server stored `stored`."""
    renewed = sent_at_s if stored.holder == config.identity else None
    return ElectionState(observed=stored, observed_at_s=sent_at_s, renewed_at_s=renewed)


def conflicted(state: ElectionState) -> ElectionState:
    """The state after a write was refused (409: someone else wrote the lease since we read it, or created it
    first): stop acting at once; the next read says who holds it."""
    return replace(state, renewed_at_s=None)


def released(state: ElectionState, config: ElectionConfig, *, wall_s: float) -> LeaseWrite | None:
    """The record a leader writes on a clean shutdown: no holder, a 1 s lease, the same transitions (client-go's
    release). None when we do not hold the lease (nothing to give back)."""
    observed = state.observed
    if observed is None or not is_holder(state, config):
        return None
    now_us = _micro(wall_s)
    record = LeaseRecord("", RELEASED_LEASE_DURATION_S, now_us, now_us, observed.transitions)
    return LeaseWrite(WriteKind.UPDATE, record)


def follower_detail(state: ElectionState, config: ElectionConfig, now_s: float) -> str:
    """Why this replica does not act now, in words (a skip's detail). Example: "the lease is held by vllm-1_ab12;
    this replica (vllm-0_cd34) only advises"."""
    observed = state.observed
    if is_holder(state, config):
        if state.renewed_at_s is None:
            return f"this replica ({config.identity}) holds the lease but a write of it was refused; reading it again"
        since_s = now_s - state.renewed_at_s
        return (f"this replica ({config.identity}) could not renew the lease for {since_s:.1f} s (renew deadline "
                f"{config.renew_deadline_s:g} s): not acting until it does")
    if observed is None or not observed.holder:
        return f"no replica holds the lease yet; this replica ({config.identity}) is a candidate"
    return f"the lease is held by {observed.holder}; this replica ({config.identity}) only advises"


def _micro(wall_s: float) -> int:
    """Unix seconds as integer microseconds (MicroTime's resolution). Example: 1.5 -> 1500000."""
    if not math.isfinite(wall_s):
        raise ValueError("wall_s must be finite")
    return round(wall_s * 1_000_000)
