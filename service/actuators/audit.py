"""The append-only audit log of actuation: one JSON object per line, one line per action and per skipped action.

Durability. The file is opened with O_APPEND; each record is one whole line handed to os.write (looping only if the
kernel takes part of it) and then fsync'd, and `append` returns only after fsync did: a record it returned for
survives a crash or `kill -9` at any later moment. A crash during a write can leave a torn last line (no newline).
On open the whole file is read back once, streaming: a torn last line is reported (log warning,
`TailReport.torn_bytes`) and terminated with a newline so the next record starts on a line of its own; readers skip
any line that is not a JSON object and count it. Nothing before the torn line is touched, and the file is never
rewritten or truncated. A write that fails part-way (ENOSPC after a short write) leaves a partial line; the next
append starts with a newline, so the partial line stays a corrupt line of its own and never swallows a good record.

Gate memory. While streaming, the records the gate needs at start-up are kept (`gate_records`): per target the last
pause/resume, the last override/override_cleared, and the action records ("action", "action_started") of the day
before its newest one. So a pause written months and thousands of skip lines ago still holds after a restart.

Growth. Actions are rare (capped per hour and day); skips happen every tick, so a skip is written only when its
reason differs from the last one written for that target, or when the same reason was last written at least
`skip_interval_s` ago (default 10 min): a paused target adds 6 lines an hour, not 720. (The runner keys an
observation error by its cause too, "observation_error:forbidden", so a new cause is written at once.) An action
(or an operator command) resets the throttle, so the first skip after it is always written. At those rates the file
grows by a few hundred KB a month. Do not rotate or truncate it (no logrotate, least of all copytruncate): it is the
gate's memory, and a pause or override that is rotated away is forgotten at the next restart. Archive a copy if it
must be kept small, but leave the live file whole.

Record fields (all present, null when not applicable): `time` (RFC 3339 UTC), `at_s`, `kind` ("action_started",
"action", "skip", "pause", "resume", "override", "override_cleared", "error"), `target`, `target_ref`, `mode`,
`dry_run`, `desired` and `observed` ({"num_speculative_tokens", "schedule"}), `reason`, `detail`, `patch`,
`patch_type`, `result` ("started", "applied", "dry_run", "noop", "failed", "skipped", "ok"), `error`,
`resource_version`, `evidence` (`decision_state`, `evidence_state`, `batch`, `acceptance_rate`,
`mean_acceptance_length`, `expected_speedup`, `recommended_num_speculative_tokens`, `objective`), `expires_at_s`
(override records). The runner rebuilds its gate state from these at start-up (`ActuationRunner.restore`).
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from policies.act.gate import DAY_S
from service.logs import fields, get_logger

AUDIT_FILE_NAME = "actions.jsonl"
DEFAULT_TAIL_RECORDS = 500
DEFAULT_SKIP_INTERVAL_S = 600.0
# Bytes read back from the end by read_tail: enough for DEFAULT_TAIL_RECORDS records of ~1-2 KB each.
_TAIL_READ_BYTES = 2 * 1024 * 1024
_STREAM_CHUNK_BYTES = 1024 * 1024
COMMAND_KINDS = ("pause", "resume")
OVERRIDE_KINDS = ("override", "override_cleared")
ACTION_KINDS = ("action_started", "action")

_log = get_logger("audit")


def rfc3339(epoch_s: float) -> str:
    """Unix seconds -> '2024-05-01T12:00:00.250Z' (UTC, millisecond precision)."""
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class TailReport:
    """What reading back a log found: records parsed, lines that were not JSON objects (skipped), and the bytes
    of a torn last line (0 when the file ended cleanly)."""

    records: int
    corrupt_lines: int
    torn_bytes: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: list[dict[str, Any]]
    report: TailReport


def _parse_line(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


class GateRecords:
    """The records the gate is rebuilt from (module docstring, "Gate memory"), fed oldest first; bounded per
    target by what a day of actions and two command slots hold, however long the log."""

    def __init__(self) -> None:
        self._seq = 0
        self._command: dict[str, tuple[int, dict[str, Any]]] = {}
        self._override: dict[str, tuple[int, dict[str, Any]]] = {}
        self._actions: dict[str, collections.deque[tuple[int, dict[str, Any]]]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        target, kind, at_s = record.get("target"), record.get("kind"), record.get("at_s")
        if not isinstance(target, str) or not isinstance(at_s, int | float) or isinstance(at_s, bool):
            return
        self._seq += 1
        entry = (self._seq, dict(record))
        if kind in COMMAND_KINDS:
            self._command[target] = entry
        elif kind in OVERRIDE_KINDS:
            self._override[target] = entry
        elif kind in ACTION_KINDS:
            actions = self._actions.setdefault(target, collections.deque())
            actions.append(entry)
            newest = max(float(r["at_s"]) for _, r in actions)
            while actions and newest - float(actions[0][1]["at_s"]) >= DAY_S:
                actions.popleft()

    def records(self) -> list[dict[str, Any]]:
        """The kept records, oldest first (in the order they were fed)."""
        entries = [*self._command.values(), *self._override.values()]
        for actions in self._actions.values():
            entries.extend(actions)
        return [dict(record) for _, record in sorted(entries, key=lambda entry: entry[0])]


def stream_records(path: Path, sink: Callable[[dict[str, Any]], None]) -> TailReport:
    """Feed every record of `path` to `sink`, oldest first, reading `_STREAM_CHUNK_BYTES` at a time (memory stays
    bounded by the longest line). A missing file has no records. Torn and corrupt lines as in `parse_lines`."""
    records = corrupt = 0
    pending = b""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return TailReport(0, 0, 0)
    with handle:
        while chunk := handle.read(_STREAM_CHUNK_BYTES):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line.strip():
                    continue
                record = _parse_line(line)
                if record is None:
                    corrupt += 1
                    continue
                records += 1
                sink(record)
    return TailReport(records, corrupt, len(pending))


def parse_lines(data: bytes, *, partial_first: bool = False) -> ReadResult:
    """Records from JSON-lines bytes. A last line without a newline is torn (counted in `torn_bytes`, skipped);
    lines that do not parse to an object are counted in `corrupt_lines`. `partial_first` drops the first line
    (a read that starts mid-file cuts it)."""
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the data ends with a newline
    if partial_first and lines:
        lines.pop(0)
    records: list[dict[str, Any]] = []
    corrupt = 0
    for line in lines:
        if not line.strip():
            continue
        value = _parse_line(line)
        if value is None:
            corrupt += 1
        else:
            records.append(value)
    return ReadResult(records=records, report=TailReport(len(records), corrupt, len(torn)))


def read_tail(path: Path, *, max_bytes: int = _TAIL_READ_BYTES) -> ReadResult:
    """The records in the last `max_bytes` of `path` (all of it when smaller); empty when it does not exist."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            handle.seek(start)
            data = handle.read()
    except FileNotFoundError:
        return ReadResult(records=[], report=TailReport(0, 0, 0))
    return parse_lines(data, partial_first=start > 0)


class AuditLog:
    """The audit log at `path`; keeps the last `tail_records` records in memory for GET /v1/actions."""

    def __init__(self, path: Path, *, tail_records: int = DEFAULT_TAIL_RECORDS) -> None:
        self.path = path
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=tail_records)
        self._fd: int | None = None
        self._lock = threading.Lock()  # appends may come from worker threads (asyncio.to_thread)
        self._gate = GateRecords()
        self._line_open = False  # a failed write may have left a partial line: start the next one on a new line
        self.report = TailReport(0, 0, 0)
        self.appended = 0

    def open(self) -> TailReport:
        """Create the directory and file if needed, read the whole file back once (the recent records and the
        gate's records), and get ready to append. Raises OSError when the state directory cannot be created or
        written (the caller turns it into a start-up error)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=self._recent.maxlen)
        gate = GateRecords()

        def keep(record: dict[str, Any]) -> None:
            recent.append(record)
            gate.add(record)

        report = stream_records(self.path, keep)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        if created:
            _fsync_dir(self.path.parent)  # the new directory entry must survive a crash too
        if report.torn_bytes:
            _log.warning(
                "audit log ends with a torn line (a crash mid-write); it is skipped and kept",
                extra=fields(path=str(self.path), torn_bytes=report.torn_bytes),
            )
            _write_all(fd, b"\n")
            os.fsync(fd)
        if report.corrupt_lines:
            _log.warning(
                "audit log holds lines that are not JSON records; they are skipped",
                extra=fields(path=str(self.path), corrupt_lines=report.corrupt_lines),
            )
        self._fd = fd
        self._recent.extend(recent)
        self._gate = gate
        self.report = report
        return report

    def append(self, record: Mapping[str, Any]) -> None:
        """Write `record` as one line and fsync; returns once it is durable. Raises OSError on a failed write (the
        next append then starts with a newline, in case part of this one reached the file)."""
        line = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode() + b"\n"
        with self._lock:
            if self._fd is None:
                raise RuntimeError("audit log is not open")
            data = b"\n" + line if self._line_open else line
            self._line_open = True  # until this write and its fsync are done, a part of it may be on disk
            _write_all(self._fd, data)
            os.fsync(self._fd)
            self._line_open = False
            self._recent.append(dict(record))
            self._gate.add(record)
            self.appended += 1

    def recent(self, limit: int, *, target: str | None = None) -> list[dict[str, Any]]:
        """The last `limit` records (oldest first), only `target`'s when given; bounded by the in-memory tail."""
        with self._lock:
            records = [r for r in self._recent if target is None or r.get("target") == target]
        return records[-limit:] if limit > 0 else []

    def gate_records(self) -> list[dict[str, Any]]:
        """What the gate is rebuilt from at start-up (module docstring, "Gate memory"), oldest first, from the whole
        file read at `open` and every record appended since."""
        with self._lock:
            return self._gate.records()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class SkipThrottle:
    """Decides which skips are written (module docstring): a new reason, or the same one after `interval_s`."""

    def __init__(self, interval_s: float = DEFAULT_SKIP_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._last: dict[str, tuple[str, float]] = {}  # target -> (reason, when written)

    def should_write(self, target: str, reason: str, now_s: float) -> bool:
        last = self._last.get(target)
        if last is not None and last[0] == reason and now_s - last[1] < self._interval_s:
            return False
        self._last[target] = (reason, now_s)
        return True

    def reset(self, target: str) -> None:
        self._last.pop(target, None)


def _write_all(fd: int, data: bytes) -> None:
    # O_APPEND writes of a regular file are whole in practice; loop anyway so a short write never loses the rest.
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
