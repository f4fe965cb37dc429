"""Leader election for the actuation runner: one coordination.k8s.io/v1 Lease, read and written through lightkube,
so that of several advisor replicas (or several sidecars acting on one Deployment) exactly one acts.

The decisions are `policies.act.leader`'s (pure; client-go's `leaderelection` semantics); this module does the I/O
and the timing: every `retry_period_s` (a candidate with client-go's jitter, up to 1.2 x more), one attempt that
renews (a leader whose lease is still valid PUTs it with the resourceVersion it last wrote), or reads the lease and
creates it (POST; 409 AlreadyExists: another replica won), takes it over (PUT with the resourceVersion read; 409
Conflict: another replica won) or waits. `leading()` is what the runner asks before every pass and again right before
it sends a patch: the holder whose last renewal was sent less than `renew_deadline_s` ago. On a clean shutdown
`aclose()` stops the attempts and releases the lease (the record without a holder), so another replica takes over
at its next attempt; a replica that dies without releasing is taken over once its lease expires on the others'
clocks. Nothing here raises into the caller: a failed attempt is logged (once per run of failures) and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from policies.act.leader import (
    JITTER_FACTOR,
    ElectionConfig,
    ElectionState,
    LeaseRecord,
    LeaseWrite,
    WriteKind,
    conflicted,
    follower_detail,
    observe,
    plan_attempt,
    released,
    renewal,
    should_act,
    written,
)
from service.actuators.kube_errors import error_for_exception
from service.logs import fields, get_logger
from service.tasks import cancel_and_wait

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CLOSE_SLACK_S = 1.0  # s past the renew deadline aclose waits for an attempt in flight before cancelling it
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class LeaseName:
    """Which Lease: its namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"lease/{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Clocks:
    """`monotonic` (seconds) judges expiry and acting; `wall` (Unix seconds) is only written into the record;
    `jitter` returns a number in [0, 1) that spreads the candidates' attempts."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    jitter: Callable[[], float] = field(default=random.random)


class _AttemptFailedError(Exception):
    """An API call of an attempt failed for a reason other than a lost race; the detail says which."""


class LeaseElector:
    """Competes for the Lease `lease` as `config.identity`, on `clocks`."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        lease: LeaseName,
        config: ElectionConfig,
        clocks: Clocks | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        clocks = clocks if clocks is not None else Clocks()
        self._client = client
        self._namespace = lease.namespace
        self._name = lease.name
        self._lease = lease
        self._config = config
        self._clock = clocks.monotonic
        self._wall_clock = clocks.wall
        self._jitter = clocks.jitter
        self._log = logger if logger is not None else get_logger("leader")
        self._state = ElectionState()
        self._resource_version: str | None = None  # of the record last read or written (the fast path's guard)
        self._task: asyncio.Task[None] | None = None
        self._attempting = False
        self._closing = False
        self._leading = False
        self._failing = False
        self.transitions = 0  # times this replica started or stopped acting as the leader
        self.last_error: str | None = None  # why the last attempt failed; None after one that worked

    @property
    def identity(self) -> str:
        return self._config.identity

    @property
    def lease_ref(self) -> str:
        return str(self._lease)

    @property
    def holder(self) -> str | None:
        """The holder in the record last observed ("" when released; None before the first read)."""
        observed = self._state.observed
        return None if observed is None else observed.holder

    def leading(self) -> bool:
        """Whether this replica may act now (`policies.act.leader.should_act` on the own clock)."""
        leading = should_act(self._state, self._config, self._clock())
        self._note(leading)
        return leading

    def describe(self) -> str:
        """Why this replica does not act, for a skip's detail."""
        detail = f"{self.lease_ref}: {follower_detail(self._state, self._config, self._clock())}"
        return f"{detail} (last error: {self.last_error})" if self.last_error else detail

    # -- the loop ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start competing in the background (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="spec-advisor-leader-election")

    async def run(self) -> None:
        """Attempt, wait, repeat, until cancelled or closed."""
        while not self._closing:
            self._attempting = True
            try:
                await self.attempt()
            finally:
                self._attempting = False
            if self._closing:
                return
            await asyncio.sleep(self._pause_s())

    async def stop(self) -> None:
        """Stop competing at once, an attempt in flight included, without giving the lease back (what a crash looks
        like to the others)."""
        task, self._task = self._task, None
        if task is not None:
            self._ended(await cancel_and_wait(task))

    async def aclose(self) -> None:
        """At a clean shutdown: let an attempt in flight finish (it is bounded by the renew deadline; cut short, a
        renewal the API server stored would leave us a stale resourceVersion), stop competing, then release the
        lease if this replica holds it."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            # An attempt in flight is bounded by the renew deadline, after which run() returns; the slack covers a
            # timeout whose cancellation a library lost. Between attempts it is cancelled at once.
            grace_s = self._config.renew_deadline_s + _CLOSE_SLACK_S if self._attempting else 0.0
            self._ended(await cancel_and_wait(task, grace_s=grace_s))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._config.renew_deadline_s):
                await self.release()

    async def attempt(self) -> bool:
        """One attempt to acquire or renew, bounded by the renew deadline; whether this replica leads after it."""
        now_s = self._clock()
        try:
            async with asyncio.timeout(self._config.renew_deadline_s):  # unlike 3.11's wait_for, never eats a cancel
                await self._attempt(now_s)
        except TimeoutError:
            self._failed(f"no answer within the renew deadline ({self._config.renew_deadline_s:g} s)")
        except _AttemptFailedError as exc:
            self._failed(str(exc))
        else:
            self._recovered()
        return self.leading()

    async def release(self) -> bool:
        """Give the lease back (a record without a holder) if this replica holds it; whether it did. Without a
        resourceVersion to guard the write, or after a conflict, the lease is read again first and released only
        if it still names this replica."""
        try:
            for _ in range(3):  # (read,) write; after a conflict: read, write
                if self._resource_version is None:
                    self._state = observe(self._state, await self._read(), self._clock())
                write = released(self._state, self._config, wall_s=self._wall_clock())
                if write is None:
                    break
                if await self._write(write, self._clock()):
                    self._log.info("leader election: released the lease", extra=fields(
                        lease=self.lease_ref, identity=self.identity))
                    self.leading()
                    return True
        except _AttemptFailedError as exc:
            self._log.warning("leader election: could not release the lease; the others take over when it expires",
                              extra=fields(lease=self.lease_ref, identity=self.identity, error=str(exc)))
        self.leading()
        return False

    def _ended(self, error: BaseException | None) -> None:
        if error is not None:  # run() catches every failure of an attempt: this is a bug of ours
            self._log.error("leader election: the election loop failed", exc_info=error,
                            extra=fields(lease=self.lease_ref, identity=self.identity))

    def _pause_s(self) -> float:
        if self._leading:
            return self._config.retry_period_s
        return self._config.retry_period_s * (1.0 + JITTER_FACTOR * self._jitter())

    # -- one attempt -------------------------------------------------------------------------------------------

    async def _attempt(self, now_s: float) -> None:
        wall_s = self._wall_clock()
        fast = renewal(self._state, self._config, now_s=now_s, wall_s=wall_s)
        if fast is not None and self._resource_version is not None:
            with contextlib.suppress(_AttemptFailedError):  # the slow path below reads and tells
                if await self._write(fast, now_s):
                    return
        current = await self._read()
        # The record is observed when the read returns, not when the attempt began: a slow GET must not date a
        # change earlier than it was seen (client-go's observedTime), or a follower takes over before the expiry.
        # A write below still counts from `now_s`, the attempt's start: a leader's renewal is dated conservatively.
        plan = plan_attempt(self._state, current, config=self._config, now_s=self._clock(), wall_s=wall_s)
        self._state = plan.state
        if plan.write is None:
            self._log.debug("leader election: waiting", extra=fields(lease=self.lease_ref, why=plan.why))
            return
        if await self._write(plan.write, now_s) and plan.write.takeover:
            self._log.info("leader election: acquired the lease", extra=fields(
                lease=self.lease_ref, identity=self.identity, why=plan.why,
                transitions=plan.write.record.transitions))

    async def _read(self) -> LeaseRecord | None:
        """The lease as stored now (None: it does not exist); its resourceVersion becomes the guard of a write."""
        try:
            lease = await self._client.get(Lease, self._name, namespace=self._namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                self._resource_version = None
                return None
            raise _AttemptFailedError(self._error(exc)) from None
        except Exception as exc:  # transport errors, a non-Status error body, missing credentials
            raise _AttemptFailedError(self._error(exc)) from None
        self._resource_version = lease.metadata.resourceVersion if lease.metadata is not None else None
        return record_of(lease)

    async def _write(self, write: LeaseWrite, sent_at_s: float) -> bool:
        """Send `write`; True when stored. A 409 (another replica created or wrote the lease first) is a lost race:
        False, and this replica stops acting at once. Any other failure raises _AttemptFailedError."""
        version = self._resource_version if write.kind is WriteKind.UPDATE else None
        body = lease_object(self._name, self._namespace, write.record, resource_version=version)
        try:
            if write.kind is WriteKind.CREATE:
                stored = await self._client.create(body)
            else:
                stored = await self._client.replace(body)
        except ApiError as exc:
            if exc.status.code == 409:
                self._state = conflicted(self._state)
                self._resource_version = None  # read before the next write
                self.leading()
                self._log.info("leader election: lost a race for the lease", extra=fields(
                    lease=self.lease_ref, identity=self.identity, write=write.kind.value,
                    reason=exc.status.reason))
                return False
            raise _AttemptFailedError(self._error(exc)) from None
        except Exception as exc:
            raise _AttemptFailedError(self._error(exc)) from None
        self._resource_version = stored.metadata.resourceVersion if stored.metadata is not None else None
        self._state = written(self._state, record_of(stored), self._config, sent_at_s=sent_at_s)
        return True

    # -- bookkeeping -------------------------------------------------------------------------------------------

    def _error(self, exc: Exception) -> str:
        reason, detail = error_for_exception(exc, target=self.lease_ref)
        return f"{reason.value}: {detail}"

    def _failed(self, error: str) -> None:
        self.last_error = error
        if not self._failing:  # once per run of failures, like a scrape outage
            self._failing = True
            self._log.warning("leader election: an attempt failed; retrying every retry period", extra=fields(
                lease=self.lease_ref, identity=self.identity, error=error))

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            self._log.info("leader election: the lease can be read and written again",
                           extra=fields(lease=self.lease_ref, identity=self.identity))
        self.last_error = None

    def _note(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self.transitions += 1
        if leading:
            self._log.info("leader election: this replica acts now", extra=fields(
                lease=self.lease_ref, identity=self.identity))
        else:
            self._log.warning("leader election: this replica stopped acting", extra=fields(
                lease=self.lease_ref, identity=self.identity, holder=self.holder, why=self.describe()))


def record_of(lease: Lease) -> LeaseRecord:
    """The election's view of a Lease (missing fields as client-go reads them: no holder, a 0 s lease)."""
    spec = lease.spec if lease.spec is not None else LeaseSpec()
    return LeaseRecord(
        holder=spec.holderIdentity or "",
        lease_duration_s=spec.leaseDurationSeconds or 0,
        acquire_time_us=_micros(spec.acquireTime),
        renew_time_us=_micros(spec.renewTime),
        transitions=spec.leaseTransitions or 0,
    )


def lease_object(name: str, namespace: str, record: LeaseRecord, *, resource_version: str | None) -> Lease:
    """The Lease to create (no resourceVersion) or to replace (the resourceVersion the write is guarded by)."""
    return Lease(
        metadata=ObjectMeta(name=name, namespace=namespace, resourceVersion=resource_version),
        spec=LeaseSpec(
            holderIdentity=record.holder,
            leaseDurationSeconds=record.lease_duration_s,
            acquireTime=_micro_time(record.acquire_time_us),
            renewTime=_micro_time(record.renew_time_us),
            leaseTransitions=record.transitions,
        ),
    )


def _micros(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICROSECOND


def _micro_time(micros: int | None) -> datetime | None:
    """A MicroTime. The API server parses it with the layout 2006-01-02T15:04:05.000000Z07:00, which requires the
    six fraction digits, and the JSON encoder leaves the fraction out of a datetime on a whole second: such a time
    is moved on by one microsecond (the API's resolution) so it always carries them."""
    if micros is None:
        return None
    value = _EPOCH + micros * _MICROSECOND
    return value + _MICROSECOND if value.microsecond == 0 else value


def leader_identity(environ: Mapping[str, str]) -> str:
    """This replica's holderIdentity: the pod's name (POD_NAME, from the downward API; else HOSTNAME, which is the
    pod's name in Kubernetes; else the host name) plus a random suffix, as client-go's callers do, so a restarted
    container never mistakes its predecessor's lease for its own. Example: "vllm-llama-8b-7d9f-x2k4_3fa85f64"."""
    pod = environ.get("POD_NAME") or environ.get("HOSTNAME") or socket.gethostname() or "spec-advisor"
    return f"{pod}_{secrets.token_hex(4)}"
