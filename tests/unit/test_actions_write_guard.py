"""The write endpoints refuse before they read: no token (or a wrong one) is answered without pulling a byte of
the body, and a body over the cap is refused by its declared length or as soon as the count passes the cap. One
unauthenticated 50 MB request must not be parsed, nor held in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from policies.act.gate import ActuationConfig
from service.actuators.audit import AuditLog
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.board import Board
from service.exporter import MetricsPage
from service.http.actions import MAX_WRITE_BODY_BYTES, create_actions_router, install_auth_errors
from service.http.api import ApiExtensions, create_api

TOKEN = "s3cret"
CHUNK = 64 * 1024


def _app(tmp_path: Path) -> Any:
    board = Board([("a", None)], started_at_s=0.0)
    runner = ActuationRunner(
        board, {}, audit=AuditLog(tmp_path / "actions.jsonl"),
        options=RunnerOptions(mode="kubernetes", config=ActuationConfig()),
    )
    router = create_actions_router(runner, None, clock=lambda: 0.0, token=TOKEN)
    app = create_api(
        board, metrics=MetricsPage(board, clock=lambda: 0.0, version="t"), clock=lambda: 0.0, stall_after_s=15.0,
        version="t", extensions=ApiExtensions(routers=[router]),
    )
    return install_auth_errors(app)


def _post(app: Any, headers: dict[str, str], chunks: Iterator[bytes]) -> tuple[int, int]:
    """POST /v1/actions/pause over raw ASGI; returns (status, body chunks the app pulled)."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/actions/pause", "raw_path": b"/v1/actions/pause", "query_string": b"", "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8321),
    }
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, pulled


def _huge(total: int) -> Iterator[bytes]:
    return (b"x" * CHUNK for _ in range(total // CHUNK))


def test_a_write_without_a_valid_token_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    app = _app(tmp_path)
    fifty_mb = 50 * 1024 * 1024
    status, pulled = _post(app, {"content-type": "application/json", "content-length": str(fifty_mb)},
                           _huge(fifty_mb))
    assert (status, pulled) == (401, 0)
    status, pulled = _post(app, {"authorization": "Bearer wrong", "content-length": str(fifty_mb)}, _huge(fifty_mb))
    assert (status, pulled) == (403, 0)


def test_an_authorised_write_over_the_cap_is_refused_by_its_length_or_while_counting(tmp_path: Path) -> None:
    app = _app(tmp_path)
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    big = 4 * 1024 * 1024
    # Declared too long: refused before a byte is read.
    assert _post(app, {**auth, "content-length": str(big)}, _huge(big)) == (413, 0)
    # Chunked (no declared length): refused as soon as the count passes the cap.
    status, pulled = _post(app, auth, _huge(big))
    assert status == 413 and pulled <= MAX_WRITE_BODY_BYTES // CHUNK + 1
    # Within the cap and well formed: it goes through to the runner (200, or the runner's own refusal).
    body = b'{"target": "a", "reason": "maintenance"}'
    status, _ = _post(app, {**auth, "content-length": str(len(body))}, iter([body]))
    assert status not in (401, 403, 413)
