"""Bounds on the API server's connections: a deadline for each request to arrive, and a cap on connections open.

uvicorn's HTTP protocols arm no timer when a connection opens, so a client that connects and sends nothing, or
sends a request head or body a few bytes at a time, holds the connection and its file descriptor for as long as
it likes; uvicorn's `limit_concurrency` answers 503 only once a request head has arrived, it never refuses a
connection. `GuardedH11Protocol` adds both bounds:

- **read timeout.** A request, head and body, must have arrived whole `read_timeout_s` seconds after the server
  starts waiting for it: when the connection opens, or at the first byte of the next request on a kept-alive
  connection. A connection still short of it is closed without an answer. With 10 s: a client that connects at
  t = 0 and has sent only `GET /healthz HTTP/1.1\\r\\nHost: a\\r\\n` by then is closed at t = 10 s; a what-if body
  of 256 KiB (the largest request the API takes) needs at least 26 KB/s. Between requests, a kept-alive
  connection idles under uvicorn's own `timeout_keep_alive` instead; while the app answers, nothing is timed.
- **connection cap.** With `max_connections` connections open, one kept-alive connection idling between requests
  is closed to make room (its client reconnects when it next needs to); when none idles, the newly accepted one is
  closed at once, before anything is read from it. At most `max_connections` descriptors are then held by API
  connections, and the slots can be held only by clients that keep sending whole requests, each within
  `read_timeout_s`.

Each close for either reason counts in `ConnectionGuard.closed` (served as
`specadvisor_api_connections_closed_total{reason}`) and logs a warning, at most one per reason per
`WARN_INTERVAL_S`, which says how many closes it did not log.

The guard subclasses uvicorn's h11 protocol, so the server that uses it runs h11: uvicorn's "auto" would pick
httptools when it is installed, and that protocol is not guarded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Literal

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from service.logs import fields, get_logger

CloseReason = Literal["read_timeout", "over_limit"]
CLOSE_REASONS: Final[tuple[CloseReason, ...]] = ("read_timeout", "over_limit")
WARN_INTERVAL_S: Final = 60.0

_log = get_logger("api.connections")
_MESSAGES: Final[Mapping[CloseReason, str]] = {
    "read_timeout": "closed an API connection whose request did not arrive in time",
    "over_limit": "refused an API connection: too many open",
}


class ConnectionGuard:
    """The limits and counts shared by every connection of one server: `max_connections` open at once (>= 1),
    `read_timeout_s` seconds (> 0) for a request to arrive, closes counted per reason, and their warnings logged
    at most once per `warn_interval_s` seconds of `clock` per reason.

    `protocol()` is the class to give uvicorn (`uvicorn.Config(http=guard.protocol())`); e.g.
    `ConnectionGuard(max_connections=256, read_timeout_s=10.0)` lets 256 connections be open and closes any of them
    that has not sent a whole request 10 s after it opened.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        read_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        warn_interval_s: float = WARN_INTERVAL_S,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if not read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be positive, got {read_timeout_s}")
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        self._warn_interval_s = warn_interval_s
        self._closed: dict[str, int] = dict.fromkeys(CLOSE_REASONS, 0)
        self._unlogged: dict[CloseReason, int] = dict.fromkeys(CLOSE_REASONS, 0)
        self._logged_at_s: dict[CloseReason, float] = {}

    def closed(self) -> Mapping[str, int]:
        """Connections closed so far by reason, every reason present (0 before the first close)."""
        return dict(self._closed)

    def record_close(self, reason: CloseReason, *, client: str, open_connections: int) -> None:
        """Count one close for `reason`; log it unless one of this reason was logged less than warn_interval_s ago
        (then the next warning says how many went unlogged)."""
        self._closed[reason] += 1
        now_s = self._clock()
        last_s = self._logged_at_s.get(reason)
        if last_s is not None and now_s - last_s < self._warn_interval_s:
            self._unlogged[reason] += 1
            return
        unlogged, self._unlogged[reason] = self._unlogged[reason], 0
        self._logged_at_s[reason] = now_s
        _log.warning(
            _MESSAGES[reason],
            extra=fields(
                reason=reason,
                client=client,
                open_connections=open_connections,
                max_connections=self.max_connections,
                read_timeout_s=self.read_timeout_s,
                closed_total=self._closed[reason],
                unlogged_since_last_warning=unlogged,
            ),
        )

    def protocol(self) -> type[GuardedH11Protocol]:
        """The protocol class for uvicorn, bound to this guard (uvicorn builds one instance per connection)."""
        bound = self

        class BoundGuardedH11Protocol(GuardedH11Protocol):
            guard = bound

        return BoundGuardedH11Protocol


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the module's two bounds, read from the class's `guard`
    (`ConnectionGuard.protocol()` makes a subclass that sets it).

    The read deadline is armed while the server waits for request bytes that uvicorn does not time: from the
    connection opening until its first request has arrived whole, and from the first byte of each later request
    until that one has. It is disarmed once a request has arrived whole (the app answers it, untimed), while a
    kept-alive connection idles between requests (uvicorn's keep-alive timer runs then), and when the connection
    is handed to a WebSocket protocol.
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._handed_off = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        open_connections = len(self.connections)
        if open_connections >= self.guard.max_connections and self._evict_an_idle_connection():
            open_connections -= 1
        if open_connections >= self.guard.max_connections:
            # Not added to the server's connections: nothing is read from it, and it counts against nothing.
            self._refused = True
            self.transport = transport
            transport.close()
            self.guard.record_close("over_limit", client=_address(transport), open_connections=open_connections)
            return
        super().connection_made(transport)
        self._update_read_deadline()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        self._update_read_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms keep-alive, then parses any pipelined bytes of the next request
        self._update_read_deadline()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._handed_off = True
        self._cancel_read_deadline()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_deadline()
        super().connection_lost(exc)

    def _evict_an_idle_connection(self) -> bool:
        """At the cap, close one kept-alive connection idling between requests (its client reconnects when it next
        needs to, as after the keep-alive timeout) so that a new client, a probe or Prometheus, gets in: clients
        that send a request and then sit idle must not hold every slot for the keep-alive time. Counted as
        over_limit. Whether one was found."""
        for other in self.connections:
            if (isinstance(other, GuardedH11Protocol) and other.timeout_keep_alive_task is not None
                    and other.conn.their_state is h11.IDLE and not other.conn.trailing_data[0]
                    and not other.transport.is_closing()):
                self.guard.record_close("over_limit", client=_address(other.transport),
                                        open_connections=len(self.connections))
                other.transport.close()
                return True
        return False

    def _waiting_for_request(self) -> bool:
        """Whether request bytes are due that nothing else times (the class docstring's rule, on h11's state)."""
        if self._refused or self._handed_off or self.transport.is_closing():
            return False
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return True
        if state is h11.IDLE:
            # Part of a head is buffered: a request is under way. Nothing buffered: between requests, which
            # uvicorn's keep-alive timer bounds when it is armed; it is not on a connection that just opened.
            return bool(self.conn.trailing_data[0]) or self.timeout_keep_alive_task is None
        return False  # DONE, MUST_CLOSE, CLOSED, ERROR, a protocol switch: the request is in, or the end is near

    def _update_read_deadline(self) -> None:
        if not self._waiting_for_request():
            self._cancel_read_deadline()
        elif self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.guard.read_timeout_s, self._read_timed_out)

    def _cancel_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        self.guard.record_close(
            "read_timeout", client=_address(self.transport), open_connections=len(self.connections)
        )
        self.transport.close()


def _address(transport: asyncio.Transport) -> str:
    peer = get_remote_addr(transport)
    return "unknown" if peer is None else f"{peer[0]}:{peer[1]}"
